// The sim backend: the chips of one simulated pod driven from one process (single controller).
// Rank r of the world is chip sim:r. Every rank has its own ProcessGroup (and so its own queue
// thread); a coordinator shared by the ranks of one group collects each rank's call, and when
// the last rank has called in it checks that the calls agree and runs one collective of
// device/sim_pod.h over all the ranks' HBM buffers (real values, ICI cost on each chip's
// stream). A rank that does not call in within the group's timeout fails the others with a
// tpu::Error and breaks the group (later calls fail at once); nothing hangs.
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <map>
#include <mutex>

#include "device/sim_driver.h"
#include "device/sim_pod.h"
#include "tpucore/dist/backend.h"
#include "tpucore/dist/sim_types.h"
#include "tpucore/dist/work.h"
#include "tpucore/ops.h"

namespace tpu::dist {

namespace {

using Clock = std::chrono::steady_clock;

// One rank's part of a call: what it asked for (for the agreement check) and its buffers.
struct Entry {
  std::string op;                 // "all_reduce", "exchange", ...
  sim::CollectiveKind kind{};
  sim::ReduceOp reduce{};
  DType dtype = DType::f32;
  std::string shape;              // for error messages
  uint64_t count = 0;             // elements of the source
  int root = 0;
  device::SimBuffer src, dst;
  std::vector<char> bytes;        // exchange
};

struct Slot {
  std::vector<Entry> entries;
  std::vector<bool> present;
  int arrived = 0, left = 0;
  bool done = false;
  std::string error;       // the call's error (every rank throws it)
  bool transport = false;  // the error breaks the group
};

std::string describe(const Entry& e) {
  if (e.op == "exchange" || e.op == "barrier") return e.op;
  return fmt::format("{} {} {}", e.op, dtype_name(e.dtype), e.shape);
}


sim::ReduceOp pod_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return sim::ReduceOp::max;
    case ReduceOp::min: return sim::ReduceOp::min;
    case ReduceOp::product: return sim::ReduceOp::prod;
    default: return sim::ReduceOp::sum;  // avg: sum here, ProcessGroup divides
  }
}

uint64_t hbm_addr(const Tensor& t) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.storage()->data)) +
         static_cast<uint64_t>(t.offset()) * t.element_size();
}

// One point-to-point message: the send side and the recv side, matched by (src, dst, slot).
// Host bytes (headers) are copied on the host; a chip tensor sent to a chip tensor moves over
// the ICI as a two-chip collective permute (a drained message is copied to the host).
struct Message {
  std::mutex mu;
  std::condition_variable cv;
  bool matched = false;
  std::string error;
  std::shared_ptr<device::SimCollectiveWork> work;
};

struct Side {
  bool posted = false;
  std::vector<char> copy;            // raw send: a copy of its bytes
  void* recv_bytes = nullptr;        // raw recv
  size_t n = 0;
  Tensor tensor;                     // tensor side (on its chip)
  int chip = 0;
};

