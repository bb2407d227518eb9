// The kernel API: custom kernels written in C++ over blocks, in the manner of Pallas. A kernel is
// a grid, a block specification per operand (block shape + index map from the grid index to
// the block index) and a body that runs once per grid step on the blocks of that step:
//
//   kernel::KernelDef k;
//   k.name = "add_one";
//   k.grid = {m / 8};
//   k.in_specs = {{.block_shape = {8, n}, .index_map = [](auto g) { return kernel::Index{g[0], 0}; }}};
//   k.out_specs = k.in_specs;
//   k.body = [](kernel::KernelContext& c) { c.out(0).store(c.in(0).load() + 1.0); };
//   Tensor y = kernel::call(k, {x}, {{x.shape(), x.dtype()}})[0];
//
// kernel::register_op makes a kernel an op (eager, inside tpu::compile as one node, with
// autograd). docs/kernels.md is the guide.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"
#include "tpucore/kernel/block.h"

namespace tpu::kernel {

/// A block dimension of size 1 dropped from the block's shape (Pallas' `None`); its index-map
/// entry is then an element index.
inline constexpr int64_t squeezed = -1;

/// A grid index or a block index.
using Index = std::vector<int64_t>;
/// Maps the grid index of a step to the block index of an operand (one entry per array dim,
/// counted in blocks).
using IndexMap = std::function<Index(std::span<const int64_t> grid_index)>;

/// Where an operand lives while the kernel runs.
enum class MemorySpace : uint8_t {
  vmem,  ///< cut into blocks that the kernel copies into vector memory step by step
  any    ///< left in HBM: the body moves windows of it with async_copy (manual mode)
};

/// The kernel's scalar-prefetch arrays (its first KernelDef::num_scalar_prefetch inputs, i32),
/// readable in index maps and in the body (Pallas' scalar prefetch).
class Scalars {
 public:
  /// Over the arrays' values (row-major) and shapes.
  Scalars(const std::vector<std::vector<int64_t>>* values, const std::vector<Shape>* shapes, const std::string* kernel)
      : values_(values), shapes_(shapes), kernel_(kernel) {}
  /// Element `i` (row-major) of scalar-prefetch array `array` (a tpu::Error out of range).
  int64_t operator()(int array, int64_t i) const;
  /// The shape of scalar-prefetch array `array`.
  const Shape& shape(int array) const;
  /// Number of scalar-prefetch arrays.
  int count() const { return static_cast<int>(values_->size()); }

 private:
  const std::vector<std::vector<int64_t>>* values_;
  const std::vector<Shape>* shapes_;
  const std::string* kernel_;
};
/// An index map that also reads the scalar-prefetch arrays (a block that follows a block table).
using ScalarIndexMap = std::function<Index(std::span<const int64_t> grid_index, const Scalars& scalars)>;

/// How an operand is cut into blocks (Pallas' BlockSpec).
struct BlockSpec {
  /// One entry per array dim: the block's size (or `squeezed`). Empty: the whole array is one
  /// block.
  std::vector<int64_t> block_shape{};
  /// Grid index -> block index. Empty: block index 0 in every dim.
  IndexMap index_map{};
  /// Name used in errors (default "input i" / "output i").
  std::string name{};
  /// MemorySpace::any leaves the operand in HBM (no blocks; block_shape and the maps unused).
  MemorySpace memory = MemorySpace::vmem;
  /// Used instead of index_map when set: grid index and scalar-prefetch arrays -> block index.
  ScalarIndexMap scalar_index_map{};
};

/// A buffer in vector memory that persists over the grid steps of one call (accumulators).
struct ScratchSpec {
  std::vector<int64_t> shape{};  ///< its shape
  DType dtype = DType::f32;    ///< its element type
  std::string name{};          ///< name used in errors (default "scratch i")
};

/// Shape and dtype of a kernel operand.
struct TensorType {
  Shape shape{};             ///< dimensions
  DType dtype = DType::f32;  ///< element type
};

/// Compile-time parameters of a kernel (block sizes, flags), by name.
using Params = std::map<std::string, int64_t>;

class KernelContext;
/// The body of a kernel: runs once per grid step.
using KernelBody = std::function<void(KernelContext&)>;

/// The vector-memory budget of a kernel when its definition sets none: 16 MiB (the scoped VMEM
/// limit Pallas uses by default on TPU v5e).
inline constexpr int64_t kDefaultVmemBudget = 16ll << 20;

/// A kernel for given operand shapes: the grid, the blocks, scratch buffers and the body.
struct KernelDef {
  std::string name{};               ///< the kernel's name (errors, profiler)
  Index grid{};                     ///< steps per grid axis; run row-major, last axis fastest
  std::vector<BlockSpec> in_specs{};  ///< one per input
  std::vector<BlockSpec> out_specs{}; ///< one per output
  std::vector<ScratchSpec> scratch{}; ///< persistent buffers (zero at the start of a call)
  Params params{};                  ///< compile-time parameters, read by the body with param()
  KernelBody body{};                ///< the per-step computation
  /// The first inputs that are scalar-prefetch arrays (i32, any shape): they have no block
  /// spec (in_specs covers the other inputs, and in(i) counts from the first of those).
  int num_scalar_prefetch = 0;
  /// DMA semaphores the body's async copies signal (0 .. num_semaphores - 1).
  int num_semaphores = 0;
  /// Bytes of vector memory the blocks may use: every input and output block double-buffered
  /// plus the scratch buffers (0: kDefaultVmemBudget).
  int64_t vmem_budget_bytes = 0;
};

/// A reference to one operand's block of the current grid step (or to a scratch buffer).
class Ref {
 public:
  /// The block's shape (squeezed dims dropped).
  const std::vector<int64_t>& shape() const;
  /// The operand's element type.
  DType dtype() const;
  /// The block's values; elements past the array's end (a ragged edge) read as `fill`. An
  /// output block reads what this and earlier steps of its residency stored (zeros at first).
  Value load(double fill = 0) const;
  /// The block's values where `mask` (bool, broadcast to the block) is true, else `fill`.
  Value load(const Value& mask, double fill = 0) const;
  /// Writes `v` (converted to the operand's dtype, broadcast to the block); elements past the
  /// array's end are not written.
  void store(const Value& v) const;
  /// Writes `v` where `mask` is true.
  void store(const Value& v, const Value& mask) const;
  /// Elements of the block inside the array along block dim `axis` (the block's size except at
  /// a ragged edge).
  int64_t valid(int axis) const;
  /// Bool value of the block's shape: true where the element lies inside the array.
  Value valid_mask() const;
  /// Index of the block's first element in the array, along block dim `axis`.
  int64_t offset(int axis) const;

