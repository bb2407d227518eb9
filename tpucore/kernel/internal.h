// Internals of the kernel API shared by its sources: the interpreter's storage of a block value
// and the per-call state of a kernel run.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "tpucore/kernel.h"

namespace tpu::kernel {

// Host storage of a value: one double per element, already rounded to the value's dtype (f32
// and bf16 values are exact in a double; i32 and bool too), row-major.
// Lowered (chip) values: the VMEM byte address of a dense row-major array (f32, or bf16 for
// bf16 values; i32 and bool values are kept as f32), or an immediate scalar.
struct Value::Impl {
  std::vector<double> data;
  int64_t vmem = -1;
  bool imm = false;
  double imm_value = 0;
};

namespace detail {

// The value of `x` rounded to what `t` can hold (f32, bf16, i32 wraps, bool is 0/1).
double round_to(DType t, double x);
// True for the dtypes a block may have.
bool block_dtype_ok(DType t);
// A new host value (data sized to the shape, zero).
Value make_value(std::vector<int64_t> shape, DType dtype);
inline std::vector<double>& data_of(Value& v) { return v.impl()->data; }
inline const std::vector<double>& data_of(const Value& v) { return v.impl()->data; }
std::string shape_str(const std::vector<int64_t>& s);
int64_t numel_of(const std::vector<int64_t>& s);

enum class BinOp { add, sub, mul, div, max, min, lt, le, gt, ge, eq, ne, land };
enum class UnOp { neg, abs, relu, exp, log, sqrt, rsqrt, tanh, sigmoid, recip };
enum class RedOp { sum, max, min };

// A backend that emits code for block operations instead of computing them (the chip lowering).
// The front half in values.cpp and refs.cpp checks arguments and computes result shapes and
// dtypes once; a lowerer receives checked operands. Active on the thread that builds a program.
class Lowerer {
 public:
  virtual ~Lowerer() = default;
  virtual Value binary(BinOp op, const Value& a, const Value& b, const std::vector<int64_t>& shape, DType out) = 0;
  virtual Value unary(UnOp op, const Value& a) = 0;
  virtual Value where(const Value& c, const Value& a, const Value& b, const std::vector<int64_t>& shape) = 0;
  virtual Value cast(const Value& a, DType t) = 0;
  virtual Value reduce(RedOp op, const Value& a, int axis, const std::vector<int64_t>& shape, DType out) = 0;
  virtual Value broadcast_to(const Value& a, const std::vector<int64_t>& shape) = 0;
  virtual Value transpose(const Value& a) = 0;
  virtual Value iota(const std::vector<int64_t>& shape, int axis, DType t) = 0;
  virtual Value full(const std::vector<int64_t>& shape, double v, DType t) = 0;
  virtual Value dot(const Value& a, const Value& b, DotOptions o, int64_t m, int64_t k, int64_t n) = 0;
  virtual Value load(Ref::Kind kind, int index, double fill) = 0;
  virtual void store(Ref::Kind kind, int index, const Value& v, const Value* mask) = 0;
  // An async copy (checked by the front half in manual.cpp): issued, and waited on.
  virtual void copy_start(const Ref& src, const Ref& dst, int sem) = 0;
  virtual void copy_wait(const Ref& src, const Ref& dst, int sem) = 0;
};
Lowerer* active_lowerer();
// Makes `l` the thread's lowerer for a scope.
class LowererScope {
 public:
  explicit LowererScope(Lowerer* l);
  ~LowererScope();
  LowererScope(const LowererScope&) = delete;
  LowererScope& operator=(const LowererScope&) = delete;

