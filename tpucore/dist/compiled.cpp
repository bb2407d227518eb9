// tpu::dist collectives as graph nodes of tpu::compile (see compiled.h). A node names its
// process group by an id of this process (the group registry below); the attributes carry the
// group size, the reduce op and the root, so the meta functions know the result's shape.
#include "tpucore/dist/compiled.h"

#include <fmt/ranges.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "graph/async_ops.h"
#include "ops/registry.h"
#include "tpucore/autograd.h"
#include "tpucore/dist/backend.h"
#include "tpucore/jit/guards.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace tpu::dist::detail {
namespace {

// ---- the group registry ----
struct GroupEntry {
  ProcessGroup* pg = nullptr;
  std::string desc;
};
struct Groups {
  std::mutex mu;
  std::map<int64_t, GroupEntry> by_id;
  std::unordered_map<const ProcessGroup*, int64_t> id_of;
  int64_t next = 1;
  std::atomic<uint64_t> forgotten{0};  // bumped when a group goes: guards then look closer
};
Groups& groups() {
  static Groups* g = new Groups();
  return *g;
}

std::string describe_group(ProcessGroup& pg) {
  return fmt::format("{} group of world ranks [{}] (rank {} of {})", pg.backend_name(), fmt::join(pg.global_ranks(), ", "),
                     pg.rank(), pg.size());
}

ProcessGroup& group_of(const ops::Attrs& a, const char* op) {
  const int64_t id = a.get_int("group");
  Groups& g = groups();
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.by_id.find(id);
  TPU_CHECK(it != g.by_id.end(), "{}: the process group of this compiled collective (id {}) no longer exists", op, id);
  return *it->second.pg;
}

// The compiled entry holds only while the group of its collectives is alive.
void guard_group(int64_t id, const std::string& desc) {
  const uint64_t seen = groups().forgotten.load();
  jit::add_trace_guard([id, desc, seen]() -> std::string {
    Groups& g = groups();
    if (g.forgotten.load(std::memory_order_relaxed) == seen) return {};
    std::lock_guard<std::mutex> lk(g.mu);
    if (g.by_id.count(id)) return {};
    return fmt::format("mesh changed: the {} of its collectives was destroyed", desc);
  });
}

// ---- the ops ----
const char* const kAllReduce = "dist_all_reduce";
const char* const kBroadcast = "dist_broadcast";
const char* const kAllGather = "dist_all_gather";
const char* const kReduceScatter = "dist_reduce_scatter";
const char* const kAllToAll = "dist_all_to_all";

void collective_meta(const ops::MetaArgs& a, ops::MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const int64_t n = a.attrs.get_int("size");
  Shape s = x.shape();
  const std::string& op = a.op.name;
  if (a.attrs.has("op") && static_cast<ReduceOp>(a.attrs.get_int("op")) == ReduceOp::avg)
    TPU_CHECK(is_floating(x.dtype()), "{}: avg needs a floating dtype; the tensor is {} (use sum and divide)", op,
              dtype_name(x.dtype()));
  if (op == kAllGather) {
    if (s.ndim() == 0) s = Shape{n};
    else s[0] *= n;
  } else if (op == kReduceScatter) {
    TPU_CHECK(s.ndim() >= 1 && s[0] % n == 0, "{}: the input {} must have a dim 0 that the {} ranks split evenly", op,
              s, n);
    s[0] /= n;
  } else if (op == kAllToAll) {
    const auto& in_s = a.attrs.get_ints("in_splits");
    const auto& out_s = a.attrs.get_ints("out_splits");
    if (in_s.empty()) {
      TPU_CHECK(s.ndim() >= 1 && s[0] % n == 0, "{}: the input {} must have a dim 0 that the {} ranks split evenly", op,
                s, n);
    } else {
      int64_t sum_in = 0, sum_out = 0;
      for (int64_t v : in_s) sum_in += v;
      for (int64_t v : out_s) sum_out += v;
      TPU_CHECK(s.ndim() >= 1 && sum_in == s[0], "{}: input_split_sizes sum to {} but the input's dim 0 is {}", op,
                sum_in, s.ndim() ? s[0] : 0);
      s[0] = sum_out;
    }
  }
  m.out() = {s, x.dtype(), x.device()};
}

// Starts the collective of op `name` on the group the attributes name; outs[0] is allocated
// when undefined. On a sim chip the collective waits for the current stream's work so far (its
// input), then runs on the chip's communication stream while the current stream goes on.
class Handle final : public graph::AsyncHandle {
 public:
  Work work;
  bool sim = false;
  Stream compute, comm;
  std::vector<Tensor> keep;  // the buffers the collective reads and writes
  void wait() override {
    work.wait();
    if (sim) {
      Event done;
      done.record(comm);
      done.wait(compute);
    }
    keep.clear();
  }
};

// A stream per collective in flight (a ring of them per chip): its end is that collective's
// end, so the wait for one does not also wait for the collectives queued after it. They share
// the chip's ICI, so the collectives still run one after the other, in call order.
Stream comm_stream(Device d) {
  constexpr size_t kRing = 256;
  struct Ring {
    std::vector<Stream> streams;
    size_t next = 0;
  };
  static std::mutex mu;
  static std::map<int, Ring>* rings = new std::map<int, Ring>();
  std::lock_guard<std::mutex> lk(mu);
  Ring& r = (*rings)[d.index];
  if (r.streams.size() < kRing) {
    r.streams.push_back(Stream::create(d));
    return r.streams.back();
  }
  return r.streams[r.next++ % kRing];
}

std::shared_ptr<Handle> start(const std::string& name, const ops::Attrs& a, std::span<const Tensor> ins,
                              std::span<Tensor> outs) {
  ProcessGroup& pg = group_of(a, name.c_str());
  const Tensor& in = ins[0];
  Tensor& out = outs[0];
  if (!out.defined()) {
    ops::MetaResult m;
    collective_meta(ops::MetaArgs{*ops::find_op(name), ins, a}, m);
    out = ops::empty_tensor(m.out().shape, m.out().dtype, m.out().device);
  }
  auto h = std::make_shared<Handle>();
  h->keep = {in, out};
  NoGradGuard no_grad;
  const bool in_place = name == kAllReduce || name == kBroadcast;
  if (in_place) out.copy_(in);
  const Device dev = in.device();
  h->sim = dev.type == DeviceType::sim;
  std::optional<StreamGuard> on_comm;
  if (h->sim) {
    h->compute = current_stream(dev);
    h->comm = comm_stream(dev);
    Event ready;
    ready.record(h->compute);
    ready.wait(h->comm);
    on_comm.emplace(h->comm);
  }
  if (name == kAllReduce) h->work = pg.all_reduce_async(out, static_cast<ReduceOp>(a.get_int("op")));
  else if (name == kBroadcast) h->work = pg.broadcast_async(out, static_cast<int>(a.get_int("src")));
  else if (name == kAllGather) h->work = pg.all_gather_into_tensor_async(out, in);
  else if (name == kAllToAll) h->work = pg.all_to_all_single_async(out, in, a.get_ints("out_splits"), a.get_ints("in_splits"));
  else h->work = pg.reduce_scatter_tensor_async(out, in, static_cast<ReduceOp>(a.get_int("op")));
  return h;
}

std::shared_ptr<graph::AsyncHandle> start_node(const graph::Node& n, std::span<const Tensor> ins, std::span<Tensor> outs) {
  return start(n.op->name, n.attrs, ins, outs);
}

// Outside the executor (ops::call): start and wait.
void run_now(const ops::KernelArgs& k) {
  std::vector<Tensor> outs(k.outputs.begin(), k.outputs.end());
  start(k.op.name, k.attrs, k.inputs, outs)->wait();
}

constexpr uint32_t kFlags = ops::kNonDifferentiable;  // asynchronous: see g_registered
TPU_DEFINE_OP(all_reduce_op, {.name = kAllReduce, .num_inputs = 1, .flags = kFlags, .meta = &collective_meta,
                              .cpu = &run_now, .doc = "tpu::dist all_reduce of a traced tensor (attrs group, op, size)"});
TPU_DEFINE_OP(broadcast_op, {.name = kBroadcast, .num_inputs = 1, .flags = kFlags, .meta = &collective_meta,
                             .cpu = &run_now, .doc = "tpu::dist broadcast of a traced tensor (attrs group, src, size)"});
TPU_DEFINE_OP(all_gather_op, {.name = kAllGather, .num_inputs = 1, .flags = kFlags, .meta = &collective_meta,
                              .cpu = &run_now, .doc = "tpu::dist all_gather_into_tensor (dim 0 times the group size)"});
TPU_DEFINE_OP(all_to_all_op, {.name = kAllToAll, .num_inputs = 1, .flags = kFlags, .meta = &collective_meta,
                              .cpu = &run_now, .doc = "tpu::dist all_to_all_single (attrs in_splits, out_splits: rows per "
                                                       "rank of dim 0, empty: equal)"});
TPU_DEFINE_OP(reduce_scatter_op, {.name = kReduceScatter, .num_inputs = 1, .flags = kFlags, .meta = &collective_meta,
                                  .cpu = &run_now, .doc = "tpu::dist reduce_scatter_tensor (dim 0 over the group size)"});

const bool g_registered = [] {
  for (const char* op : {kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll}) {
    graph::register_async_op(op, &start_node);
    ops::register_kernel(op, DeviceType::sim, &run_now);
  }
  return true;
}();

// Records the node and writes its result into `dst` (functionalized in place).
void record(ProcessGroup& pg, const ops::OpDef& op, const Tensor& dst, const Tensor& in, ops::Attrs attrs,
            const char* what) {
  const int64_t id = graph_group_id(pg);
  for (const Tensor* t : {&in, &dst})
    if (std::string why = pg.backend_impl().reject(t->device()); !why.empty())
      fail("tpu::dist {} (traced): the tensor {}", what, why);
  attrs.set("group", id);
  attrs.set("size", int64_t{pg.size()});
  Tensor y = ops::call(op, {in}, attrs);
  TPU_CHECK(y.numel() == dst.numel(), "tpu::dist {} (traced): the output is {} but the collective gives {} on {} ranks",
            what, dst.shape(), y.shape(), pg.size());
  Tensor(dst).copy_(y.shape() == dst.shape() ? y : tpu::reshape(y, dst.shape()));
  std::string desc;
  {
    Groups& g = groups();
    std::lock_guard<std::mutex> lk(g.mu);
    desc = g.by_id[id].desc;
  }
  guard_group(id, desc);
}

}  // namespace

