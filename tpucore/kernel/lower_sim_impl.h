// The chip lowerer of kernels, shared by lower_sim.cpp (operations on values, the program's
// frame) and lower_sim_pipeline.cpp (block copies between HBM and VMEM over the grid steps).
#pragma once

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codegen/launch.h"
#include "codegen/precision.h"
#include "codegen/sim_tensors.h"
#include "sim/builder.h"
#include "tpucore/core/error.h"
#include "tpucore/kernel/lower_sim.h"

namespace tpu::kernel::detail::chip_lowering {


using B = sim::ProgramBuilder;
using sim::Op;

struct Dims2 {
  int64_t rows = 1, cols = 1;
};

inline Dims2 dims2(const std::vector<int64_t>& s, const std::string& kernel) {
  if (s.empty()) return {};
  if (s.size() == 1) return {1, s[0]};
  if (s.size() == 2) return {s[0], s[1]};
  fail("kernel '{}': a value of shape {} (rank {}) is not lowered to the chip (ranks 0 to 2)", kernel, shape_str(s),
       s.size());
}

inline sim::DType phys(DType t) { return t == DType::bf16 ? sim::DType::bf16 : t == DType::i8 ? sim::DType::i8 : sim::DType::f32; }
inline int64_t psize(DType t) { return sim::dtype_size(phys(t)); }

// Grid steps the block pipeline looks ahead of the current one for the blocks to copy in; an
// input's ring has up to one VMEM slot per block of those steps (and the current one), so the
// copies of every block in that window can be in flight before the first is waited for.
inline constexpr int kMaxLookahead = 24;
inline constexpr int kDeepestInputRing = kMaxLookahead + 1;

// Drops the copy of a store whose value's last operation can write the block itself.
void fold_store_copies(sim::Program& p);
// The program's instructions reordered so independent chains of operations overlap on the
// chip's units (lower_sim_pipeline.cpp); the program as it is when it cannot be reordered safely.
sim::Program schedule_kernel_program(const sim::Program& p, const sim::ChipConfig& cfg);

class SimLowerer final : public Lowerer {
 public:
  // depth: at most this many VMEM slots per input block (copies issued up to depth - 1 blocks ahead).
  // rotate: the steps' values in a ring over the VMEM left (consecutive steps share no bytes, so
  // the scheduler may overlap them), else every step's from the same base.
  SimLowerer(const KernelDef& k, KernelContext::State& s, const sim::ChipConfig& cfg, int depth, bool rotate)
      : k_(k), s_(s), cfg_(cfg), b_("kernel:" + k.name), sc_(&s.scalars, &s.scalar_shapes, &k.name), depth_(depth),
        rotate_(rotate),
        const_bottom_(static_cast<int64_t>(cfg.memory.vmem_bytes) / 64 * 64) {}

  sim::Program build();
  bool vmem_short() const { return vmem_short_; }
  size_t emitted() const { return b_.size(); }

  Value binary(BinOp op, const Value& a, const Value& b, const std::vector<int64_t>& shape, DType out) override;
  Value unary(UnOp op, const Value& a) override;
  Value where(const Value& c, const Value& a, const Value& b, const std::vector<int64_t>& shape) override;
  Value cast(const Value& a, DType t) override;
  Value reduce(RedOp op, const Value& a, int axis, const std::vector<int64_t>& shape, DType out) override;
  Value broadcast_to(const Value& a, const std::vector<int64_t>& shape) override;
  Value transpose(const Value& a) override;
  Value iota(const std::vector<int64_t>& shape, int axis, DType t) override;
  Value full(const std::vector<int64_t>& shape, double v, DType t) override;
  Value dot(const Value& a, const Value& b, DotOptions o, int64_t m, int64_t k, int64_t n) override;
  Value load(Ref::Kind kind, int index, double fill) override;
  void store(Ref::Kind kind, int index, const Value& v, const Value* mask) override;
  void copy_start(const Ref& src, const Ref& dst, int sem) override;
  void copy_wait(const Ref& src, const Ref& dst, int sem) override;

