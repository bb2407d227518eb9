// The gloo backend: Debian's libgloo over TCP. Gloo is the engine (transport, ring all-reduce,
// all-gather, all-to-all, broadcast, barrier); this file only maps contiguous host tensors onto
// Gloo's options. reduce_scatter is Gloo's all-reduce on a copy followed by taking this rank's
// block (Gloo's new-style API has no reduce-scatter; the cost is the all-reduce's, about twice
// a ring reduce-scatter's). Rendezvous (which rank listens where) goes through a Gloo store:
// the TCP store of tcp_store.h or Gloo's file store, with the checks of dist/rendezvous.
//
// The header check rides along with the collective instead of costing a round trip before it:
// each rank posts its header to every peer (Gloo unbound buffers) and starts the collective at
// once, its Gloo traffic tagged with a hash of the header and the call's number, so that ranks
// whose calls disagree never exchange a byte of data (Gloo would abort the process on a message
// longer than the posted receive). When the collective returns, the caller checks the headers
// (they were sent before the data, so they are there); if it is still running 2 ms after the
// start, a watcher thread takes over the check: when the headers agree the collective simply
// completes; when they disagree the watcher flags the store and
// aborts this rank's Gloo connections, which unblocks the collective on every rank (a peer's
// closed connection aborts its waits too); every rank then reconnects a fresh Gloo context
// through the store and re-exchanges the headers to name the disagreement. A rank whose header
// wait failed without the flag set (a peer died) reports a transport error instead.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "tpucore/dist/backend.h"
#include "tpucore/dist/rendezvous.h"

