/// @file
/// Defer-and-fuse eager mode: inside a tpu::DeferredEager scope eager op calls are recorded
/// instead of run, and the recording is flushed as one graph through the JIT's passes (fusion,
/// buffer planning) and a per-thread segment cache when a value is needed:
///   - a value is read: item(), to_vector(), printing, to(device), ops that need values
///     (nonzero, boolean masks, ...);
///   - the recording reaches max_nodes ops (TPU_DEFER_MAX_NODES, default 512);
///   - the user synchronizes: flush() / tpu::flush_deferred(), and at the end of the scope.
/// Ops that run eagerly: random ops (after a flush: the generator is read in program order) and,
/// with grad mode on, ops with an input that requires grad (autograd records them as usual; they
/// flush first only when they read the recording: a recorded input, or real memory the recording
/// reads or writes). backward(), optim::SGD's step and cross_entropy's target ops flush and run
/// eagerly (SGD in place): on the training step that was faster than recording them; AdamW's
/// step is recorded and fused.
/// Shapes and dtypes are always known while recording (each op's meta function runs at the call,
/// so argument errors are raised at the call, as in eager). Errors found only while computing
/// (e.g. an index out of range in a computed index tensor) are raised at the flush, as a
/// tpu::Error naming the op; the tensors of that recording are then unusable, the runtime is not.
/// Repeated loops record structurally equal graphs and hit the cache: tpu::jit::stats() shows
/// them as the function "eager:defer" (compiles, hits, breaks = flushes with their causes).
/// Host access keeps eager order: data() / raw_data(), equal(), allclose(), to(device) and
/// save_safetensors read a recorded value (a flush); a raw read or write of a real tensor whose
/// memory the recording reads or writes flushes first; a write through one view of real memory
/// while another view of it is recorded flushes first (one graph never has aliasing inputs); a
/// tpu::compile call flushes first and runs its graph unrecorded; detach() and autograd's saved
/// aliases of a recorded value are filled at the flush with it.
/// Not seen by the recording: raw device memory (storage()) of a recorded value, and its strides
/// (a recorded value reports contiguous strides until it is flushed).
#pragma once

#include <cstddef>
#include <memory>

namespace tpu {

namespace detail {
struct DeferState;
}

/// Records this thread's eager ops for its scope and runs them fused (see the file's
/// description); nests and does nothing inside a trace or another scope.
class DeferredEager {
 public:
  /// max_nodes 0: TPU_DEFER_MAX_NODES or 512. Inside tpu::compile's tracing or another
  /// DeferredEager scope the guard does nothing.
  explicit DeferredEager(size_t max_nodes = 0);
  /// Flushes. An error of that flush propagates unless an exception is already in flight
  /// (then it is logged).
  ~DeferredEager() noexcept(false);
  DeferredEager(const DeferredEager&) = delete;
  DeferredEager& operator=(const DeferredEager&) = delete;

  /// Runs what has been recorded so far (its errors are raised here).
  void flush();
  /// False when the guard does nothing (inside tracing or another scope).
  bool active() const { return state_ != nullptr; }

 private:
  std::unique_ptr<detail::DeferState> state_;
  int uncaught_ = 0;
};

/// Flushes this thread's deferred recording, if any (no-op otherwise).
void flush_deferred();

/// While the ops of this thread are being recorded by a deferred eager scope: flushes the
/// recording and runs the guard's scope eagerly (op by op), then records again. Does nothing
/// otherwise (plain eager, or inside tpu::compile's tracing). For code that runs faster in place
/// than recorded and fused (an SGD update, a backward of many small ops).
class EagerIfDeferred {
 public:
  EagerIfDeferred();
  ~EagerIfDeferred();
  EagerIfDeferred(const EagerIfDeferred&) = delete;
  EagerIfDeferred& operator=(const EagerIfDeferred&) = delete;

 private:
  void* prev_ = nullptr;  ///< the recording's dispatch interceptor, restored at the end
};
/// Whether this thread is recording deferred eager ops.
bool eager_deferred();
/// TPU_EAGER=defer (read at load): every thread (not the pool's chunks inside a kernel's
/// parallel_for, which stay eager) records from its first op call on, as inside a
/// DeferredEager scope that never ends (values are flushed when read, or by flush_deferred()).
/// TPU_EAGER=plain or unset: plain eager. Anything else is a warning and plain eager.
/// Experimental: the OpInfo table, the eager suites and the tiny-LLM checks of ctest "core: defer
/// env mode: opinfo and eager suites" pass in this mode; other tests that count chip programs,
/// profiler rows or per-op cycles, expect an error at the call (raised at the flush here), or
/// read storage() or strides of recorded values differ (README).
bool eager_defer_env();

}  // namespace tpu