// The ranks of one group: rank i is chip chips[i].
class Coordinator {
 public:
  Coordinator(std::vector<int> chips, std::chrono::milliseconds timeout) : chips_(std::move(chips)), timeout_(timeout) {
    seq_.assign(chips_.size(), 0);
  }
  int size() const { return static_cast<int>(chips_.size()); }
  int chip(int rank) const { return chips_[static_cast<size_t>(rank)]; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Posts one side of message (src -> dst, slot); the second side to arrive moves the data.
  std::shared_ptr<Message> post(bool is_send, int src, int dst, uint64_t slot, Side side) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.empty()) throw detail::TransportError(broken_);
    auto& [msg, snd, rcv] = mail_[{src, dst, slot}];
    if (!msg) msg = std::make_shared<Message>();
    (is_send ? snd : rcv) = std::move(side);
    if (snd.posted && rcv.posted) {
      std::shared_ptr<Message> m = msg;
      try {
        deliver(src, dst, snd, rcv, *m);
      } catch (const std::exception& e) {
        m->error = e.what();
      }
      mail_.erase({src, dst, slot});
      std::lock_guard<std::mutex> ml(m->mu);
      m->matched = true;
      m->cv.notify_all();
      return m;
    }
    return msg;
  }

  // Rank `rank` calls in; returns every rank's entry once all have (after the collective ran,
  // for a collective). Throws the call's error on every rank.
  std::vector<Entry> call(int rank, Entry e) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!broken_.empty()) throw detail::TransportError(broken_);
    const uint64_t k = seq_[static_cast<size_t>(rank)]++;
    Slot& s = slots_[k];
    if (s.entries.empty()) {
      s.entries.resize(chips_.size());
      s.present.assign(chips_.size(), false);
    }
    s.entries[static_cast<size_t>(rank)] = std::move(e);
    s.present[static_cast<size_t>(rank)] = true;
    if (++s.arrived == size()) {
      run(s);  // under the lock: ranks of this group wait for it anyway
      s.done = true;
      cv_.notify_all();
    } else {
      const auto deadline = Clock::now() + timeout_;
      if (!cv_.wait_until(lk, deadline, [&] { return s.done || !broken_.empty(); })) {
        std::vector<int> missing;
        for (size_t i = 0; i < s.present.size(); ++i)
          if (!s.present[i]) missing.push_back(static_cast<int>(i));
        broken_ = fmt::format(
            "rank(s) {} (chip(s) sim:{}) did not call collective #{} ({}) within {} ms; the sim group is broken",
            fmt::join(missing, ", "), fmt::join(chips_of(missing), ", sim:"), k, describe(s.entries[static_cast<size_t>(rank)]),
            timeout_.count());
        cv_.notify_all();
      }
      if (!s.done) {
        std::string why = broken_;
        if (++s.left == s.arrived) slots_.erase(k);  // a late rank fails at the broken check above
        throw detail::TransportError(why);
      }
    }
    std::vector<Entry> out = s.entries;
    std::string error = s.error;
    bool transport = s.transport;
    if (++s.left == size()) slots_.erase(k);
    if (!error.empty()) {
      if (transport) throw detail::TransportError(error);
      fail("{}", error);
    }
    return out;
  }

 private:
  std::vector<int> chips_of(const std::vector<int>& ranks) const {
    std::vector<int> c;
    for (int r : ranks) c.push_back(chip(r));
    return c;
  }

  // All ranks are in: check they agree, then run the collective.
  void run(Slot& s) {
    const Entry& e0 = s.entries[0];
    bool agree = true;
    for (const Entry& e : s.entries)
      agree = agree && e.op == e0.op && e.dtype == e0.dtype && e.count == e0.count && e.root == e0.root &&
              e.reduce == e0.reduce && e.bytes.size() == e0.bytes.size();
    if (!agree) {
      std::string list;
      for (size_t i = 0; i < s.entries.size(); ++i)
        list += fmt::format("{}rank {}: {}", i ? "; " : "", i, describe(s.entries[i]));
      s.error = fmt::format("the ranks disagree on the call ({}); no rank ran it", list);
      return;
    }
    if (e0.op == "exchange" || e0.op == "barrier") return;
    device::SimCollectiveArgs a;
    a.kind = e0.kind;
    a.op = e0.reduce;
    a.count = e0.count;
    a.root = e0.root;
    a.name = "tpu::dist " + e0.op;
    pod_type(e0.dtype, a.dtype, a.elem, a.name);
    for (const Entry& e : s.entries) {
      a.src.push_back(e.src);
      a.dst.push_back(e.dst);
    }
    try {
      device::sim_collective_async(a)->wait(timeout_);
    } catch (const std::exception& ex) {
      s.error = ex.what();
      s.transport = true;  // the chips' streams may be out of step now
      broken_ = fmt::format("an earlier collective failed: {}", ex.what());
    }
  }

  void deliver(int src, int dst, Side& snd, Side& rcv, Message& m) {
    const size_t sn = snd.tensor.defined() ? snd.tensor.nbytes() : snd.n;
    const size_t rn = rcv.tensor.defined() ? rcv.tensor.nbytes() : rcv.n;
    if (rcv.tensor.defined() && sn != rn)
      fail("rank {} sent {} bytes but rank {} receives {} bytes", src, sn, dst, rn);
    if (!rcv.tensor.defined()) {  // into host bytes: a header, or a drained message
      if (snd.tensor.defined()) {
        Tensor h = snd.tensor.to(Device()).contiguous();
        std::memcpy(rcv.recv_bytes, h.raw_data(), std::min(sn, rn));
      } else {
        std::memcpy(rcv.recv_bytes, snd.copy.data(), std::min(sn, rn));
      }
      return;
    }
    if (!snd.tensor.defined()) fail("rank {} sent host bytes to rank {}'s chip tensor", src, dst);
    device::SimCollectiveArgs a;
    a.kind = sim::CollectiveKind::permute;
    a.elem = sim::ElemType::u8;
    a.count = sn;
    a.name = "tpu::dist send/recv";
    a.pairs = {{0, 1}};
    a.src = {{snd.chip, hbm_addr(snd.tensor), 0}, {rcv.chip, hbm_addr(rcv.tensor), 0}};
    a.dst = {{snd.chip, hbm_addr(snd.tensor), 0}, {rcv.chip, hbm_addr(rcv.tensor), 0}};
    m.work = device::sim_collective_async(a);
  }

  std::map<std::tuple<int, int, uint64_t>, std::tuple<std::shared_ptr<Message>, Side, Side>> mail_;
  std::vector<int> chips_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> seq_;
  std::map<uint64_t, Slot> slots_;
  std::string broken_;
};

