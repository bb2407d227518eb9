/// @file
/// tpu::dist: process groups and collectives, modeled on torch.distributed.
///
///   tpu::dist::init_process_group();                 // backend gloo; RANK, WORLD_SIZE,
///                                                    // MASTER_ADDR, MASTER_PORT from the env
///   tpu::dist::all_reduce(grad, tpu::dist::ReduceOp::avg);
///   auto work = tpu::dist::all_gather_into_tensor_async(out, shard);
///   work.wait(std::chrono::seconds(10));
///   tpu::dist::destroy_process_group();
///
/// Every rank calls the same collectives in the same order (as in torch.distributed). A
/// collective's tensors may be cpu or sim tensors (the gloo backend stages sim tensors through
/// the host), of any dtype and any strides; results are written back into the caller's tensors.
/// Before each collective the ranks exchange a small header (op, dtype, shape, root, reduce op)
/// so that ranks that disagree get a tpu::Error naming the ranks and their shapes instead of a
/// hang or garbage; InitOptions::check_consistency = false (or TPU_DIST_CHECK=0) skips it.
/// A rank that dies or never arrives makes the others fail with a tpu::Error within the timeout.
/// After a failure the group is broken (every later call on it fails at once naming the first
/// error); the rest of the runtime stays usable.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::dist {

/// How a reduction combines the ranks' values (avg: the sum divided by the group size).
enum class ReduceOp : uint8_t { sum, avg, max, min, product };
/// "sum", "avg", "max", "min" or "product".
std::string_view reduce_op_name(ReduceOp op);

/// Options of init_process_group.
struct InitOptions {
  /// "gloo" (one process per rank) or "sim" (one process drives a simulated pod).
  std::string backend = "gloo";
  int rank = -1;        ///< -1: from $RANK
  int world_size = -1;  ///< -1: from $WORLD_SIZE
  /// "env://" (MASTER_ADDR / MASTER_PORT; rank 0 serves a small TCP store there),
  /// "tcp://host:port" (the same, address given here), or "file:///path" (Gloo's file store in a
  /// directory every rank can reach). Empty: $TPU_DIST_INIT_METHOD or "env://".
  std::string init_method;
  /// Bound on rendezvous and on every collective (0: $TPU_DIST_TIMEOUT_MS or 30 s).
  std::chrono::milliseconds timeout{0};
  /// Address this rank's Gloo device listens on (empty: $TPU_DIST_HOSTNAME, else MASTER_ADDR's
  /// host when it is a loopback address, else this machine's host name).
  std::string hostname;
  bool check_consistency = true;  ///< header exchange before each collective; $TPU_DIST_CHECK=0 off
};

class Backend;  // tpucore/dist/backend.h: gloo, sim
namespace detail { struct WorkState; }

/// Handle of an asynchronous collective. wait() blocks until it finished (rethrowing its error)
/// and writes results back into the caller's tensors; a timeout is a tpu::Error (the operation
/// itself stays bounded by the group's timeout).
class Work {
 public:
  Work() = default;
  /// Made by the collectives.
  explicit Work(std::shared_ptr<detail::WorkState> s) : state_(std::move(s)) {}
  bool is_completed() const;  ///< finished (successfully or not); wait() still needed to finish
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;  ///< 0: group timeout
 private:
  std::shared_ptr<detail::WorkState> state_;
};

/// A set of ranks that run collectives together (torch.distributed's ProcessGroup). Made by
/// init_process_group (the world), new_group, DeviceMesh and the sim helpers. Ranks in the
/// methods are ranks inside this group.
class ProcessGroup {
 public:
  /// Made by the library (init_process_group, new_group, ...): this process is global rank
  /// `my_global_rank`, a member when it is one of `global_ranks`.
  ProcessGroup(std::shared_ptr<Backend> backend, std::vector<int> global_ranks, int my_global_rank,
               std::chrono::milliseconds timeout, bool check);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// False when this process is not one of the group's ranks (then collectives are a tpu::Error).
  bool is_member() const { return rank_ >= 0; }
  int rank() const;  ///< rank inside this group; a tpu::Error for a non-member
  /// Number of ranks.
  int size() const { return static_cast<int>(ranks_.size()); }
  /// The world ranks of the group, by group rank.
  const std::vector<int>& global_ranks() const { return ranks_; }
  /// "gloo" or "sim".
  std::string backend_name() const;
  /// Bound on every collective.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Turns the header exchange before each collective on or off.
  void set_check_consistency(bool on) { check_ = on; }