  /// A window of an operand in MemorySpace::any: `shape` elements from element `start`, one
  /// entry per array dim (`squeezed` drops a dim of size 1), for async_copy. A window out of
  /// the array's range is a tpu::Error.
  Ref at(Index start, std::vector<int64_t> shape) const;

  /// What a Ref refers to.
  enum class Kind : uint8_t {
    input,   ///< an input operand
    output,  ///< an output operand
    scratch  ///< a scratch buffer
  };
  /// Made by KernelContext.
  Ref(KernelContext* ctx, Kind kind, int index) : ctx_(ctx), kind_(kind), index_(index) {}
  /// Input, output or scratch.
  Kind kind() const { return kind_; }
  /// The operand's or scratch buffer's index.
  int index() const { return index_; }
  /// True for a window made by at().
  bool is_window() const { return windowed_; }
  /// A window's first element per array dim.
  const Index& window_start() const { return start_; }
  /// A window's size per array dim (`squeezed` where dropped).
  const std::vector<int64_t>& window_extent() const { return extent_; }

 private:
  KernelContext* ctx_;
  Kind kind_;
  int index_;
  bool windowed_ = false;
  Index start_{};
  std::vector<int64_t> extent_{};
  std::vector<int64_t> wshape_{};
};

/// An asynchronous DMA copy between a window of an HBM operand (MemorySpace::any) and a scratch
/// buffer, signalling a semaphore (Pallas' make_async_copy). start() issues it; wait() blocks
/// until the oldest copy started on its semaphore is done (copies sharing a semaphore are waited
/// in the order they started; that copy must have the same source and destination shapes). A
/// copy may be waited on in a later grid step (double buffering across steps). Errors, at the
/// first run of the body (the interpreter, or the chip lowering, which runs it at build time):
/// a wait with no copy in flight on its semaphore, a copy never waited on when the kernel ends,
/// and a read or write of a scratch buffer whose copy is in flight.
class AsyncCopy {
 public:
  /// Made by KernelContext::async_copy.
  AsyncCopy(KernelContext* ctx, Ref src, Ref dst, int sem) : ctx_(ctx), src_(std::move(src)), dst_(std::move(dst)), sem_(sem) {}
  /// Issues the copy.
  void start() const;
  /// Waits for the oldest copy in flight on the semaphore.
  void wait() const;
  /// The source.
  const Ref& src() const { return src_; }
  /// The destination.
  const Ref& dst() const { return dst_; }
  /// The semaphore.
  int semaphore() const { return sem_; }