 private:
  struct InputState {
    struct Pending {
      int slot;
      Index index;
      double fill;
    };
    std::vector<int64_t> slot;  // the ring of VMEM slots of this input's blocks
    int cur = -1;               // the slot holding the block `index` (loaded with `fill`)
    Index index;
    double fill = 0;
    Value value;
    bool used = false;          // loaded by some step: prefetched for the next ones
    std::deque<Pending> pend;   // DMAs not waited for yet (in issue order, so in completion order)
    int next = 0;               // where the search for a free slot starts
  };
  struct OutputState {
    std::vector<int64_t> slot;  // a ring of slots: a block's write-back is waited for when its slot is reused
    int cur = 0;
    bool resident = false;
    std::vector<char> pending;
    BlockPlace place;
  };
  struct ScratchState {
    int64_t slot[2] = {-1, -1};
    int cur = 0;
    std::weak_ptr<Value::Impl> held[2];
    Value value;
  };

  int64_t alloc_persistent(int64_t bytes, const std::string& what);
  int64_t alloc(int64_t bytes);
  Value make(std::vector<int64_t> shape, DType t) {
    auto impl = std::make_shared<Value::Impl>();
    impl->vmem = alloc(std::max<int64_t>(1, numel_of(shape)) * psize(t));
    return Value(std::move(shape), t, std::move(impl));
  }
  static Value imm_value(DType t, double v) {
    auto impl = std::make_shared<Value::Impl>();
    impl->imm = true;
    impl->imm_value = round_to(t, v);
    return Value({}, t, std::move(impl));
  }
  // A column [r, 1] computed elementwise from columns of the same shape (and immediates) is the
  // same r contiguous elements as a row: its instructions run over it as a row [1, r] (r / lanes
  // vector registers instead of r / sublanes), the layout of a softmax's row statistics.
  Dims2 lane_dims(const std::vector<int64_t>& shape, std::initializer_list<const Value*> ops) const {
    const Dims2 d = dims2(shape, k_.name);
    if (shape.size() != 2 || d.cols != 1 || d.rows <= 1) return d;
    for (const Value* v : ops)
      if (v && !v->impl()->imm && v->shape() != shape) return d;
    return {1, d.rows};
  }
  // `v` as a source operand of an op over rows x cols (broadcast dims as zero strides); a
  // deferred value is emitted first (lower_sim_dot.cpp).
  sim::Operand src(const Value& v, Dims2 out);
  static sim::Operand dst(const Value& v) {
    return B::vmem(B::at(v.impl()->vmem), phys(v.dtype()), v.rank() == 2 ? v.shape()[1] : -1);
  }
  sim::Operand dst_at(int64_t addr, DType t, Dims2 d) const { return B::vmem(B::at(addr), phys(t), d.cols); }
  [[noreturn]] void unsupported(const std::string& what) const {
    fail("kernel '{}': {} is not lowered to the chip yet (run the kernel on the cpu, where the interpreter runs it)",
         k_.name, what);
  }
  void issue_load(size_t i, int slot, const BlockPlace& p, double fill);
  int free_input_slot(size_t i);
  void prefetch(std::span<const int64_t> g);
  std::vector<Index> steps_after(std::span<const int64_t> g) const;
  void look_ahead(size_t i, const std::vector<Index>& steps, Index last, size_t k, double fill, int max_new);
  void dma_block(bool to_hbm, int operand_reg, const BlockPlace& p, const TensorType& t, int64_t vmem, int sem,
                 int64_t vmem_cols = -1);
  void flush(size_t i);
  void begin_step(std::span<const int64_t> g);

