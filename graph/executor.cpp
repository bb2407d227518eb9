#include "graph/executor.h"

#include <algorithm>

#include "graph/region_vec.h"
#include "ops/precision_scope.h"
#include "tpucore/ops.h"

namespace tpu::graph {
namespace {

bool graph_on_cpu(const Graph& g) {
  for (const Value& v : g.values)
    if (!v.meta.device.is_cpu()) return false;
  return true;
}

Tensor slot_view(const StoragePtr& st, const ValueMeta& m) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->shape = m.shape;
  impl->strides = contiguous_strides(m.shape);
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->contiguous = true;
  return Tensor(std::move(impl));
}

}  // namespace

void run_node_eager(const Node& n, std::span<const Tensor> ins, std::span<Tensor> outs) {
  if (n.op->name == "view") {
    outs[0] = tpu::reshape(ins[0], Shape(n.attrs.get_ints("shape")));
    return;
  }
  ops::call(*n.op, ins, n.attrs, outs);
}

Executable::Executable(Graph g, RegionRunner device_regions) : g_(std::move(g)), device_regions_(device_regions) {
  steps_ = schedule(g_);
  on_cpu_ = graph_on_cpu(g_);
  is_output_.assign(g_.values.size(), 0);
  for (ValueId o : g_.outputs) is_output_[static_cast<size_t>(o)] = 1;
  // Last step that reads each value (through views: the alias root stays alive too).
  std::vector<int32_t> last(g_.values.size(), -1);
  auto touch = [&](ValueId v, int32_t s) {
    for (ValueId x = v;;) {
      last[static_cast<size_t>(x)] = std::max(last[static_cast<size_t>(x)], s);
      const Node* p = g_.producer(x);
      if (!p || !p->op->has(ops::kView) || p->inputs.empty()) break;
      x = p->inputs[0];
    }
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& st = steps_[s];
    auto visit = [&](const Node& n) {
      for (ValueId in : n.inputs) touch(in, static_cast<int32_t>(s));
      for (ValueId o : n.outputs) touch(o, static_cast<int32_t>(s));
    };
    if (st.region >= 0) {
      for (int32_t ni : g_.regions[static_cast<size_t>(st.region)].nodes) visit(g_.nodes[static_cast<size_t>(ni)]);
    } else {
      visit(g_.nodes[static_cast<size_t>(st.node)]);
    }
  }
  release_.assign(steps_.size(), {});
  for (size_t v = 0; v < g_.values.size(); ++v) {
    if (is_output_[v] || last[v] < 0) continue;
    if (g_.values[v].kind != ValueKind::node) continue;
    release_[static_cast<size_t>(last[v])].push_back(static_cast<ValueId>(v));
  }
  async_.assign(g_.nodes.size(), nullptr);
  for (size_t i = 0; i < g_.nodes.size(); ++i)
    if (!g_.nodes[i].dead && (async_[i] = async_start_fn(*g_.nodes[i].op))) has_async_ = true;
  if (has_async_) {
    root_.resize(g_.values.size());
    for (size_t v = 0; v < g_.values.size(); ++v) root_[v] = alias_root(g_, static_cast<ValueId>(v));
  }
  if (on_cpu_)
    for (const Region& r : g_.regions) {
      // Under emulate_precision_casts a region runs as one tile: each node's kernel sees whole
      // operands, as in eager (a matmul over a tile of rows may take another kernel, with
      // another summation order, than over all of them; intermediates keep their dtype anyway).
      programs_.push_back(prepare_region(g_, r, g_.emulate_precision_casts ? std::max<int64_t>(r.domain.numel(), 1) : 0));
      vec_ok_.push_back(vec_region_supported(g_, r) ? 1 : 0);
    }
}

