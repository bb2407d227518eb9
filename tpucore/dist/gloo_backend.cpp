// The gloo backend: Debian's libgloo over TCP. Gloo is the engine (transport, ring all-reduce,
// all-gather, all-to-all, broadcast, barrier); this file only maps contiguous host tensors onto
// Gloo's options. reduce_scatter is Gloo's all-reduce on a copy followed by taking this rank's
// block (Gloo's new-style API has no reduce-scatter; the cost is the all-reduce's, about twice
// a ring reduce-scatter's). Rendezvous (which rank listens where) goes through a Gloo store:
// the TCP store of tcp_store.h or Gloo's file store, with the checks of dist/rendezvous.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>

#include "tpucore/dist/backend.h"
#include "tpucore/dist/rendezvous.h"

namespace tpu::dist {

namespace {

// Everything the groups of one world share: the store and the Gloo device (one listening socket).
struct GlooShared {
  Rendezvous rdv;
  std::shared_ptr<::gloo::transport::Device> device;
};

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<GlooShared> shared, std::shared_ptr<::gloo::Context> ctx, std::vector<int> world_ranks)
      : shared_(std::move(shared)), ctx_(std::move(ctx)), world_ranks_(std::move(world_ranks)) {}

  std::string name() const override { return "gloo"; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  bool native(Device d) const override { return d.is_cpu(); }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    reduce_in_place(t.raw_data(), t.numel(), t.dtype(), op);
  }

  void broadcast(const Tensor& t, int root) override {
    ::gloo::BroadcastOptions o(ctx_);
    o.setOutput(static_cast<uint8_t*>(t.raw_data()), t.nbytes());
    o.setRoot(root);
    ::gloo::broadcast(o);
  }

  void all_gather(const Tensor& out, const Tensor& in) override {
    ::gloo::AllgatherOptions o(ctx_);
    o.setInput(static_cast<uint8_t*>(in.raw_data()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.raw_data()), out.nbytes());
    ::gloo::allgather(o);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    std::vector<char> tmp(in.nbytes());
    std::memcpy(tmp.data(), in.raw_data(), tmp.size());
    reduce_in_place(tmp.data(), in.numel(), in.dtype(), op);
    std::memcpy(out.raw_data(), tmp.data() + static_cast<size_t>(rank()) * out.nbytes(), out.nbytes());
  }

  void all_to_all(const Tensor& out, const Tensor& in) override {
    ::gloo::AlltoallOptions o(ctx_);
    o.setInput(static_cast<uint8_t*>(in.raw_data()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.raw_data()), out.nbytes());
    ::gloo::alltoall(o);
  }

  void barrier() override {
    ::gloo::BarrierOptions o(ctx_);
    ::gloo::barrier(o);
  }

  std::vector<std::vector<char>> exchange(const std::vector<char>& bytes) override {
    std::vector<char> all(bytes.size() * static_cast<size_t>(size()));
    ::gloo::AllgatherOptions o(ctx_);
    o.setInput(const_cast<char*>(bytes.data()), bytes.size());
    o.setOutput(all.data(), all.size());
    ::gloo::allgather(o);
    std::vector<std::vector<char>> r;
    for (int i = 0; i < size(); ++i)
      r.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(bytes.size()) * i,
                     all.begin() + static_cast<std::ptrdiff_t>(bytes.size()) * (i + 1));
    return r;
  }

  struct GlooPending final : Pending {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
    bool is_send;
    void wait(std::chrono::milliseconds timeout) override {
      bool ok = is_send ? buf->waitSend(timeout) : buf->waitRecv(timeout);
      if (!ok) fail("gloo {} was aborted", is_send ? "send" : "recv");
    }
  };

  std::unique_ptr<Pending> post_send(const void* data, size_t n, int dst, uint64_t slot) override {
    auto p = std::make_unique<GlooPending>();
    p->buf = ctx_->createUnboundBuffer(const_cast<void*>(data), n);
    p->is_send = true;
    p->buf->send(dst, slot);
    return p;
  }

  std::unique_ptr<Pending> post_recv(void* data, size_t n, int src, uint64_t slot) override {
    auto p = std::make_unique<GlooPending>();
    p->buf = ctx_->createUnboundBuffer(data, n);
    p->is_send = false;
    p->buf->recv(src, slot);
    return p;
  }

  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks, int id) override {
    std::vector<int> world;  // the group's ranks as ranks of the world
    int me = -1;
    for (int r : ranks) {
      if (r == rank()) me = static_cast<int>(world.size());
      world.push_back(world_ranks_[static_cast<size_t>(r)]);
    }
    if (me < 0) return nullptr;
    auto ctx = shared_->rdv.connect(me, static_cast<int>(ranks.size()), fmt::format("g{}.", id), shared_->device);
    return std::make_shared<GlooBackend>(shared_, std::move(ctx), std::move(world));
  }

 private:
  void reduce_in_place(void* p, int64_t numel, DType dtype, ReduceOp op) {
    ReduceFn fn = reduce_fn(dtype, op);
    ::gloo::AllreduceOptions o(ctx_);
    size_t n = static_cast<size_t>(numel);
    switch (dtype_size(dtype)) {  // Gloo needs only the element size; fn knows the type
      case 1: o.setOutput(static_cast<uint8_t*>(p), n); break;
      case 2: o.setOutput(static_cast<uint16_t*>(p), n); break;
      case 4: o.setOutput(static_cast<uint32_t*>(p), n); break;
      case 8: o.setOutput(static_cast<uint64_t*>(p), n); break;
      default: fail("dist: no reduction for {}-byte elements ({})", dtype_size(dtype), dtype);
    }
    o.setReduceFunction(fn);
    o.setAlgorithm(::gloo::AllreduceOptions::Algorithm::RING);
    ::gloo::allreduce(o);
  }

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::vector<int> world_ranks_;
};

}  // namespace

std::shared_ptr<Backend> make_gloo_world(int rank, int world_size, const std::string& store_spec,
                                         const std::string& hostname, std::chrono::milliseconds timeout) {
  auto shared = std::make_shared<GlooShared>(GlooShared{Rendezvous(rank, world_size, store_spec, timeout), nullptr});
  shared->rdv.arrive();  // every rank present and agreeing on the world size, or a tpu::Error
  ::gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    shared->device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail("tpu::dist: rank {} cannot open a Gloo TCP device on '{}': {}", rank, hostname, e.what());
  }
  auto ctx = shared->rdv.connect(rank, world_size, "world.", shared->device);
  std::vector<int> ranks(static_cast<size_t>(world_size));
  for (int i = 0; i < world_size; ++i) ranks[static_cast<size_t>(i)] = i;
  return std::make_shared<GlooBackend>(shared, std::move(ctx), std::move(ranks));
}

}  // namespace tpu::dist