 private:
  KernelContext* ctx_;
  Ref src_, dst_;
  int sem_;
};

/// What the body sees at one grid step: its position, the blocks and the parameters.
class KernelContext {
 public:
  /// The backend's per-call state.
  struct State;
  /// Made by the runner.
  explicit KernelContext(State* s) : s_(s) {}
  /// This step's index along grid axis `axis`.
  int64_t program_id(int axis) const;
  /// Steps along grid axis `axis`.
  int64_t num_programs(int axis) const;
  /// Input i's block.
  Ref in(int i);
  /// Output i's block.
  Ref out(int i);
  /// Scratch buffer i.
  Ref scratch(int i);
  /// A compile-time parameter (a tpu::Error naming it when missing).
  int64_t param(const std::string& name) const;
  /// Element `i` (row-major) of scalar-prefetch array `array`.
  int64_t scalar(int array, int64_t i) const;
  /// The scalar-prefetch arrays.
  Scalars scalars() const;
  /// A copy from `src` to `dst` signalling semaphore `sem`: one side a window (Ref::at) of an
  /// operand in MemorySpace::any, the other a scratch buffer of the window's shape and dtype.
  AsyncCopy async_copy(const Ref& src, const Ref& dst, int sem);
  /// The kernel being run.
  const KernelDef& def() const;
  /// The backend's state.
  State& state() const { return *s_; }

 private:
  State* s_;
};

/// Checks a kernel against its operands without running it: specs per operand, block ranks,
/// dtypes, the vector-memory budget (a tpu::Error naming the block, the budget and the shapes),
/// and every index map at every grid step (a tpu::Error naming the operand, the grid index and
/// the block index out of range).
void validate(const KernelDef& k, std::span<const TensorType> inputs, std::span<const TensorType> outputs);

/// Runs a kernel on `inputs`, making outputs of the given types on their device. On cpu tensors
/// the body runs in the interpreter (Pallas' interpret=True): block by block over the grid, on
/// the host. On a chip device (`sim:N`) the kernel is lowered to a program of the chip (its grid
/// unrolled) and run there; an operation the lowering lacks is a tpu::Error naming it.
/// kernel::call lowers on every call (a registered op caches its programs).
std::vector<Tensor> call(const KernelDef& k, std::span<const Tensor> inputs, std::span<const TensorType> outputs);
/// call() with braced lists.
std::vector<Tensor> call(const KernelDef& k, std::initializer_list<Tensor> inputs,
                         std::initializer_list<TensorType> outputs);

/// Output types of a kernel op for given input types and parameters (the op's shape/dtype rule).
using ShapeRule = std::function<std::vector<TensorType>(std::span<const TensorType> inputs, const Params& params)>;
/// The kernel of an op for given input and output types and parameters.
using KernelBuilder = std::function<KernelDef(std::span<const TensorType> inputs,
                                              std::span<const TensorType> outputs, const Params& params)>;

/// What a kernel op's backward sees.
struct BackwardContext {
  std::span<const Tensor> inputs;        ///< the forward inputs
  std::span<const Tensor> outputs;       ///< the forward outputs
  std::span<const Tensor> grad_outputs;  ///< one per output (zeros where none flowed)
  const Params& params;                  ///< the call's parameters
  uint32_t needs = 0;                    ///< bit i: input i needs a gradient
  /// True when input i needs a gradient.
  bool needs_grad(size_t i) const { return (needs >> (i < 31 ? i : 31)) & 1u; }
};
/// Gradients of the inputs (undefined where none is needed), written with tpu ops or other
/// kernel ops; traced like any op inside tpu::compile.
using BackwardRule = std::function<std::vector<Tensor>(const BackwardContext&)>;

/// Declaration of a kernel op.
struct OpSpec {
  std::string name{};      ///< the op's registry name (unique)
  int num_inputs = 1;      ///< tensor inputs
  ShapeRule output_types{};  ///< shape/dtype rule (at most 4 outputs)
  KernelBuilder kernel{};    ///< the kernel for given shapes
  BackwardRule backward{};   ///< optional: without it the op is not differentiable
  std::string doc{};         ///< one line: what the op computes
};

/// A registered kernel op.
class Op {
 public:
  /// Made by register_op.
  explicit Op(std::string name) : name_(std::move(name)) {}
  /// Calls the op (eager, traced inside tpu::compile, recorded by autograd); all outputs.
  std::vector<Tensor> call(std::span<const Tensor> inputs, const Params& params = {}) const;
  /// Calls the op; its first output.
  Tensor operator()(std::initializer_list<Tensor> inputs, const Params& params = {}) const;
  /// The registry name.
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

/// Registers a kernel as an op of the registry: its meta function is the shape rule, its cpu
/// kernel the interpreter, its chip kernel the lowered program (cached per operand types and
/// parameters), its backward the rule. A name already registered is a tpu::Error.
Op register_op(OpSpec spec);

/// True when `name` is an op made by register_op (not one of the library's own ops).
bool is_kernel_op(std::string_view name);

/// The number of tensor inputs of kernel op `name` (OpSpec::num_inputs), or -1 when no kernel op
/// has that name.
int kernel_op_num_inputs(std::string_view name);

}  // namespace tpu::kernel
