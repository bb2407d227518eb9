// Internals of tpu::compile shared by the jit_*.cpp files (not a public header).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/executor.h"
#include "graph/tracer.h"
#include "tpucore/compile.h"
#include "tpucore/jit/guards.h"

namespace tpu::jit::detail {

inline constexpr const char* kCompilerVersion = "tpucore-jit-1";

// Per-function counters, registered globally so stats() sees them.
struct StatsRecord {
  std::mutex mu;
  FunctionStats s;  // hits is kept in `hits`
  std::atomic<int64_t> hits{0};
};
std::shared_ptr<StatsRecord> register_stats(const std::string& name);

// How an entry feeds each graph input.
struct InputBinding {
  enum class Kind : uint8_t { arg, captured, scalar } kind = Kind::arg;
  int arg = -1;
  int elem = -1;
  Tensor captured;             // bound by reference (the same TensorImpl every call)
  DType dtype = DType::f32;    // scalar inputs
};

// A dynamic output dim to cut back to the real size after a padded run.
struct DynamicOut {
  int output = 0, dim = 0;
  int arg = 0, arg_dim = 0;  // the input dim it follows
};

// A graph input written in place inside the function: after the run, output `output` is
// copied into the real tensor bound to input `input` (functionalization write-back).
struct WriteBack {
  int input = 0, output = 0;
};

// The .grad of a real tensor after the traced function (see tpucore/autograd/capture.h):
// cleared, a graph output, or another real tensor.
struct GradAction {
  // arg_output: a backward inside the function reached tensor argument `input` (a graph input
  // index); the gradient (graph output `output`) is added to that call's argument's .grad.
  enum class Kind : uint8_t { clear, output, tensor, arg_output } kind = Kind::clear;
  std::shared_ptr<AutogradMeta> meta;
  int output = -1;
  Tensor tensor;
  int input = -1;
};
// The trace read a real tensor's .grad: the entry is valid only while it is the same one.
struct GradGuard {
  std::weak_ptr<TensorImpl> owner;
  const AutogradMeta* meta = nullptr;
  Tensor initial;  // undefined: the trace saw no gradient
  std::string what;  // "f32[256, 784]"
};
// "" when every guard holds, else what changed.
std::string check_guards(const std::vector<GradGuard>& guards);
// Assigns the .grad of the leaves after a run (outputs that share memory with an input or
// another output are copied first, so a .grad never aliases another tensor).
void apply_grads(std::span<const Tensor> ins, const std::vector<Tensor>& outs, const std::vector<GradAction>& grads);

// Whole-graph programs, for a device type whose driver compiles graphs (pjrt: one executable per
// compiled function). A compiler returns null or throws a tpu::Error to decline; the entry then
// runs its optimized graph::Executable (node by node off the cpu).
class GraphProgram {
 public:
  virtual ~GraphProgram() = default;
  // One tensor per graph input; sets one tensor per graph output.
  virtual void run(std::span<const Tensor> inputs, std::vector<Tensor>& outputs) const = 0;
};
using GraphCompiler = std::shared_ptr<GraphProgram> (*)(const graph::Graph& g);
void set_graph_compiler(DeviceType t, GraphCompiler c);

struct Entry {
  std::shared_ptr<GraphProgram> program;  // set when a device's graph compiler took the graph
  std::vector<int64_t> sig;
  uint64_t hash = 0;
  std::vector<InputBinding> bindings;
  std::shared_ptr<graph::Executable> exe;
  std::vector<DynamicOut> dynamic_outs;
  std::vector<DynamicDim> dynamic_in;  // (arg, dim) padded to the bucket in sig
  std::vector<WriteBack> writes;          // graph outputs past `user_outputs` are write-backs
  size_t user_outputs = 0;
  std::vector<graph::Tracer::OutputAlias> aliases;  // outputs returned as (views of) written inputs
  std::vector<GradAction> grads;
  std::vector<GradGuard> guards;
  std::vector<char> fresh;  // per user output (Tracer::fresh_outputs)
  std::vector<TraceGuard> trace_guards;  // tpucore/jit/guards.h (the mesh of traced collectives)
};
// Copies the fresh outputs that share memory with an input or with a constant of `g` (a
// cached graph's constant, e.g. a folded ones(n), is the same storage at every call: a caller
// writing in place to one call's output would change every later call's).
void unalias_outputs(std::span<const Tensor> ins, std::vector<Tensor>& outs, const std::vector<char>& fresh,
                     const graph::Graph* g = nullptr);

// Copies the write-back outputs into their inputs (sources that share memory with a written
// input are copied first), drops them from `outs`, and rebuilds the outputs that alias inputs.
void apply_writes(std::span<const Tensor> ins, std::vector<Tensor>& outs, const std::vector<WriteBack>& writes,
                  size_t user_outputs, const std::vector<graph::Tracer::OutputAlias>& aliases);

// Signature: a flat list of integers per argument (see jit_signature.cpp).
struct SigOptions {
  const std::vector<char>* static_args;
  const std::vector<DynamicDim>* dynamic;  // nullptr: exact sizes
  bool emulate = false;                    // emulate_precision_casts in effect
};
// The process default of emulate_precision_casts, and an option value (-1: that default) resolved.
std::atomic<bool>& emulate_default();
bool resolve_emulate(int option);
void build_signature(std::span<const ArgSlot> args, const SigOptions& o, std::vector<int64_t>& sig);
uint64_t hash_signature(const std::vector<int64_t>& sig);
// "arg 0 shape [8, 128] -> [9, 128]" (the first difference), or "" when equal.
std::string describe_change(const std::vector<int64_t>& before, const std::vector<int64_t>& now);
int64_t bucket_size(int64_t n);  // next power of two (>= 1)

// Scalar arguments as runtime inputs: compares two traces made with different values of the
// number arguments. Returns the arguments that must be static (changing them changes the
// graph in other ways than 0-d constants equal to the argument) and, for the others, turns
// those constants into graph inputs (appended; `bound` gets (arg, dtype) per new input).
std::vector<int> bind_scalar_args(graph::Graph& a, const graph::Graph& b, std::span<const ArgSlot> args,
                                  const std::vector<double>& values_b, std::vector<std::pair<int, DType>>& bound);

// Dynamic dims: which graph outputs follow a padded input dim; nullopt + reason when padding
// could change a result (the dim is reduced, contracted, sliced or reshaped away).
std::optional<std::vector<std::pair<int, int>>> follow_dynamic_dims(const graph::Graph& g,
                                                                    const std::vector<std::pair<int, int>>& input_dims,
                                                                    std::string& why);

// On-disk cache of optimized graphs (TPU_CACHE_DIR). load returns nullopt when absent,
// corrupt or stale (logged).
std::optional<graph::Graph> disk_cache_load(uint64_t key, const graph::Graph& traced);
void disk_cache_store(uint64_t key, const graph::Graph& optimized);
bool disk_cache_enabled();

// Defer-and-fuse eager mode: runs what tracer `t` recorded so far as one graph segment (the
// thread's "eager:defer" engine: passes, segment cache, stats), fills every live proxy in place
// with its value and starts a new segment. `proxy` may be undefined (a flush nobody reads).
Tensor flush_deferred(graph::Tracer& t, const Tensor& proxy, const std::string& why);

}  // namespace tpu::jit::detail