bool traced(const Tensor& t) { return t.is_proxy() || ops::interceptor() != nullptr; }

void not_traceable(const char* op) {
  fail("tpu::dist {} inside tpu::compile: only all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor "
       "and all_to_all_single become graph nodes; call {} outside the compiled function",
       op, op);
}

int64_t graph_group_id(ProcessGroup& pg) {
  std::string desc = describe_group(pg);  // a tpu::Error for a non-member
  Groups& g = groups();
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.id_of.find(&pg);
  if (it != g.id_of.end()) return it->second;
  const int64_t id = g.next++;
  g.id_of[&pg] = id;
  g.by_id[id] = {&pg, std::move(desc)};
  return id;
}

void forget_group(const ProcessGroup* pg) {
  Groups& g = groups();
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.id_of.find(pg);
  if (it == g.id_of.end()) return;
  g.by_id.erase(it->second);
  g.id_of.erase(it);
  g.forgotten.fetch_add(1);
}

Work traced_all_reduce(ProcessGroup& pg, const Tensor& t, ReduceOp op) {
  record(pg, all_reduce_op(), t, t, {{"op", static_cast<int64_t>(op)}}, "all_reduce");
  return Work();
}

Work traced_broadcast(ProcessGroup& pg, const Tensor& t, int src) {
  if (src < 0 || src >= pg.size()) fail("tpu::dist broadcast (traced): src {} is not a rank of this group (0..{})", src, pg.size() - 1);
  record(pg, broadcast_op(), t, t, {{"src", int64_t{src}}}, "broadcast");
  return Work();
}

