// The backend interface of tpu::dist (internal). A backend runs collectives on contiguous tensors
// of the devices it calls native (gloo: cpu); ProcessGroup stages every other tensor (another
// device, non-contiguous) through a contiguous host copy and writes results back. Backends are
// what differs between gloo across processes and a simulated pod driven from one process.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpucore/dist.h"

namespace tpu::dist {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool native(Device d) const = 0;
  // Why a tensor on `d` cannot take part ("is on sim:2 but rank 0 is chip sim:0"); empty: it can.
  virtual std::string reject(Device) const { return {}; }

  // All tensors contiguous, on a native device, shapes already agreed by the caller.
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void all_gather(const Tensor& out, const Tensor& in) = 0;        // out: size() blocks
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual void all_to_all(const Tensor& out, const Tensor& in) = 0;        // size() blocks each
  // Uneven all-to-all of 1-D tensors: send[j] elements of `in` (in rank order) go to rank j,
  // recv[i] elements of `out` come from rank i. The caller has checked that the ranks' counts
  // match; `max_block` is the largest count of any rank (the same on every rank). The default
  // pads every block to max_block and runs all_to_all (so the transfer is priced as the padded
  // exchange); gloo overrides it with Gloo's alltoallv.
  virtual void all_to_all_v(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, int64_t max_block);
  virtual void barrier() = 0;
  // Every rank passes `bytes` of the same length; returns every rank's bytes, in rank order.
  virtual std::vector<std::vector<char>> exchange(const std::vector<char>& bytes) = 0;

  // A collective with the header check: every rank passes its header (`header`, same length on
  // every rank) and `body` (the collective; null when this rank's arguments were invalid).
  // `judge` classifies every rank's headers. Returns every rank's header, in rank order; the
  // caller turns a disagreement into its error. A backend may run `body` while the headers
  // travel (gloo: no extra round trip, the body's traffic is tagged by the header so that calls
  // that disagree never exchange data) as long as a disagreement leaves the group usable. The
  // default exchanges the headers first and runs `body` only when they agree.
  enum class Agreement { agree, none_ran, disagree };  // none_ran: every rank's arguments were invalid
  using Judge = std::function<Agreement(const std::vector<std::vector<char>>&)>;
  virtual std::vector<std::vector<char>> run_checked(const std::vector<char>& header, const Judge& judge,
                                                     const std::function<void()>& body) {
    auto all = exchange(header);
    if (judge(all) == Agreement::agree && body) body();
    return all;
  }

  // Point to point: post now, wait later (so that posting never blocks the group's queue).
  struct Pending {
    virtual ~Pending() = default;
    virtual void wait(std::chrono::milliseconds timeout) = 0;
  };
  virtual std::unique_ptr<Pending> post_send(const void* data, size_t n, int dst, uint64_t slot) = 0;
  virtual std::unique_ptr<Pending> post_recv(void* data, size_t n, int src, uint64_t slot) = 0;
  // A tensor's data (contiguous; native, or a host buffer ProcessGroup staged). By default its
  // host bytes; the sim backend moves chip tensors over the ICI instead.
  virtual std::unique_ptr<Pending> post_send_tensor(const Tensor& t, int dst, uint64_t slot) {
    return post_send(t.raw_data(), t.nbytes(), dst, slot);
  }
  virtual std::unique_ptr<Pending> post_recv_tensor(const Tensor& t, int src, uint64_t slot) {
    return post_recv(t.raw_data(), t.nbytes(), src, slot);
  }

  // A group of `ranks` (ranks of this backend's world, sorted, unique); every world rank calls
  // it with the same arguments and `id`; nullptr for a rank outside `ranks`.
  virtual std::shared_ptr<Backend> new_group(const std::vector<int>& ranks, int id) = 0;
};

// The uneven all-to-all of one call (all_to_all.cpp): exchanges every rank's dtype and counts,
// fails on every rank alike when they do not match (naming the ranks and counts), then runs
// Backend::all_to_all_v. `what` starts the error messages.
void run_all_to_all_v(Backend& b, const Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv, const std::string& what);

// The rows of dim 0 of `t` per rank: `splits` checked (n entries, none negative, summing to
// dim 0), or equal splits when it is empty (a tpu::Error naming `arg` and `tensor` otherwise).
std::vector<int64_t> splits_or_even(const std::vector<int64_t>& splits, const Tensor& t, int n, const std::string& what,
                                    const char* arg, const char* tensor);

// The element-wise reduction of op on dtype over n elements: out[i] = a[i] (op) b[i].
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
ReduceFn reduce_fn(DType dtype, ReduceOp op);  // avg reduces as sum (the caller divides)

// (The sim backend's world is made by sim_pod_groups() in tpucore/dist.h.)

// The gloo backend of the world: rendezvous through `store_spec` ("tcp://host:port" or
// "file:///dir"), listening on `hostname`.
std::shared_ptr<Backend> make_gloo_world(int rank, int world_size, const std::string& store_spec,
                                         const std::string& hostname, std::chrono::milliseconds timeout);

}  // namespace tpu::dist