// Debian's libgloo-dev ships gloo/transport/tcp/pair.h without the gloo/common/memory.h it
// includes, so the one member of the TCP pair used here (to abort a pair's pending operations,
// as Gloo itself does when a wait times out) is declared on its own. It is a non-virtual member
// defined in libgloo; the TCP pair's generic gloo::transport::Pair base is its only base, so a
// pointer to that base is the pair's address.
namespace gloo::transport::tcp {
class Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace gloo::transport::tcp

namespace tpu::dist {

namespace {

// Gloo writes with writev(), so a write to a peer that died raises SIGPIPE, whose default action
// ends the process. While Gloo is called on this thread SIGPIPE is blocked (the write fails with
// EPIPE and Gloo reports it); a SIGPIPE left pending is consumed before the mask is restored.
// Gloo's device thread inherits the blocked mask from the thread that creates the device.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      timespec zero{0, 0};
      for (int i = 0; i < 64 && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE); ++i)
        sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
};

// Everything the groups of one world share: the store and the Gloo device (one listening socket).
struct GlooShared {
  Rendezvous rdv;
  std::shared_ptr<::gloo::transport::Device> device;
};

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<GlooShared> shared, std::shared_ptr<::gloo::Context> ctx, std::vector<int> world_ranks,
              std::string prefix, std::chrono::milliseconds timeout)
      : shared_(std::move(shared)), ctx_(std::move(ctx)), world_ranks_(std::move(world_ranks)),
        prefix_(std::move(prefix)), timeout_(timeout) {}
  ~GlooBackend() override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  bool native(Device d) const override { return d.is_cpu(); }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    NoSigpipe no_sigpipe;
    reduce_in_place(t.raw_data(), t.numel(), t.dtype(), op);
  }

  void broadcast(const Tensor& t, int root) override {
    NoSigpipe no_sigpipe;
    ::gloo::BroadcastOptions o(ctx_);
    o.setTag(tag_);
    o.setOutput(static_cast<uint8_t*>(t.raw_data()), t.nbytes());
    o.setRoot(root);
    ::gloo::broadcast(o);
  }

  void all_gather(const Tensor& out, const Tensor& in) override {
    NoSigpipe no_sigpipe;
    ::gloo::AllgatherOptions o(ctx_);
    o.setTag(tag_);
    o.setInput(static_cast<uint8_t*>(in.raw_data()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.raw_data()), out.nbytes());
    ::gloo::allgather(o);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    NoSigpipe no_sigpipe;
    std::vector<char> tmp(in.nbytes());
    std::memcpy(tmp.data(), in.raw_data(), tmp.size());
    reduce_in_place(tmp.data(), in.numel(), in.dtype(), op);
    std::memcpy(out.raw_data(), tmp.data() + static_cast<size_t>(rank()) * out.nbytes(), out.nbytes());
  }

  void all_to_all(const Tensor& out, const Tensor& in) override {
    NoSigpipe no_sigpipe;
    ::gloo::AlltoallOptions o(ctx_);
    o.setTag(tag_);
    o.setInput(static_cast<uint8_t*>(in.raw_data()), in.nbytes());
    o.setOutput(static_cast<uint8_t*>(out.raw_data()), out.nbytes());
    ::gloo::alltoall(o);
  }

  // Gloo's alltoallv in bytes: no padding. A rank with nothing to send or receive still takes
  // part (with a one-byte scratch buffer: Gloo wants a buffer).
  void all_to_all_v(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv, int64_t max_block) override {
    if (max_block == 0) return;
    NoSigpipe no_sigpipe;
    const int64_t es = static_cast<int64_t>(in.element_size());
    std::vector<int64_t> sb, rb;
    for (int64_t c : send) sb.push_back(c * es);
    for (int64_t c : recv) rb.push_back(c * es);
    uint8_t scratch_in = 0, scratch_out = 0;
    ::gloo::AlltoallvOptions o(ctx_);
    o.setTag(tag_);
    o.setInput(in.nbytes() ? static_cast<uint8_t*>(in.raw_data()) : &scratch_in, sb);
    o.setOutput(out.nbytes() ? static_cast<uint8_t*>(out.raw_data()) : &scratch_out, rb);
    ::gloo::alltoallv(o);
  }

  void barrier() override {
    NoSigpipe no_sigpipe;
    ::gloo::BarrierOptions o(ctx_);
    o.setTag(tag_);
    ::gloo::barrier(o);
  }

  std::vector<std::vector<char>> exchange(const std::vector<char>& bytes) override {
    NoSigpipe no_sigpipe;
    std::vector<char> all(bytes.size() * static_cast<size_t>(size()));
    ::gloo::AllgatherOptions o(ctx_);
    o.setTag(tag_);
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
    NoSigpipe no_sigpipe;
    auto p = std::make_unique<GlooPending>();
    p->buf = ctx_->createUnboundBuffer(const_cast<void*>(data), n);
    p->is_send = true;
    p->buf->send(dst, slot);
    return p;
  }

  std::unique_ptr<Pending> post_recv(void* data, size_t n, int src, uint64_t slot) override {
    NoSigpipe no_sigpipe;
    auto p = std::make_unique<GlooPending>();
    p->buf = ctx_->createUnboundBuffer(data, n);
    p->is_send = false;
    p->buf->recv(src, slot);
    return p;
  }

  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks, int id) override {
    NoSigpipe no_sigpipe;
    std::vector<int> world;  // the group's ranks as ranks of the world
    int me = -1;
    for (int r : ranks) {
      if (r == rank()) me = static_cast<int>(world.size());
      world.push_back(world_ranks_[static_cast<size_t>(r)]);
    }
    if (me < 0) return nullptr;
    auto ctx = shared_->rdv.connect(me, static_cast<int>(ranks.size()), fmt::format("g{}.", id), shared_->device);
    return std::make_shared<GlooBackend>(shared_, std::move(ctx), std::move(world), fmt::format("g{}.", id), timeout_);
  }

  std::vector<std::vector<char>> run_checked(const std::vector<char>& header, const Judge& judge,
                                             const std::function<void()>& body) override;

 private:
  void reduce_in_place(void* p, int64_t numel, DType dtype, ReduceOp op) {
    ReduceFn fn = reduce_fn(dtype, op);
    ::gloo::AllreduceOptions o(ctx_);
    o.setTag(tag_);
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

  // One checked call's header traffic and the watcher's verdict on it.
  struct Watch {
    std::vector<std::vector<char>> all;  // every rank's header (this rank's included)
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends, recvs;
    Judge judge;
    std::string flag;  // the store key that says "a rank aborted this call on purpose"
    bool claimed = false;  // the watcher or the caller is checking the headers
    bool done = false, failed = false;
    Agreement verdict = Agreement::agree;
    std::string error;
  };
  void watch(Watch& w);
  void abort_connections(const std::string& why);

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<::gloo::Context> ctx_;
  std::vector<int> world_ranks_;
  std::string prefix_;  // this group's store prefix ("world.", "g3.")
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;    // Gloo tag of the running collective (0 without the check)
  uint32_t seq_ = 0;    // checked calls so far (the same on every rank)
  int generation_ = 0;  // reconnects after a disagreement
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::shared_ptr<Watch> job_;
  bool stop_ = false;
  std::thread watcher_;
};

constexpr uint64_t kCollectiveHeaderSlot = uint64_t{0x72} << 56;  // p2p uses 0x70/0x71; Gloo's own prefixes are small

uint32_t header_tag(const std::vector<char>& header, uint32_t seq) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : header) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= uint64_t{seq} * 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

void GlooBackend::abort_connections(const std::string& why) {
  for (int i = 0; i < size(); ++i) {
    if (i == rank()) continue;
    ::gloo::transport::Pair* pair = ctx_->getPair(i).get();  // every pair of a tcp device is a tcp::Pair
    if (pair) reinterpret_cast<::gloo::transport::tcp::Pair*>(pair)->signalExceptionExternal(why);
  }
}