Work traced_all_gather_into_tensor(ProcessGroup& pg, const Tensor& out, const Tensor& in) {
  if (out.dtype() != in.dtype())
    fail("tpu::dist all_gather_into_tensor (traced): the output is {} but the input is {}", dtype_name(out.dtype()),
         dtype_name(in.dtype()));
  record(pg, all_gather_op(), out, in, {}, "all_gather_into_tensor");
  return Work();
}

Work traced_reduce_scatter_tensor(ProcessGroup& pg, const Tensor& out, const Tensor& in, ReduceOp op) {
  if (out.dtype() != in.dtype())
    fail("tpu::dist reduce_scatter_tensor (traced): the output is {} but the input is {}", dtype_name(out.dtype()),
         dtype_name(in.dtype()));
  record(pg, reduce_scatter_op(), out, in, {{"op", static_cast<int64_t>(op)}}, "reduce_scatter_tensor");
  return Work();
}

Work traced_all_to_all_single(ProcessGroup& pg, const Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits) {
  if (out.dtype() != in.dtype())
    fail("tpu::dist all_to_all_single (traced): the output is {} but the input is {}", dtype_name(out.dtype()),
         dtype_name(in.dtype()));
  // Split sizes are part of the graph (attributes): other sizes are another graph. An empty
  // list on one side takes equal splits of that side's dim 0.
  std::vector<int64_t> ins = in_splits, outs = out_splits;
  if (!ins.empty() || !outs.empty()) {
    ins = splits_or_even(ins, in, pg.size(), "tpu::dist all_to_all_single (traced)", "input_split_sizes", "input");
    outs = splits_or_even(outs, out, pg.size(), "tpu::dist all_to_all_single (traced)", "output_split_sizes", "output");
  }
  record(pg, all_to_all_op(), out, in, {{"in_splits", ins}, {"out_splits", outs}}, "all_to_all_single");
  return Work();
}

}  // namespace tpu::dist::detail
