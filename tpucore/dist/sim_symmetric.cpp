// The symmetric sim backend: one chip of a large simulated slice, the others taken by symmetry.
// Every rank of an SPMD program runs the same steps on same-shaped data, so each chip's
// timeline is chip 0's: this backend runs rank `rank`'s part on one sim device and costs each
// collective as the pod would on the whole slice (sim::Pod::cost over the group's axes, the same
// ring algorithms and figures as the full pod), as a job on the chip's ICI resource (so it
// overlaps programs on other streams exactly as a real pod collective does). Values are those
// of a world where every rank holds this rank's data (an all_reduce sum is G x, an all_gather G
// copies); in timing-only mode (tpu::sim_timing_only) no data moves. See tpucore/dist.h.
#include <fmt/ranges.h>

#include <vector>

#include "device/sim_driver.h"
#include "sim/error.h"
#include "sim/pod.h"
#include "tpucore/devices.h"
#include "tpucore/dist/backend.h"
#include "tpucore/dist/sim_types.h"

namespace tpu::dist {
namespace {

sim::ReduceOp sym_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return sim::ReduceOp::max;
    case ReduceOp::min: return sim::ReduceOp::min;
    case ReduceOp::product: return sim::ReduceOp::prod;
    default: return sim::ReduceOp::sum;  // avg: ProcessGroup divides
  }
}

uint64_t addr_of(const Tensor& t) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.storage()->data)) +
         static_cast<uint64_t>(t.offset()) * t.element_size();
}

class SymmetricBackend final : public Backend {
 public:
  SymmetricBackend(const SimSymmetricOptions& o, sim::Topology topo, int size)
      : o_(o), topo_(std::move(topo)), size_(size) {}
  std::string name() const override { return "sim-symmetric"; }
  int rank() const override { return o_.rank; }
  int size() const override { return size_; }
  Device chip() const { return Device(DeviceType::sim, o_.device); }
  bool native(Device d) const override { return d == chip(); }
  std::string reject(Device d) const override {
    if (d.type == DeviceType::sim && d != chip())
      return fmt::format("is on {} but this symmetric group simulates chip {}", d.str(), chip().str());
    return {};
  }