  /// In place on t.
  Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum);
  Work broadcast_async(const Tensor& t, int src);  ///< src: rank in this group
  /// out[i] receives rank i's input; every out[i] has input's shape and dtype.
  Work all_gather_async(const std::vector<Tensor>& out, const Tensor& input);
  /// out has input's shape with dim 0 multiplied by size() (a 0-d input: out is [size()]).
  Work all_gather_into_tensor_async(const Tensor& out, const Tensor& input);
  /// input's dim 0 is size() times out's; rank r receives the reduced r-th block.
  Work reduce_scatter_tensor_async(const Tensor& out, const Tensor& input, ReduceOp op = ReduceOp::sum);
  /// out[j] of rank i receives input[i] of rank j (flattened; shapes may differ, element counts
  /// must match across ranks, checked before any data moves); one dtype.
  Work all_to_all_async(const std::vector<Tensor>& out, const std::vector<Tensor>& input);
  /// dim 0 split into size() equal blocks: block j goes to rank j.
  Work all_to_all_single_async(const Tensor& out, const Tensor& input);
  /// As torch's all_to_all_single with split sizes: input_split_sizes[j] rows of dim 0 go to
  /// rank j, output_split_sizes[i] rows come from rank i (an empty list: equal splits). The
  /// ranks' sizes and dtypes are exchanged and checked first (a mismatch is a tpu::Error on
  /// every rank naming the ranks and sizes); not traceable in tpu::compile.
  Work all_to_all_single_async(const Tensor& out, const Tensor& input, const std::vector<int64_t>& output_split_sizes,
                               const std::vector<int64_t>& input_split_sizes);
  /// Sends t to rank `dst`; the matching recv uses the same tag.
  Work send_async(const Tensor& t, int dst, int tag = 0);
  /// Receives into t from rank `src`.
  Work recv_async(const Tensor& t, int src, int tag = 0);
  /// Completes when every rank has called it.
  Work barrier_async();

  /// Blocking forms of the *_async methods above: when nothing else of the group is queued, the
  /// call runs on the caller's thread (no hand-off to the group's thread); otherwise it queues
  /// behind and waits.
  ///@{
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  void broadcast(const Tensor& t, int src);
  void all_gather(const std::vector<Tensor>& out, const Tensor& in);
  void all_gather_into_tensor(const Tensor& out, const Tensor& in);
  void reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
  void all_to_all(const std::vector<Tensor>& out, const std::vector<Tensor>& in);
  void all_to_all_single(const Tensor& out, const Tensor& in);
  void all_to_all_single(const Tensor& out, const Tensor& in, const std::vector<int64_t>& output_split_sizes,
                         const std::vector<int64_t>& input_split_sizes);
  void send(const Tensor& t, int dst, int tag = 0) { send_async(t, dst, tag).wait(); }
  void recv(const Tensor& t, int src, int tag = 0) { recv_async(t, src, tag).wait(); }
  void barrier();
  ///@}

  Backend& backend_impl() const;  ///< for backends layered on this one (tests, benchmarks)

 private:
  struct Queue;
  std::string where() const;
  void require_member(const char* op) const;
  std::shared_ptr<Backend> backend_;
  std::vector<int> ranks_;
  int rank_ = -1;
  std::chrono::milliseconds timeout_;
  bool check_;
  std::unique_ptr<Queue> queue_;
};

/// Shared handle of a group (null means the default group in the free functions).
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// ---- the sim backend: one simulated pod driven from one process (single controller) ----
/// Rank r is chip sim:r of the pod (TPU_SIM_POD / tpu::device::set_sim_pod); its tensors live on
/// sim:r (cpu tensors are staged onto the chip; a tensor on another chip is a tpu::Error).
/// sim_pod_groups() returns one ProcessGroup per chip; drive them from one thread per rank
/// (blocking calls), or from one thread with the async forms: a rank's call completes when every
/// rank of the group has called in (then one pod collective moves the data over the ICI), so
/// post every rank's *_async call first and wait() afterwards. A blocking call on one rank from a
/// thread that drives all the ranks fails after the timeout. A rank that never calls in makes the
/// others fail within the timeout and breaks the group. send is eager (a copy on the sender's
/// chip moves over the ICI when the matching recv is posted).
struct SimPodOptions {
  int chips = 0;                          ///< 0: every chip of the pod; else sim:0 .. sim:chips-1
  std::chrono::milliseconds timeout{0};   ///< 0: $TPU_DIST_TIMEOUT_MS or 30 s
  bool check_consistency = true;          ///< $TPU_DIST_CHECK=0 off (the backend still checks counts)
};
/// One group per chip of the simulated pod (see above); a tpu::Error without a pod.
std::vector<ProcessGroupPtr> sim_pod_groups(const SimPodOptions& options = {});
/// The groups of `ranks` (ranks of the world `world` that sim_pod_groups returned), in rank order;
/// element i is the group of world rank sorted(ranks)[i].
std::vector<ProcessGroupPtr> sim_new_group(const std::vector<ProcessGroupPtr>& world, const std::vector<int>& ranks);