// The world of one sim_pod_groups() call: coordinators of the world and of new_group calls.
struct SimWorld {
  std::vector<int> chips;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::map<int, std::shared_ptr<Coordinator>> groups;  // new_group id -> its coordinator
};


class SimBackend final : public Backend {
 public:
  SimBackend(std::shared_ptr<SimWorld> world, std::shared_ptr<Coordinator> c, int rank)
      : world_(std::move(world)), c_(std::move(c)), rank_(rank) {}

  std::string name() const override { return "sim"; }
  int rank() const override { return rank_; }
  int size() const override { return c_->size(); }
  Device chip() const { return Device(DeviceType::sim, c_->chip(rank_)); }
  bool native(Device d) const override { return d == chip(); }
  std::string reject(Device d) const override {
    if (d.type == DeviceType::sim && d != chip())
      return fmt::format("is on {} but rank {} of the sim backend is chip {} (a rank's tensors live on its own chip)",
                         d.str(), rank_, chip().str());
    return {};
  }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    run("all_reduce", sim::CollectiveKind::all_reduce, op, t, t, t.numel());
  }
  void broadcast(const Tensor& t, int root) override {
    run("broadcast", sim::CollectiveKind::broadcast, ReduceOp::sum, t, t, t.numel(), root);
  }
  void all_gather(const Tensor& out, const Tensor& in) override {
    run("all_gather", sim::CollectiveKind::all_gather, ReduceOp::sum, out, in, in.numel());
  }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    run("reduce_scatter", sim::CollectiveKind::reduce_scatter, op, out, in, in.numel());
  }
  void all_to_all(const Tensor& out, const Tensor& in) override {
    run("all_to_all", sim::CollectiveKind::all_to_all, ReduceOp::sum, out, in, in.numel());
  }
  void barrier() override {
    Entry e;
    e.op = "barrier";
    c_->call(rank_, std::move(e));
  }
  std::vector<std::vector<char>> exchange(const std::vector<char>& bytes) override {
    Entry e;
    e.op = "exchange";
    e.bytes = bytes;
    std::vector<std::vector<char>> out;
    for (Entry& x : c_->call(rank_, std::move(e))) out.push_back(std::move(x.bytes));
    return out;
  }

  std::unique_ptr<Pending> post_send(const void* data, size_t n, int dst, uint64_t slot) override {
    Side side;
    side.posted = true;
    side.copy.assign(static_cast<const char*>(data), static_cast<const char*>(data) + n);
    side.n = n;
    c_->post(true, rank_, dst, slot, std::move(side));  // the bytes are copied: complete at once
    return std::make_unique<Done>();
  }
  std::unique_ptr<Pending> post_recv(void* data, size_t n, int src, uint64_t slot) override {
    Side side;
    side.posted = true;
    side.recv_bytes = data;
    side.n = n;
    return pending(c_->post(false, src, rank_, slot, std::move(side)), fmt::format("recv from rank {}", src), {}, {});
  }
  std::unique_ptr<Pending> post_send_tensor(const Tensor& t, int dst, uint64_t slot) override {
    Side side;
    side.posted = true;
    // Eager, like Gloo's buffered sends: a copy on this chip travels when the recv is posted,
    // so the send completes at once (a receiver that disagrees reports it).
    side.tensor = native(t.device()) && t.is_contiguous() ? t.clone() : on_chip(t);
    side.chip = c_->chip(rank_);
    c_->post(true, rank_, dst, slot, side);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Pending> post_recv_tensor(const Tensor& t, int src, uint64_t slot) override {
    Side side;
    side.posted = true;
    side.tensor = native(t.device()) ? t : empty(t.shape(), TensorOptions(t.dtype(), chip()));
    side.chip = c_->chip(rank_);
    Tensor back = side.tensor.is_same(t) ? Tensor() : t;  // a host buffer: copied back after the transfer
    return pending(c_->post(false, src, rank_, slot, side), fmt::format("recv from rank {}", src), side.tensor, back);
  }

  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks, int id) override {
    std::shared_ptr<Coordinator> c;
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      auto& slot = world_->groups[id];
      if (!slot) {
        std::vector<int> chips;
        for (int r : ranks) chips.push_back(world_->chips[static_cast<size_t>(r)]);
        slot = std::make_shared<Coordinator>(chips, world_->timeout);
      }
      c = slot;
    }
    const int me = c_->chip(rank_);
    for (size_t i = 0; i < ranks.size(); ++i)
      if (world_->chips[static_cast<size_t>(ranks[i])] == me)
        return std::make_shared<SimBackend>(world_, c, static_cast<int>(i));
    return nullptr;
  }

 private:
  // Tensors on this rank's chip and contiguous go as they are; others (host buffers that
  // ProcessGroup packed or staged) through a scratch tensor on the chip.
  Tensor on_chip(const Tensor& t) const { return native(t.device()) && t.is_contiguous() ? t : t.to(chip()).contiguous(); }

  void run(const char* op, sim::CollectiveKind kind, ReduceOp rop, const Tensor& out, const Tensor& in,
           int64_t count, int root = 0) {
    Entry e;
    e.op = op;
    e.kind = kind;
    e.reduce = pod_op(rop);
    e.dtype = in.dtype();
    e.shape = fmt::format("{}", in.shape());
    e.count = static_cast<uint64_t>(count);
    e.root = root;
    sim::DType d;
    sim::ElemType el;
    pod_type(in.dtype(), d, el, fmt::format("tpu::dist {} (sim, rank {})", op, rank_));
    Tensor cin = on_chip(in);
    Tensor cout = out.is_same(in) ? cin : on_chip(out);
    // On this rank's current stream of its chip (the caller's, see process_group.cpp).
    const device::StreamId s = device::current_stream(chip());
    e.src = {c_->chip(rank_), hbm_addr(cin), s};
    e.dst = {c_->chip(rank_), hbm_addr(cout), s};
    c_->call(rank_, std::move(e));
    if (!cout.is_same(out)) Tensor(out).copy_(cout);
  }

  struct Done final : Pending {
    void wait(std::chrono::milliseconds) override {}
  };
  struct SimPending final : Pending {
    std::shared_ptr<Message> m;
    std::string what;
    Tensor keep, chip_buf, back;
    std::chrono::milliseconds group_timeout;
    void wait(std::chrono::milliseconds timeout) override {
      if (timeout.count() <= 0) timeout = group_timeout;
      {
        std::unique_lock<std::mutex> lk(m->mu);
        if (!m->cv.wait_for(lk, timeout, [&] { return m->matched; }))
          fail("sim backend: {} was not matched within {} ms", what, timeout.count());
        if (!m->error.empty()) fail("sim backend: {}: {}", what, m->error);
      }
      if (m->work) m->work->wait(timeout);
      if (back.defined()) back.copy_(chip_buf);
    }
  };
  std::unique_ptr<Pending> pending(std::shared_ptr<Message> m, std::string what, Tensor chip_buf, Tensor back) const {
    auto p = std::make_unique<SimPending>();
    p->m = std::move(m);
    p->what = std::move(what);
    p->keep = chip_buf;
    p->chip_buf = chip_buf;
    p->back = back;
    p->group_timeout = c_->timeout();
    return p;
  }

  std::shared_ptr<SimWorld> world_;
  std::shared_ptr<Coordinator> c_;
  int rank_;
};

}  // namespace