  const KernelDef& k_;
  KernelContext::State& s_;
  const sim::ChipConfig& cfg_;
  B b_;
  bool vmem_short_ = false;  // an allocation did not fit VMEM (a shallower pipeline may)
  int64_t top_ = 0, temp_base_ = 0, temp_top_ = 0;
  std::vector<InputState> ins_;
  std::vector<OutputState> outs_;
  std::vector<ScratchState> scr_;
  Scalars sc_;
  int depth_ = 3;
  bool rotate_ = true;
  int64_t step_start_ = 0, largest_step_ = 0;  // where this step's values start; the most a step took
  // Constants of the program: values computed from iota and immediates only (masks, key and
  // query indices) are made once, at their first use, in a constant area at the top of VMEM
  // growing down (below which the buffers and the steps' values stay), and shared by every step
  // that computes the same thing. Each carries bounds of its elements, so a comparison whose
  // result is the same everywhere is known (a mask keeping every element: a where of it is its
  // first operand, no instruction).
  struct Constant {
    int id;
    double lo, hi;  // every element in [lo, hi]
  };
  int64_t const_bottom_;
  std::map<std::string, Value> const_memo_;
  std::map<const Value::Impl*, Constant> consts_;
  // A VMEM region for a constant, or -1 when it would not fit beside this step's values.
  int64_t alloc_constant(int64_t bytes);
  const Constant* constant(const Value& v) const {
    auto it = consts_.find(v.impl().get());
    return it == consts_.end() ? nullptr : &it->second;
  }
  // The key of an operation whose operands are all constants or immediates ("" if one is not).
  std::string const_key(const char* op, std::initializer_list<const Value*> operands, const std::vector<int64_t>& shape,
                        DType t) const;
  // The bounds of a constant or an immediate (an unbounded range for anything else).
  std::pair<double, double> bounds(const Value& v) const;
  // The result of a constant operation: a new constant (registered under `key` with bounds
  // [lo, hi]), or a value of this step when the constant area is full.
  Value make_result(const std::string& key, std::vector<int64_t> shape, DType t, double lo, double hi);
  void emit_iota(int64_t at, Dims2 d, bool along_rows);
  int operand_reg(const Ref& r) const {
    return r.kind() == Ref::Kind::input ? r.index() : static_cast<int>(s_.in_types.size()) + r.index();
  }
  int sem_reg(int sem) const { return static_cast<int>(s_.in_types.size() + s_.out_types.size()) + sem; }
  // A new value of scratch i in its other slot (a value still held there moved out first).
  int64_t next_scratch_slot(size_t i);

  // Deferred values (lower_sim_dot.cpp): a dot (with an addend: addend + dot) or a fill is
  // emitted when a value is read, so `acc.store(acc.load() + dot(x, w))` becomes MXU
  // accumulation into the scratch slot in place (across K steps and grid steps), with no
  // vector add and no copy, and a zero fill before it becomes the first K tile not accumulating.
  struct Deferred {
    std::weak_ptr<Value::Impl> result;  // the value the emission writes (at its vmem then)
    bool is_fill = false;
    double fill = 0;                    // fill: every element
    Value a, b, addend;                 // dot: a [m, k] (transposed already), b, optional addend [m, n] f32
    bool transpose_b = false;
    int64_t m = 0, k = 0, n = 0;
    static Deferred of_fill(std::shared_ptr<Value::Impl> r, double v) {
      Deferred d;
      d.result = std::move(r);
      d.is_fill = true;
      d.fill = v;
      return d;
    }
  };
  struct AccumulateStore {
    bool active = false;
    size_t scratch = 0;
    Value v;  // a deferred addend + dot whose addend is the scratch's current value
  };
  std::vector<Deferred> deferred_;
  AccumulateStore acc_store_;
  Deferred* deferred_of(const Value::Impl* impl);
  Value defer_fill(const std::vector<int64_t>& shape, double v, DType t);
  void materialize(const Value& v);
  void emit_dot(const Deferred& d, int64_t out, bool accumulate_first, sim::MxuMode mode, sim::DType out_t);
  std::optional<Value> fuse_dot_add(const Value& a, const Value& b, const std::vector<int64_t>& shape, DType out);
  bool defer_accumulate_store(size_t i, const Value& v);
  void settle();  // emits a deferred accumulating store (called before anything reads or writes VMEM values)
  void end_body();  // after a step's body: the store settled, deferred dots still referenced emitted
  // Moves a value out of a slot about to be overwritten (a deferred one just changes place).
  void move_out(Value::Impl& held, DType t, const std::vector<int64_t>& shape);
};

}  // namespace tpu::kernel::detail::chip_lowering