// ---- a large slice simulated by symmetry (tpucore/dist/sim_symmetric.cpp) ----
/// One sim device plays rank `rank` of a group spanning `axes` of `slice` (all axes when empty);
/// the other ranks are taken to run the same program on same-shaped data (SPMD), so their
/// timelines are this chip's. Each collective costs what the pod's algorithm costs on the whole
/// slice (a job on the chip's ICI, overlapping programs on other streams) and returns the values
/// of a world where every rank holds this rank's data (all_reduce sum: G x; all_gather: G
/// copies); in timing-only mode no data moves. For costing pod-scale steps on one chip.
/// send/recv and new_group are not supported.
struct SimSymmetricOptions {
  std::string slice;            ///< "2x2x2", "4x4x4", "4x8x8" (in the ICI preset's limits)
  std::vector<int> axes{};      ///< the slice's axes the group spans (empty: all)
  int device = 0;               ///< the chip simulated in full: sim:device
  int rank = 0;                 ///< its rank in the group
  std::string ici{};            ///< ICI preset (default: the chip preset's)
  /// Header exchange before each collective.
  bool check_consistency = false;
};
/// The group of the simulated rank (see above); a bad slice, axis, device or rank is a tpu::Error.
ProcessGroupPtr sim_symmetric_group(const SimSymmetricOptions& options);

// ---- the default group (the world) ----
/// backend "gloo": one process per rank (rank and world size from the options or the env).
/// backend "sim": one process drives the first world_size chips of the simulated pod (-1: every
/// chip; TPU_SIM_POD must name the pod); rank stays -1. The ranks run as threads: run_ranks(fn)
/// calls fn(rank) on one thread per rank, and on that thread the default group is that rank's, so
/// SPMD code written for gloo (get_rank(), all_reduce(t), new_group, DeviceMesh) runs unchanged.
void init_process_group(const InitOptions& options = {});
/// Runs fn(rank) on one thread per rank of the sim world (init_process_group with backend "sim")
/// and joins them; then rethrows a tpu::Error naming every rank that threw and its message. A
/// rank that throws before a collective makes the others fail within the timeout (not hang).
void run_ranks(const std::function<void(int rank)>& fn);
/// True between init_process_group and destroy_process_group.
bool is_initialized();
void destroy_process_group();  ///< idempotent
ProcessGroupPtr world();       ///< a tpu::Error before init_process_group (sim: outside run_ranks)
/// This thread's rank in the world (a tpu::Error before init_process_group).
int get_rank();
/// Number of ranks in the world (a tpu::Error before init_process_group).
int get_world_size();
/// Every rank of the world calls it with the same ranks, in the same order as other new_group
/// calls; a rank outside `ranks` gets a non-member group (is_member() false).
ProcessGroupPtr new_group(const std::vector<int>& ranks);

/// Free functions on the default group (or `group`): as the ProcessGroup methods of the same
/// name.
///@{
void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum, const ProcessGroupPtr& group = nullptr);
Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum, const ProcessGroupPtr& group = nullptr);
void broadcast(const Tensor& t, int src, const ProcessGroupPtr& group = nullptr);
void all_gather(const std::vector<Tensor>& out, const Tensor& in, const ProcessGroupPtr& group = nullptr);
void all_gather_into_tensor(const Tensor& out, const Tensor& in, const ProcessGroupPtr& group = nullptr);
void reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum,
                           const ProcessGroupPtr& group = nullptr);
void all_to_all(const std::vector<Tensor>& out, const std::vector<Tensor>& in, const ProcessGroupPtr& group = nullptr);
void send(const Tensor& t, int dst, int tag = 0, const ProcessGroupPtr& group = nullptr);
void recv(const Tensor& t, int src, int tag = 0, const ProcessGroupPtr& group = nullptr);
void barrier(const ProcessGroupPtr& group = nullptr);
///@}

/// A logical n-D arrangement of the world's ranks with named axes, as torch's DeviceMesh:
/// DeviceMesh({2, 2}, {"dp", "tp"}) puts rank r at row-major coordinate (r / 2, r % 2);
/// group("tp") is this rank's group along "tp" (the ranks that differ only in that coordinate).
/// Every rank constructs the same mesh (it calls new_group for every line of every axis).
class DeviceMesh {
 public:
  /// A mesh of `shape` (its product is the world size) with one name per axis, else a tpu::Error.
  DeviceMesh(std::vector<int> shape, std::vector<std::string> axis_names);
  /// Ranks along each axis.
  const std::vector<int>& shape() const { return shape_; }
  /// The axis names.
  const std::vector<std::string>& axis_names() const { return names_; }
  int axis(const std::string& name) const;           ///< a tpu::Error naming the known axes
  /// This rank's group along `axis_name` (a tpu::Error for an unknown axis).
  ProcessGroupPtr group(const std::string& axis_name) const;
  std::vector<int> coordinate() const;               ///< this rank's coordinate
  /// Number of ranks along `axis_name`.
  int size(const std::string& axis_name) const { return shape_[static_cast<size_t>(axis(axis_name))]; }
 private:
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<ProcessGroupPtr> groups_;
};

}  // namespace tpu::dist