void pod_type(DType t, sim::DType& d, sim::ElemType& e, const std::string& what) {
  e = sim::ElemType::native;
  d = sim::DType::f32;
  switch (t) {
    case DType::f32: d = sim::DType::f32; return;
    case DType::bf16: d = sim::DType::bf16; return;
    case DType::i32: d = sim::DType::i32; return;
    case DType::i8: d = sim::DType::i8; return;
    case DType::f16: e = sim::ElemType::f16; return;
    case DType::u8: e = sim::ElemType::u8; return;
    case DType::boolean: e = sim::ElemType::boolean; return;
    case DType::i64: case DType::f8e4m3: case DType::f8e5m2: break;
  }
  fail("{}: the sim pod's ICI carries f32, bf16, f16, i32, i8, u8 and bool, not {}", what, dtype_name(t));
}

std::vector<ProcessGroupPtr> sim_pod_groups(const SimPodOptions& o) {
  const std::string what = "tpu::dist::sim_pod_groups";
  if (device::sim_pod_shape().empty())
    fail("{}: no sim pod is configured (set TPU_SIM_POD, e.g. TPU_SIM_POD=2x2, or call tpu::device::set_sim_pod)", what);
  const int chips = device::sim_pod_topology().chips();
  const int n = o.chips > 0 ? o.chips : chips;
  if (n > chips) fail("{}: {} chips asked for but the pod {} has {}", what, n, device::sim_pod_shape(), chips);
  auto timeout = o.timeout;
  if (timeout.count() <= 0) {
    const char* t = std::getenv("TPU_DIST_TIMEOUT_MS");
    timeout = std::chrono::milliseconds(t && *t ? std::max(1, std::atoi(t)) : 30000);
  }
  const char* c = std::getenv("TPU_DIST_CHECK");
  const bool check = o.check_consistency && !(c && std::string(c) == "0");
  auto world = std::make_shared<SimWorld>();
  for (int r = 0; r < n; ++r) world->chips.push_back(r);
  world->timeout = timeout;
  auto coord = std::make_shared<Coordinator>(world->chips, timeout);
  std::vector<ProcessGroupPtr> groups;
  for (int r = 0; r < n; ++r)
    groups.push_back(std::make_shared<ProcessGroup>(std::make_shared<SimBackend>(world, coord, r), world->chips, r,
                                                    timeout, check));
  return groups;
}