void Executable::run(std::span<const Tensor> inputs, std::vector<Tensor>& outputs) const {
  TPU_CHECK(inputs.size() == g_.inputs.size(), "internal: compiled graph expects {} inputs, got {}", g_.inputs.size(),
            inputs.size());
  std::vector<Tensor> vals(g_.values.size());
  const ops::EmulatePrecisionScope emulate(g_.emulate_precision_casts);
  for (size_t i = 0; i < inputs.size(); ++i) vals[static_cast<size_t>(g_.inputs[i])] = inputs[i];
  for (size_t v = 0; v < g_.values.size(); ++v)
    if (g_.values[v].kind == ValueKind::constant) vals[v] = g_.values[v].constant;

  // Planned slots (cpu only): one storage per slot for this call.
  std::vector<StoragePtr> slots;
  const bool planned = on_cpu_ && g_.plan.valid;
  if (planned) {
    slots.reserve(g_.plan.slot_bytes.size());
    for (int64_t b : g_.plan.slot_bytes)
      slots.push_back(ops::empty_tensor(Shape{b}, DType::u8, Device()).storage());
  }
  auto alloc = [&](ValueId v) -> Tensor {
    const ValueMeta& m = g_.meta(v);
    if (planned) {
      int32_t s = g_.plan.slot_of[static_cast<size_t>(v)];
      if (s >= 0) return slot_view(slots[static_cast<size_t>(s)], m);
    }
    return ops::empty_tensor(m.shape, m.dtype, m.device);
  };

  // Asynchronous nodes in flight, by the buffer root of their outputs; a step that reads such a
  // buffer (other than to make a view of it) waits first.
  std::vector<std::shared_ptr<AsyncHandle>> pending(has_async_ ? g_.values.size() : 0);
  size_t in_flight = 0;
  auto wait_for = [&](ValueId v) {
    std::shared_ptr<AsyncHandle>& h = pending[static_cast<size_t>(root_[static_cast<size_t>(v)])];
    if (!h) return;
    std::shared_ptr<AsyncHandle> w = std::move(h);
    for (auto& p : pending)
      if (p == w) p.reset();
    --in_flight;
    w->wait();
  };
  auto wait_inputs = [&](const Node& n) {
    if (in_flight == 0) return;
    for (ValueId i : n.inputs) wait_for(i);
  };
  struct Drain {  // on an error, the work in flight still finishes before its buffers go away
    std::vector<std::shared_ptr<AsyncHandle>>& p;
    ~Drain() {
      for (auto& h : p)
        if (h) {
          std::shared_ptr<AsyncHandle> w = std::move(h);
          for (auto& q : p)
            if (q == w) q.reset();
          try {
            w->wait();
          } catch (const std::exception&) {  // the first error is the one reported
          }
        }
    }
  } drain{pending};

  std::vector<Tensor> ins, outs;
  for (size_t si = 0; si < steps_.size(); ++si) {
    const Step& st = steps_[si];
    if (st.node >= 0 && has_async_ && async_[static_cast<size_t>(st.node)]) {
      const Node& n = g_.nodes[static_cast<size_t>(st.node)];
      wait_inputs(n);  // a collective of a collective's result
      ins.clear();
      for (ValueId i : n.inputs) ins.push_back(vals[static_cast<size_t>(i)]);
      outs.assign(n.outputs.size(), Tensor());
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (on_cpu_) outs[k] = alloc(n.outputs[k]);
      std::shared_ptr<AsyncHandle> h = async_[static_cast<size_t>(st.node)](n, ins, outs);
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        vals[static_cast<size_t>(n.outputs[k])] = std::move(outs[k]);
        pending[static_cast<size_t>(n.outputs[k])] = h;
      }
      ++in_flight;
      for (ValueId v : release_[si]) vals[static_cast<size_t>(v)] = Tensor();
      continue;
    }
    if (in_flight > 0) {
      if (st.region >= 0) {
        for (int32_t ni : g_.regions[static_cast<size_t>(st.region)].nodes) wait_inputs(g_.nodes[static_cast<size_t>(ni)]);
      } else {
        const Node& n = g_.nodes[static_cast<size_t>(st.node)];
        // A view of a result in flight needs no data, unless it copies (a reshape of strides).
        const bool pure_view = n.op->has(ops::kView) &&
                               (n.op->name != "view" || vals[static_cast<size_t>(n.inputs[0])].is_contiguous());
        if (!pure_view) wait_inputs(n);
      }
    }
    if (st.region >= 0 && on_cpu_) {
      const Region& r = g_.regions[static_cast<size_t>(st.region)];
      for (ValueId o : r.outputs) vals[static_cast<size_t>(o)] = alloc(o);
      if (vec_ok_[static_cast<size_t>(st.region)]) run_region_vec(g_, r, vals);
      else run_region(g_, programs_[static_cast<size_t>(st.region)], vals);
    } else if (st.region >= 0 && device_regions_ &&
               device_regions_(g_, g_.regions[static_cast<size_t>(st.region)], vals)) {
      // run by the device's region runner
    } else {
      auto run_one = [&](const Node& n) {
        ins.clear();
        for (ValueId i : n.inputs) ins.push_back(vals[static_cast<size_t>(i)]);
        outs.assign(std::max<size_t>(n.outputs.size(), 1), Tensor());
        if (n.op->has(ops::kView)) {
          if (n.op->name == "view" && !ins[0].is_contiguous()) {
            run_node_eager(n, ins, outs);
          } else {
            ops::TensorMeta om{g_.meta(n.outputs[0]).shape, g_.meta(n.outputs[0]).dtype, g_.meta(n.outputs[0]).device};
            outs[0] = n.op->view(ins[0], n.attrs, om);
          }
        } else if (on_cpu_ && n.op->cpu) {
          for (size_t k = 0; k < n.outputs.size(); ++k) outs[k] = alloc(n.outputs[k]);
          ops::KernelFn k = n.op->kernels[static_cast<int>(DeviceType::cpu)];
          if (!k) k = n.op->cpu;
          k(ops::KernelArgs{*n.op, ins, std::span<Tensor>(outs.data(), n.outputs.size()), n.attrs});
        } else {
          run_node_eager(n, ins, outs);
        }
        for (size_t k = 0; k < n.outputs.size(); ++k) {
          if (g_.meta(n.outputs[k]).wrapped && outs[k].defined()) outs[k].impl().wrapped_number = true;
          vals[static_cast<size_t>(n.outputs[k])] = std::move(outs[k]);
        }
      };
      if (st.region >= 0) {
        for (int32_t ni : g_.regions[static_cast<size_t>(st.region)].nodes) run_one(g_.nodes[static_cast<size_t>(ni)]);
      } else {
        run_one(g_.nodes[static_cast<size_t>(st.node)]);
      }
    }
    for (ValueId v : release_[si]) vals[static_cast<size_t>(v)] = Tensor();
  }
  for (ValueId o : g_.outputs)
    if (in_flight > 0) wait_for(o);
  if (in_flight > 0)  // results read by nobody: still finished before the call returns
    for (size_t v = 0; v < pending.size(); ++v)
      if (pending[v]) wait_for(static_cast<ValueId>(v));
  outputs.resize(g_.outputs.size());
  for (size_t i = 0; i < g_.outputs.size(); ++i) outputs[i] = vals[static_cast<size_t>(g_.outputs[i])];
}

}  // namespace tpu::graph