 private:
  Lowerer* prev_;
};

}  // namespace detail

// One operand's block geometry at the current step.
struct BlockPlace {
  std::vector<int64_t> block;   // the block's shape, squeezed dims dropped
  std::vector<int64_t> start;   // per array dim: the first element's index
  std::vector<int64_t> extent;  // per array dim: block size (1 when squeezed)
  std::vector<int> array_dim;   // per block dim: the array dim it runs along
  Index block_index;            // per array dim
};

struct KernelContext::State {
  const KernelDef* def = nullptr;
  Index grid_index;
  // Host arrays (contiguous) of the operands, as doubles rounded to their dtypes.
  std::vector<TensorType> in_types, out_types;
  std::vector<std::vector<double>> in_data;
  std::vector<std::vector<double>> out_data;
  std::vector<BlockPlace> in_place, out_place;
  // The resident block of each output (written back when its block index changes).
  std::vector<std::vector<double>> out_block;
  std::vector<bool> out_resident;
  std::vector<Value> scratch;
  detail::Lowerer* lower = nullptr;  // set when the body is lowered instead of interpreted
  // Scalar-prefetch arrays (values row-major) and their shapes.
  std::vector<std::vector<int64_t>> scalars;
  std::vector<Shape> scalar_shapes;
  // Async copies in flight, per semaphore (oldest first); the interpreter's copies hold the
  // data read at start().
  struct Copy {
    Ref src, dst;
    Index step;
    std::vector<double> data;
  };
  std::vector<std::deque<Copy>> in_flight;
  std::vector<int> scratch_incoming, scratch_outgoing;  // copies in flight into / out of scratch i
  bool check_copies = true;  // off only to let the chip's race checker see an unchecked body
};

namespace detail {

// Row-major strides of an array shape.
inline std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(static_cast<size_t>(s.ndim()), 1);
  for (int d = s.ndim() - 2; d >= 0; --d) st[static_cast<size_t>(d)] = st[static_cast<size_t>(d + 1)] * s[d + 1];
  return st;
}

// Calls f(block_flat, array_flat_or_-1) for every element of the block.
template <class F>
void for_each_block_elem(const BlockPlace& p, const Shape& array, F f) {
  const std::vector<int64_t> st = strides_of(array);
  const size_t r = p.block.size();
  int64_t base = 0;
  for (size_t d = 0; d < p.start.size(); ++d) base += p.start[d] * st[d];
  const int64_t total = detail::numel_of(p.block);
  std::vector<int64_t> idx(r, 0);
  for (int64_t e = 0; e < total; ++e) {
    bool inside = true;
    int64_t off = base;
    for (size_t j = 0; j < r; ++j) {
      const int ad = p.array_dim[j];
      if (p.start[static_cast<size_t>(ad)] + idx[j] >= array[ad]) inside = false;
      off += idx[j] * st[static_cast<size_t>(ad)];
    }
    f(e, inside ? off : -1);
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < p.block[d]) break;
      idx[d] = 0;
    }
  }
}

std::string spec_name(const BlockSpec& s, const char* kind, size_t i);
// The block shape of a spec over an array (squeezed dims dropped), checked.
std::vector<int64_t> block_shape_of(const KernelDef& k, const BlockSpec& s, const TensorType& t, const std::string& who);
// Where the block of `s` lies at grid index `g` (a tpu::Error for a bad index map).
BlockPlace place_of(const KernelDef& k, const BlockSpec& s, const TensorType& t, const std::string& who,
                    std::span<const int64_t> g, const Scalars* scalars = nullptr);
// The geometry of a window (Ref::at) of an array.
BlockPlace window_place(const Ref& r, const Shape& array);
// validate() with the scalar-prefetch arrays' values (index maps that read them are checked).
void validate_with(const KernelDef& k, std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                   const Scalars* scalars);
// Reads the scalar-prefetch arrays (i32 tensors) into s.scalars.
void read_scalars(KernelContext::State& s, std::span<const Tensor> arrays);
// Manual mode: prepares the copy bookkeeping of a run; checks no copy is left in flight.
void begin_copies(KernelContext::State& s);
void end_copies(KernelContext::State& s);
// A tpu::Error when scratch i is read (or written) while an async copy touching it is in flight.
void check_scratch_access(const KernelContext::State& s, int i, bool write);
// The input/output of a block spec left in HBM.
inline bool is_any(const BlockSpec& s) { return s.memory == MemorySpace::any; }

// Visits every grid index in row-major order.
template <class F>
void for_each_grid_index(const Index& grid, F f) {
  for (int64_t g : grid)
    if (g == 0) return;
  Index g(grid.size(), 0);
  while (true) {
    f(std::span<const int64_t>(g));
    size_t d = grid.size();
    while (d-- > 0) {
      if (++g[d] < grid[d]) break;
      g[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

}  // namespace detail

}  // namespace tpu::kernel