std::vector<ProcessGroupPtr> sim_new_group(const std::vector<ProcessGroupPtr>& world, const std::vector<int>& ranks_in) {
  const std::string what = "tpu::dist::sim_new_group";
  if (world.empty()) fail("{}: the world's group list is empty", what);
  std::vector<int> ranks = ranks_in;
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) fail("{}: the rank list is empty", what);
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
    fail("{}: the rank list [{}] repeats a rank", what, fmt::join(ranks_in, ", "));
  const int n = static_cast<int>(world.size());
  if (ranks.front() < 0 || ranks.back() >= n)
    fail("{}: the rank list [{}] has ranks outside the world 0..{}", what, fmt::join(ranks_in, ", "), n - 1);
  static std::atomic<int> next_id{1 << 20};
  const int id = next_id++;
  std::vector<ProcessGroupPtr> out;
  for (int r : ranks) {
    const ProcessGroupPtr& g = world[static_cast<size_t>(r)];
    if (!g || g->backend_name() != "sim" || g->rank() != r) fail("{}: world[{}] is not rank {} of a sim world", what, r, r);
    auto b = g->backend_impl().new_group(ranks, id);
    out.push_back(std::make_shared<ProcessGroup>(b, ranks, r, g->timeout(), true));
  }
  return out;
}

}  // namespace tpu::dist
