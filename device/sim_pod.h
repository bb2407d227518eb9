// Sim devices as one pod: TPU_SIM_POD=2x2 (or set_sim_pod("2x2")) makes sim:0 .. sim:3 the
// chips of a 2x2 slice (row-major: sim:i has coordinates sim::Topology::coords(i)), joined by
// the ICI of their chip preset (TPU_SIM_ICI overrides it: a preset name). TPU_SIM_DEVICES then
// defaults to the slice's chip count and must be at least that. Without TPU_SIM_POD every sim
// device is a 1-chip pod of its own and collectives over several devices are an error.
//
// Collectives run between HBM buffers, one per participating device, and are asynchronous like
// programs: each device's part is a job on a stream of that device (its current stream by
// default) using the device's ICI resource, so programs on other streams overlap it in
// simulated time. The collective starts when every participant's stream reached it (the latest
// of their stream times) and ends after the ICI cost; all participants' streams are at its end.
// This is the entry point of the `sim` backend of tpu::dist.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/stream.h"
#include "sim/pod.h"

namespace tpu::device {

// "2x2", "4x4x4", "" for none. A tpu::Error naming the shape and the limits when it does not
// fit the chip preset's ICI, or the devices when fewer sim devices exist than the slice needs.
void set_sim_pod(const std::string& shape);
std::string sim_pod_shape();
// The topology of the pod (set_sim_pod / TPU_SIM_POD); a tpu::Error when no pod is configured.
sim::Topology sim_pod_topology();

struct SimBuffer {
  int device = 0;        // sim:device
  uint64_t addr = 0;     // HBM byte address (a sim tensor's Storage::data + its byte offset)
  StreamId stream = 0;   // 0: the device's current stream
};

// One collective over devices (rank r = bufs[r]; all in the same pod). Counts and layouts as
// sim::CollectiveSpec (sim/pod.h): count is elements of dtype in each rank's src.
struct SimCollectiveArgs {
  sim::CollectiveKind kind = sim::CollectiveKind::all_reduce;
  sim::ReduceOp op = sim::ReduceOp::sum;
  sim::DType dtype = sim::DType::f32;
  uint64_t count = 0;
  std::vector<SimBuffer> src, dst;             // one per rank (dst may equal src for all_reduce)
  std::vector<std::pair<int, int>> pairs;      // permute: (source rank, target rank)
  int root = 0;                                // broadcast: root rank
  bool timing_only = false;                    // cost only, move no data
  std::string name;                            // trace label
  sim::ElemType elem = sim::ElemType::native;  // f16 / u8 / boolean tensors (dtype then ignored)
};

struct SimCollectiveResult {
  double cycles = 0, seconds = 0;   // ICI cost (chip clock cycles)
  double start = 0, end = 0;        // simulated seconds on the devices' timelines
  uint64_t bytes = 0;               // the book's V (sim/ici.h)
  double achieved_gbps = 0;
  std::string algorithm;
};

class SimCollectiveWork {
 public:
  virtual ~SimCollectiveWork() = default;
  virtual bool done() const = 0;
  // Waits until every participant's part ran; a tpu::Error if it failed or if `timeout`
  // passed first (the collective then still completes in the background).
  virtual SimCollectiveResult wait(std::chrono::milliseconds timeout = std::chrono::minutes(5)) = 0;
};

// Checks the arguments at once (a tpu::Error naming the rank and what is wrong: a device outside
// the pod, a device twice, counts or layouts that do not fit, addresses outside HBM) and queues
// the collective. sim_collective waits for it.
std::shared_ptr<SimCollectiveWork> sim_collective_async(const SimCollectiveArgs& args);
SimCollectiveResult sim_collective(const SimCollectiveArgs& args);

// Internal: the chip count TPU_SIM_POD asks for (0 when unset or malformed), the default of
// TPU_SIM_DEVICES.
int sim_pod_env_chips();

}  // namespace tpu::device