// On the watcher thread: waits for every peer's header, judges them, and on a disagreement (or a
// failed wait) aborts this rank's connections so that the collective on the caller's thread
// returns at once instead of waiting for data that will never come.
void GlooBackend::watch(Watch& w) {
  try {
    for (auto& r : w.recvs)
      if (r && !r->waitRecv(timeout_)) fail("the header receive was aborted");
    w.verdict = w.judge(w.all);
  } catch (const std::exception& e) {
    w.failed = true;
    w.error = e.what();
  }
  if (w.failed || w.verdict == Agreement::disagree) {
    if (!w.failed) {
      try {
        shared_->rdv.set_flag(w.flag);  // before the abort: a peer that sees it fail finds the flag
      } catch (const std::exception&) {
      }
    }
    abort_connections("tpu::dist: collective abandoned (the ranks disagree on the call, or a peer failed)");
  }
}

std::vector<std::vector<char>> GlooBackend::run_checked(const std::vector<char>& header, const Judge& judge,
                                                        const std::function<void()>& body) {
    NoSigpipe no_sigpipe;
  const uint32_t seq = seq_++;
  const uint64_t slot = kCollectiveHeaderSlot | seq;
  auto w = std::make_shared<Watch>();
  w->judge = judge;
  w->flag = fmt::format("tpu.{}abandon.{}.{}", prefix_, generation_, seq);
  w->all.assign(static_cast<size_t>(size()), std::vector<char>(header.size()));
  w->all[static_cast<size_t>(rank())] = header;
  w->sends.resize(static_cast<size_t>(size()));
  w->recvs.resize(static_cast<size_t>(size()));
  for (int p = 0; p < size(); ++p) {  // receives first, so that every send finds its receive posted
    if (p == rank()) continue;
    auto& r = w->recvs[static_cast<size_t>(p)];
    r = ctx_->createUnboundBuffer(w->all[static_cast<size_t>(p)].data(), header.size());
    r->recv(p, slot);
  }
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    auto& snd = w->sends[static_cast<size_t>(p)];
    snd = ctx_->createUnboundBuffer(w->all[static_cast<size_t>(rank())].data(), header.size());
    snd->send(p, slot);
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    job_ = w;
    if (!watcher_.joinable())
      watcher_ = std::thread([this] {
        std::unique_lock<std::mutex> lock(watch_mu_);
        for (;;) {
          watch_cv_.wait(lock, [&] { return stop_ || (job_ && !job_->claimed); });
          if (stop_) return;
          auto job = job_;
          // The caller checks the headers itself once its collective returns; the watcher takes
          // over only when the collective is still running a moment later (it may be blocked).
          watch_cv_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_ || job->claimed; });
          if (stop_) return;
          if (job->claimed) continue;
          job->claimed = true;
          lock.unlock();
          watch(*job);
          lock.lock();
          job->done = true;
          watch_cv_.notify_all();
        }
      });
  }
  watch_cv_.notify_all();
  std::exception_ptr body_error;
  if (body) {
    tag_ = header_tag(header, seq);
    try {
      body();
    } catch (...) {
      body_error = std::current_exception();
    }
    tag_ = 0;
  }
  {
    std::unique_lock<std::mutex> lock(watch_mu_);
    if (!w->claimed) {  // the usual case: the headers arrived before the data; no hand-off
      w->claimed = true;
      lock.unlock();
      watch(*w);
      lock.lock();
      w->done = true;
    }
    watch_cv_.wait(lock, [&] { return w->done; });  // the watcher's waits are bounded by the timeout
    job_.reset();
  }
  if (!w->failed && w->verdict != Agreement::disagree) {
    // The connections stay: every peer needs this rank's header before the buffers go.
    for (auto& snd : w->sends)
      if (snd && !snd->waitSend(timeout_)) fail("tpu::dist: a header send was aborted");
    if (body_error) std::rethrow_exception(body_error);
    return w->all;  // agree, or every rank's arguments were invalid (none ran a collective)
  }
  // Disagreement, or a header that never came: did a rank abandon the call on purpose?
  bool abandoned = !w->failed;
  if (!abandoned) {
    try {
      abandoned = shared_->rdv.has_flag(w->flag);
    } catch (const std::exception&) {
    }
  }
  if (!abandoned) {
    if (body_error) std::rethrow_exception(body_error);
    throw std::runtime_error(w->error);
  }
  w.reset();  // the old context's buffers go before the context
  ++generation_;
  ctx_ = shared_->rdv.connect(rank(), size(), fmt::format("{}r{}.", prefix_, generation_), shared_->device);
  return exchange(header);  // every rank's header, over the new connections
}

}  // namespace

std::shared_ptr<Backend> make_gloo_world(int rank, int world_size, const std::string& store_spec,
                                         const std::string& hostname, std::chrono::milliseconds timeout) {
  NoSigpipe no_sigpipe;
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
  return std::make_shared<GlooBackend>(shared, std::move(ctx), std::move(ranks), "world.", timeout);
}

}  // namespace tpu::dist