  void all_reduce(const Tensor& t, ReduceOp op) override { run(sim::CollectiveKind::all_reduce, op, t, t); }
  void broadcast(const Tensor& t, int) override { run(sim::CollectiveKind::broadcast, ReduceOp::sum, t, t); }
  void all_gather(const Tensor& out, const Tensor& in) override { run(sim::CollectiveKind::all_gather, ReduceOp::sum, out, in); }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    run(sim::CollectiveKind::reduce_scatter, op, out, in);
  }
  void all_to_all(const Tensor& out, const Tensor& in) override { run(sim::CollectiveKind::all_to_all, ReduceOp::sum, out, in); }
  void barrier() override {}
  std::vector<std::vector<char>> exchange(const std::vector<char>& bytes) override {
    return std::vector<std::vector<char>>(static_cast<size_t>(size_), bytes);
  }
  std::unique_ptr<Pending> post_send(const void*, size_t, int, uint64_t) override { unsupported(); }
  std::unique_ptr<Pending> post_recv(void*, size_t, int, uint64_t) override { unsupported(); }
  std::shared_ptr<Backend> new_group(const std::vector<int>&, int) override {
    fail("tpu::dist (sim symmetric): new_group is not supported; make a group per mesh axis with "
         "sim_symmetric_group(slice, axes)");
  }

 private:
  [[noreturn]] static void unsupported() {
    fail("tpu::dist (sim symmetric): send/recv are not supported (ranks are simulated by symmetry)");
  }

  void run(sim::CollectiveKind kind, ReduceOp op, const Tensor& out, const Tensor& in) {
    if (!native(in.device()) || !native(out.device()) || !in.is_contiguous() || !out.is_contiguous())
      fail("tpu::dist (sim symmetric): tensors must live on {} (the group's chip)", chip().str());
    sim::CollectiveSpec spec;
    spec.kind = kind;
    spec.op = sym_op(op);
    spec.count = static_cast<uint64_t>(in.numel());
    spec.axes = o_.axes;
    pod_type(in.dtype(), spec.dtype, spec.elem, "tpu::dist (sim symmetric)");
    sim::IciCost cost;
    try {
      device::SimDevice& dev = device::sim_device(o_.device);
      sim::Pod pod(dev.config(), topo_.ici, topo_.shape, sim::PodOptions{true, false});
      cost = pod.cost(spec);
    } catch (const sim::SimError& e) {
      fail("tpu::dist (sim symmetric) {}: {}", sim::collective_name(kind), e.what());
    }
    device::SimDevice& dev = device::sim_device(o_.device);
    const bool move = !sim_timing_only();
    const uint64_t src = addr_of(in), dst = addr_of(out), n = spec.count;
    const int G = size_, r = o_.rank;
    const sim::DType dt = spec.dtype;
    const sim::ElemType el = spec.elem;
    const sim::ReduceOp rop = spec.op;
    const uint64_t es = uint64_t(in.element_size());
    // On the caller's current stream of the chip (process_group.cpp hands it to this thread).
    dev.queue().submit_and_wait(device::current_stream(chip()), device::Resource::ici, [&]() -> double {
      if (!move || n == 0) return cost.seconds;
      std::vector<char> x(n * es);
      dev.chip().read_hbm(src, x.data(), x.size());
      std::vector<const void*> same(static_cast<size_t>(G), x.data());
      std::vector<char> y;
      switch (kind) {
        case sim::CollectiveKind::all_reduce:
          y.resize(x.size());
          sim::reduce_buffers(dt, rop, same, y.data(), n, el);
          break;
        case sim::CollectiveKind::all_gather:
          for (int i = 0; i < G; ++i) y.insert(y.end(), x.begin(), x.end());
          break;
        case sim::CollectiveKind::reduce_scatter: {
          const uint64_t blk = n / uint64_t(G);
          std::vector<const void*> mine(static_cast<size_t>(G), x.data() + uint64_t(r) * blk * es);
          y.resize(blk * es);
          sim::reduce_buffers(dt, rop, mine, y.data(), blk, el);
          break;
        }
        case sim::CollectiveKind::all_to_all: {  // block j from rank j = this rank's block r
          const uint64_t blk = n / uint64_t(G) * es;
          for (int i = 0; i < G; ++i) y.insert(y.end(), x.begin() + long(uint64_t(r) * blk), x.begin() + long(uint64_t(r + 1) * blk));
          break;
        }
        default: y = x;  // broadcast: the root holds the same data
      }
      dev.chip().write_hbm(dst, y.data(), y.size());
      return cost.seconds;
    });
  }

  SimSymmetricOptions o_;
  sim::Topology topo_;
  int size_;
};

}  // namespace

ProcessGroupPtr sim_symmetric_group(const SimSymmetricOptions& o) {
  const std::string what = "tpu::dist::sim_symmetric_group";
  if (o.device < 0 || o.device >= device::sim_device_count())
    fail("{}: sim:{} does not exist ({} sim devices)", what, o.device, device::sim_device_count());
  const sim::ChipConfig& cfg = device::sim_device(o.device).config();
  std::string ici = o.ici.empty() ? cfg.name : o.ici;
  if (ici.size() > 6 && ici.compare(ici.size() - 6, 6, "-ideal") == 0) ici.resize(ici.size() - 6);  // v5p-ideal: v5p's ICI
  sim::Topology topo;
  try {
    topo = sim::make_topology(sim::ici_preset(ici), o.slice);
  } catch (const sim::SimError& e) {
    fail("{}: slice '{}': {}", what, o.slice, e.what());
  }
  int size = 1;
  if (o.axes.empty()) size = topo.chips();
  for (int a : o.axes) {
    if (a < 0 || a >= static_cast<int>(topo.shape.size()))
      fail("{}: axis {} is not an axis of the slice {} (0..{})", what, a, o.slice, topo.shape.size() - 1);
    size *= topo.shape[static_cast<size_t>(a)];
  }
  if (o.rank < 0 || o.rank >= size) fail("{}: rank {} is outside the group of {} chips", what, o.rank, size);
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) ranks[static_cast<size_t>(i)] = i;
  auto timeout = std::chrono::milliseconds(300000);
  return std::make_shared<ProcessGroup>(std::make_shared<SymmetricBackend>(o, topo, size), ranks, o.rank, timeout,
                                        o.check_consistency);
}

}  // namespace tpu::dist
