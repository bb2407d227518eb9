// Lowering of kernels to the simulated chip's programs: the body runs once per grid step at
// program-build time with a lowerer that emits instructions (the grid is unrolled statically),
// through the same ProgramBuilder, program cache and launch path the library's own kernels use.
// Values live in VMEM (f32, or bf16 for bf16 values); the blocks of inputs and outputs move by
// DMA through rings of VMEM slots (lower_sim_pipeline.cpp: input copies issued steps ahead,
// write-backs waited for when their slot is reused), scratch buffers
// alternate between two slots so a stored value never overwrites one still in use. dot tiles
// to the MXUs (column tiles spread over them), elementwise math runs on the VPU/EUP with
// broadcasts as zero strides, row and column reductions on the XLU. What is not lowered (values
// of rank above 2, i32 division and casts to i32, i32/bool operands) is a tpu::Error naming it.
#include "tpucore/kernel/lower_sim_impl.h"

#include <cmath>

namespace tpu::kernel::detail {
namespace chip_lowering {

namespace {

// Bounds of `a op b` for operands within ba and bb (unbounded where they are not known, or the
// result is rounded to bf16).
std::pair<double, double> kernel_lowering_bin_bounds(BinOp op, std::pair<double, double> ba, std::pair<double, double> bb,
                                                     DType out) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const std::pair<double, double> any{-inf, inf}, mask{0.0, 1.0}, yes{1.0, 1.0}, no{0.0, 0.0};
  const auto [alo, ahi] = ba;
  const auto [blo, bhi] = bb;
  const bool finite = std::isfinite(alo) && std::isfinite(ahi) && std::isfinite(blo) && std::isfinite(bhi);
  switch (op) {
    case BinOp::lt: return ahi < blo ? yes : alo >= bhi ? no : mask;
    case BinOp::le: return ahi <= blo ? yes : alo > bhi ? no : mask;
    case BinOp::gt: return alo > bhi ? yes : ahi <= blo ? no : mask;
    case BinOp::ge: return alo >= bhi ? yes : ahi < blo ? no : mask;
    case BinOp::eq: return alo == ahi && blo == bhi && alo == blo ? yes : ahi < blo || bhi < alo ? no : mask;
    case BinOp::ne: return alo == ahi && blo == bhi && alo == blo ? no : ahi < blo || bhi < alo ? yes : mask;
    case BinOp::land: return ba == yes && bb == yes ? yes : ba == no || bb == no ? no : mask;
    default: break;
  }
  if (!finite || out == DType::bf16) return any;
  switch (op) {
    case BinOp::add: return {alo + blo, ahi + bhi};
    case BinOp::sub: return {alo - bhi, ahi - blo};
    case BinOp::max: return {std::max(alo, blo), std::max(ahi, bhi)};
    case BinOp::min: return {std::min(alo, blo), std::min(ahi, bhi)};
    case BinOp::mul: {
      const double p[] = {alo * blo, alo * bhi, ahi * blo, ahi * bhi};
      return {*std::min_element(p, p + 4), *std::max_element(p, p + 4)};
    }
    default: return any;
  }
}

}  // namespace

int64_t SimLowerer::alloc_persistent(int64_t bytes, const std::string& what) {
  const int64_t at = (top_ + 63) / 64 * 64;
  vmem_short_ = at + bytes > static_cast<int64_t>(cfg_.memory.vmem_bytes);
  TPU_CHECK(at + bytes <= static_cast<int64_t>(cfg_.memory.vmem_bytes),
            "kernel '{}': {} does not fit the chip's {} bytes of VMEM on this device (its blocks need {} bytes)",
            k_.name, what, cfg_.memory.vmem_bytes, at + bytes);
  top_ = at + bytes;
  return at;
}

int64_t SimLowerer::alloc(int64_t bytes) {
  const int64_t at = (temp_top_ + 63) / 64 * 64;
  vmem_short_ = at + bytes > const_bottom_;
  TPU_CHECK(at + bytes <= const_bottom_,
            "kernel '{}': the values of grid step {} need more than the chip's {} bytes of VMEM", k_.name,
            shape_str(s_.grid_index), cfg_.memory.vmem_bytes);
  temp_top_ = at + bytes;
  return at;
}

sim::Operand SimLowerer::src(const Value& v, Dims2 out) {
  if (v.impl()->imm) return B::imm(static_cast<float>(v.impl()->imm_value));
  settle();
  materialize(v);
  if (v.dtype() == DType::i8) unsupported("an i8 value other than a dot operand");
  const Dims2 d = dims2(v.shape(), k_.name);
  if (v.rank() == 2 && d.cols == 1 && d.rows > 1 && out.rows == 1 && out.cols == d.rows)  // a column run as a row
    return B::vmem(B::at(v.impl()->vmem), phys(v.dtype()), d.rows, 1);
  const int64_t rs = d.rows == 1 && out.rows > 1 ? 0 : d.cols;
  const int64_t cs = d.cols == 1 && out.cols > 1 ? 0 : 1;
  return B::vmem(B::at(v.impl()->vmem), phys(v.dtype()), rs, cs);
}


void SimLowerer::store(Ref::Kind kind, int index, const Value& v, const Value* mask) {
  settle();
  const size_t i = static_cast<size_t>(index);
  if (kind == Ref::Kind::output) {
    OutputState& o = outs_[i];
    const DType t = s_.out_types[i].dtype;
    const Dims2 d = dims2(o.place.block, k_.name);
    const sim::Operand slot = dst_at(o.slot[o.cur], t, d);
    if (mask) b_.ternary(Op::vsel, slot, src(*mask, d), src(v, d), slot, d.rows, d.cols);
    else b_.unary(Op::vmov, slot, src(v, d), d.rows, d.cols);
    return;
  }
  if (!mask && defer_accumulate_store(i, v)) return;
  ScratchState& sc = scr_[i];
  const Value old = sc.value;
  if (!mask && !v.impl()->imm) {
    if (const Deferred* f = deferred_of(v.impl().get()); f && f->is_fill && v.shape() == old.shape()) {
      const double fv = f->fill;  // the scratch's new value is the same fill, deferred too
      next_scratch_slot(i);
      deferred_.push_back(Deferred::of_fill(scr_[i].value.impl(), round_to(old.dtype(), fv)));
      return;
    }
  }
  const Dims2 d = lane_dims(old.shape(), {&v, mask});
  const sim::Operand out = dst_at(next_scratch_slot(i), old.dtype(), d);
  if (mask) b_.ternary(Op::vsel, out, src(*mask, d), src(v, d), src(old, d), d.rows, d.cols);
  else b_.unary(Op::vmov, out, src(v, d), d.rows, d.cols);
}

int64_t SimLowerer::next_scratch_slot(size_t i) {
  ScratchState& sc = scr_[i];
  const DType t = sc.value.dtype();
  const std::vector<int64_t> shape = sc.value.shape();
  const Dims2 d = dims2(shape, k_.name);
  const int target = 1 - sc.cur;
  (void)d;
  if (auto held = sc.held[target].lock()) move_out(*held, t, shape);  // a value still in use lives there
  auto impl = std::make_shared<Value::Impl>();
  impl->vmem = sc.slot[target];
  sc.held[target] = impl;
  sc.value = Value(shape, t, std::move(impl));
  sc.cur = target;
  return sc.slot[target];
}

// An async copy: one DMA between the window and the scratch buffer's slot, on the copy's
// semaphore; a copy into scratch fills its other slot (values loaded before stay valid).
void SimLowerer::copy_start(const Ref& src, const Ref& dst, int sem) {
  settle();
  const bool in_copy = dst.kind() == Ref::Kind::scratch;
  const Ref& win = in_copy ? src : dst;
  const TensorType& t = win.kind() == Ref::Kind::input ? s_.in_types[static_cast<size_t>(win.index())]
                                                       : s_.out_types[static_cast<size_t>(win.index())];
  const Ref& buf = in_copy ? dst : src;
  const size_t j = static_cast<size_t>(buf.index());
  materialize(scr_[j].value);  // a deferred fill of the buffer is in its slot before the DMA
  if (!buf.is_window()) {
    const int64_t at = in_copy ? next_scratch_slot(j) : scr_[j].slot[scr_[j].cur];
    dma_block(!in_copy, operand_reg(win), window_place(win, t.shape), t, at, sem_reg(sem));
    return;
  }
  // A window of the buffer: its current slot, the rest kept (a value loaded from it before moves out).
  ScratchState& sc = scr_[j];
  const std::vector<int64_t> shape = sc.value.shape();
  const DType dt = sc.value.dtype();
  const Dims2 d = dims2(shape, k_.name);
  if (in_copy) {
    if (auto held = sc.held[sc.cur].lock(); held && held.use_count() > 2) move_out(*held, dt, shape);
    auto impl = std::make_shared<Value::Impl>();
    impl->vmem = sc.slot[sc.cur];
    sc.held[sc.cur] = impl;
    sc.value = Value(shape, dt, std::move(impl));
  }
  const BlockPlace wp = window_place(buf, Shape(shape));
  int64_t off = 0;
  for (size_t a = 0; a < wp.start.size(); ++a) off += wp.start[a] * (a + 1 < wp.start.size() ? d.cols : 1);
  dma_block(!in_copy, operand_reg(win), window_place(win, t.shape), t, sc.slot[sc.cur] + off * psize(dt), sem_reg(sem), d.cols);
}

void SimLowerer::copy_wait(const Ref&, const Ref&, int sem) { b_.wait(sem_reg(sem)); }

Value SimLowerer::binary(BinOp op, const Value& a, const Value& b, const std::vector<int64_t>& shape, DType out) {
  if (op == BinOp::add)
    if (auto fused = fuse_dot_add(a, b, shape, out)) return *fused;
  if (a.impl()->imm && b.impl()->imm && shape.empty()) {
    const double x = a.impl()->imm_value, y = b.impl()->imm_value;
    double r = 0;
    switch (op) {
      case BinOp::add: r = x + y; break;
      case BinOp::sub: r = x - y; break;
      case BinOp::mul: r = x * y; break;
      case BinOp::div: r = x / y; break;
      case BinOp::max: r = std::max(x, y); break;
      case BinOp::min: r = std::min(x, y); break;
      case BinOp::lt: r = x < y; break;
      case BinOp::le: r = x <= y; break;
      case BinOp::gt: r = x > y; break;
      case BinOp::ge: r = x >= y; break;
      case BinOp::eq: r = x == y; break;
      case BinOp::ne: r = x != y; break;
      case BinOp::land: r = x != 0 && y != 0; break;
    }
    return imm_value(out, r);
  }
  if (op == BinOp::div && a.dtype() == DType::i32) unsupported("division of i32 values");
  const Dims2 d = lane_dims(shape, {&a, &b});
  const auto ba = bounds(a), bb = bounds(b);
  if (op == BinOp::land) {  // with a mask known to keep everything: the other mask
    if (ba == std::pair{1.0, 1.0} && b.shape() == shape && !b.impl()->imm) return b;
    if (bb == std::pair{1.0, 1.0} && a.shape() == shape && !a.impl()->imm) return a;
  }
  const std::string key = const_key("binary", {&a, &b}, shape, out);
  if (auto it = const_memo_.find(key); !key.empty() && it != const_memo_.end()) return Value(shape, out, it->second.impl());
  const auto [lo, hi] = kernel_lowering_bin_bounds(op, ba, bb, out);
  if (!key.empty() && lo == hi) {  // the same everywhere: a fill
    Value r = make_result(key, shape, out, lo, hi);
    b_.fill(dst_at(r.impl()->vmem, out, d), static_cast<float>(lo), d.rows, d.cols);
    return r;
  }
  Value r = key.empty() ? make(shape, out) : make_result(key, shape, out, lo, hi);
  const sim::Operand o = dst_at(r.impl()->vmem, out, d), x = src(a, d), y = src(b, d);
  switch (op) {
    case BinOp::add: b_.binary(Op::vadd, o, x, y, d.rows, d.cols); break;
    case BinOp::sub: b_.binary(Op::vsub, o, x, y, d.rows, d.cols); break;
    case BinOp::mul: case BinOp::land: b_.binary(Op::vmul, o, x, y, d.rows, d.cols); break;
    case BinOp::div: b_.binary(Op::vdiv, o, x, y, d.rows, d.cols); break;
    case BinOp::max: b_.binary(Op::vmax, o, x, y, d.rows, d.cols); break;
    case BinOp::min: b_.binary(Op::vmin, o, x, y, d.rows, d.cols); break;
    case BinOp::lt: b_.binary(Op::vcmplt, o, x, y, d.rows, d.cols); break;
    case BinOp::le: b_.binary(Op::vcmple, o, x, y, d.rows, d.cols); break;
    case BinOp::gt: b_.binary(Op::vcmplt, o, y, x, d.rows, d.cols); break;
    case BinOp::ge: b_.binary(Op::vcmple, o, y, x, d.rows, d.cols); break;
    case BinOp::eq: b_.binary(Op::vcmpeq, o, x, y, d.rows, d.cols); break;
    case BinOp::ne:
      b_.binary(Op::vcmpeq, o, x, y, d.rows, d.cols);
      b_.binary(Op::vsub, o, B::imm(1.0f), o, d.rows, d.cols);
      break;
  }
  return r;
}

Value SimLowerer::unary(UnOp op, const Value& a) {
  if (a.impl()->imm) unsupported("a math function of a scalar constant");
  const Dims2 d = lane_dims(a.shape(), {&a});
  Value r = make(a.shape(), a.dtype());
  const sim::Operand o = dst(r), x = src(a, d);
  auto un = [&](Op code) { b_.unary(code, o, x, d.rows, d.cols); };
  switch (op) {
    case UnOp::neg: un(Op::vneg); break;
    case UnOp::abs: un(Op::vabs); break;
    case UnOp::relu: b_.binary(Op::vmax, o, x, B::imm(0.0f), d.rows, d.cols); break;
    case UnOp::exp: un(Op::vexp); break;
    case UnOp::log: un(Op::vlog); break;
    case UnOp::sqrt: un(Op::vsqrt); break;
    case UnOp::rsqrt: un(Op::vrsqrt); break;
    case UnOp::tanh: un(Op::vtanh); break;
    case UnOp::recip: un(Op::vrecip); break;
    case UnOp::sigmoid: {  // 1 / (1 + exp(-x)), the intermediate in f32
      const int64_t t = alloc(d.rows * d.cols * 4);
      const sim::Operand tf = B::vmem(B::at(t), sim::DType::f32, d.cols);
      b_.unary(Op::vneg, tf, x, d.rows, d.cols);
      b_.unary(Op::vexp, tf, tf, d.rows, d.cols);
      b_.binary(Op::vadd, tf, tf, B::imm(1.0f), d.rows, d.cols);
      b_.unary(Op::vrecip, o, tf, d.rows, d.cols);
      break;
    }
  }
  return r;
}

Value SimLowerer::where(const Value& c, const Value& a, const Value& b, const std::vector<int64_t>& shape) {
  const Dims2 d = lane_dims(shape, {&c, &a, &b});
  const auto bc = bounds(c);
  const bool all = bc.first > 0 || bc.second < 0, none = bc == std::pair{0.0, 0.0};
  if (all && a.shape() == shape && !a.impl()->imm) return a;  // a mask known to keep (or drop) everything
  if (none && b.shape() == shape && !b.impl()->imm) return b;
  const std::string key = const_key("where", {&c, &a, &b}, shape, a.dtype());
  if (auto it = const_memo_.find(key); !key.empty() && it != const_memo_.end()) return Value(shape, a.dtype(), it->second.impl());
  const auto ra = bounds(a), rb = bounds(b);
  Value r = key.empty() ? make(shape, a.dtype())
                        : make_result(key, shape, a.dtype(), std::min(ra.first, rb.first), std::max(ra.second, rb.second));
  b_.ternary(Op::vsel, dst_at(r.impl()->vmem, a.dtype(), d), src(c, d), src(a, d), src(b, d), d.rows, d.cols);
  return r;
}

Value SimLowerer::cast(const Value& a, DType t) {
  if (a.impl()->imm) return imm_value(t, a.impl()->imm_value);
  if (t == DType::i32 && a.dtype() != DType::i32 && a.dtype() != DType::boolean) unsupported("a cast to i32");
  const Dims2 d = dims2(a.shape(), k_.name);
  if (t == DType::boolean && a.dtype() != DType::boolean) {
    return binary(BinOp::ne, a, imm_value(a.dtype(), 0.0), a.shape(), DType::boolean);
  }
  if (phys(t) == phys(a.dtype())) return Value(a.shape(), t, a.impl());  // same storage (i32/bool are exact f32)
  Value r = make(a.shape(), t);
  b_.unary(Op::vcast, dst(r), src(a, d), d.rows, d.cols);
  return r;
}

Value SimLowerer::reduce(RedOp op, const Value& a, int axis, const std::vector<int64_t>& shape, DType out) {
  const Dims2 d = dims2(a.shape(), k_.name);
  const int ax2 = a.rank() == 2 ? axis : 1;  // a rank-1 value is one row
  Value r = make(shape, out);
  const sim::Operand o = B::vmem(B::at(r.impl()->vmem), phys(out), ax2 == 1 ? 1 : d.cols);
  sim::Operand x = src(a, d);
  if (op == RedOp::min) {  // min = -max(-x)
    const int64_t t = alloc(d.rows * d.cols * 4);
    const sim::Operand tf = B::vmem(B::at(t), sim::DType::f32, d.cols);
    b_.unary(Op::vneg, tf, x, d.rows, d.cols);
    b_.reduce(Op::xmax, o, tf, d.rows, d.cols, ax2);
    b_.unary(Op::vneg, o, o, ax2 == 1 ? d.rows : 1, ax2 == 1 ? 1 : d.cols);
    return r;
  }
  b_.reduce(op == RedOp::sum ? Op::xsum : Op::xmax, o, x, d.rows, d.cols, ax2);
  return r;
}

Value SimLowerer::broadcast_to(const Value& a, const std::vector<int64_t>& shape) {
  const Dims2 d = dims2(shape, k_.name);
  const std::string key = const_key("broadcast", {&a}, shape, a.dtype());
  if (auto it = const_memo_.find(key); !key.empty() && it != const_memo_.end()) return Value(shape, a.dtype(), it->second.impl());
  const auto ra = bounds(a);
  Value r = key.empty() ? make(shape, a.dtype()) : make_result(key, shape, a.dtype(), ra.first, ra.second);
  if (a.impl()->imm) b_.fill(dst(r), static_cast<float>(a.impl()->imm_value), d.rows, d.cols);
  else b_.unary(Op::vmov, dst(r), src(a, d), d.rows, d.cols);
  return r;
}

Value SimLowerer::transpose(const Value& a) {
  const Dims2 d = dims2(a.shape(), k_.name);
  Value r = make({d.cols, d.rows}, a.dtype());
  b_.transpose(dst(r), src(a, d), d.rows, d.cols);
  return r;
}

// iota is a constant of the program: made once (at its first use) in the constant area and
// shared by every step that asks for the same shape and axis. Its index vector takes a fill and
// log2(n) adds (each doubling the part made), then one broadcasting copy fills the other rows
// or columns.
void SimLowerer::emit_iota(int64_t at, Dims2 d, bool along_rows) {
  const int64_t n = along_rows ? d.rows : d.cols, step = along_rows ? d.cols * 4 : 4;
  auto f32_at = [&](int64_t addr, int64_t rs = -1, int64_t cs = 1) {
    return B::vmem(B::at(addr), sim::DType::f32, rs < 0 ? d.cols : rs, cs);
  };
  b_.fill(f32_at(at), 0.0f, 1, 1);
  for (int64_t k = 1; k < n; k *= 2) {  // elements [k, k + len) = elements [0, len) + k
    const int64_t len = std::min(k, n - k);
    b_.binary(Op::vadd, f32_at(at + k * step), f32_at(at), B::imm(static_cast<float>(k)), along_rows ? len : 1,
              along_rows ? 1 : len);
  }
  if (along_rows && d.cols > 1) b_.unary(Op::vmov, f32_at(at + 4), f32_at(at, d.cols, 0), d.rows, d.cols - 1);
  if (!along_rows && d.rows > 1) b_.unary(Op::vmov, f32_at(at + d.cols * 4), f32_at(at, 0, 1), d.rows - 1, d.cols);
}

int64_t SimLowerer::alloc_constant(int64_t bytes) {
  const int64_t at = (const_bottom_ - bytes) / 64 * 64;
  // At most a quarter of VMEM for constants, never over this step's values.
  if (at < (temp_top_ + 63) / 64 * 64 || at < static_cast<int64_t>(cfg_.memory.vmem_bytes) / 4 * 3) return -1;
  const_bottom_ = at;
  return at;
}

std::string SimLowerer::const_key(const char* op, std::initializer_list<const Value*> operands,
                                  const std::vector<int64_t>& shape, DType t) const {
  std::string key = fmt::format("{} {} {}", op, shape_str(shape), dtype_name(t));
  bool any_constant = false;
  for (const Value* v : operands) {
    if (v->impl()->imm) {
      key += fmt::format(" #{}", v->impl()->imm_value);
    } else if (const Constant* c = constant(*v)) {
      key += fmt::format(" c{}{}", c->id, shape_str(v->shape()));
      any_constant = true;
    } else {
      return {};
    }
  }
  return any_constant ? key : std::string{};
}

std::pair<double, double> SimLowerer::bounds(const Value& v) const {
  if (v.impl()->imm) return {v.impl()->imm_value, v.impl()->imm_value};
  if (const Constant* c = constant(v)) return {c->lo, c->hi};
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {-inf, inf};
}

Value SimLowerer::make_result(const std::string& key, std::vector<int64_t> shape, DType t, double lo, double hi) {
  const int64_t at = alloc_constant(std::max<int64_t>(1, numel_of(shape)) * psize(t));
  if (at < 0) return make(std::move(shape), t);  // no room left for constants: a value of this step
  auto impl = std::make_shared<Value::Impl>();
  impl->vmem = at;
  consts_[impl.get()] = {static_cast<int>(consts_.size()), lo, hi};
  Value v(std::move(shape), t, std::move(impl));
  const_memo_.emplace(key, v);
  return v;
}

Value SimLowerer::iota(const std::vector<int64_t>& shape, int axis, DType t) {
  const Dims2 d = dims2(shape, k_.name);
  const bool along_rows = shape.size() == 2 && axis == 0;
  const int64_t n = along_rows ? d.rows : d.cols;
  TPU_CHECK(n <= (1 << 24), "kernel '{}': iota over {} elements is not lowered (at most 2^24, exact in f32)", k_.name, n);
  TPU_CHECK(phys(t) == sim::DType::f32, "kernel '{}': iota of dtype {} is not lowered", k_.name, dtype_name(t));
  const std::string key = fmt::format("iota {}x{} {}", d.rows, d.cols, along_rows ? 0 : 1);
  if (auto it = const_memo_.find(key); it != const_memo_.end()) return Value(shape, t, it->second.impl());
  Value r = make_result(key, shape, t, 0, static_cast<double>(std::max<int64_t>(0, n - 1)));
  emit_iota(r.impl()->vmem, d, along_rows);
  return r;
}

Value SimLowerer::full(const std::vector<int64_t>& shape, double v, DType t) {
  if (shape.empty()) return imm_value(t, v);
  (void)dims2(shape, k_.name);
  return defer_fill(shape, v, t);  // emitted where it is read (a store into scratch stays deferred)
}

sim::Program SimLowerer::build() {
  const size_t ni = s_.in_types.size(), no = s_.out_types.size();
  TPU_CHECK(static_cast<int>(ni + no) <= cfg_.scalar.registers && sem_reg(k_.num_semaphores) <= cfg_.scalar.semaphores,
            "kernel '{}': {} operands and {} semaphores are more than the chip's {} registers / {} semaphores", k_.name,
            ni + no, k_.num_semaphores, cfg_.scalar.registers, cfg_.scalar.semaphores);
  auto check_dtype = [&](const TensorType& t, const std::string& who) {
    if (t.dtype != DType::f32 && t.dtype != DType::bf16 && (t.dtype != DType::i8 || who.rfind("input", 0) != 0))
      unsupported(fmt::format("{} of dtype {}", who, dtype_name(t.dtype)));
  };
  ins_.resize(ni);
  outs_.resize(no);
  scr_.resize(k_.scratch.size());
  // The ring depth of input and output blocks: as deep as depth_ allows while the buffers take
  // at most half of VMEM (the rest for the steps' values) and the kernel's VMEM budget, at
  // least two slots (the budget's double buffering, checked when the kernel is validated).
  int64_t ring_bytes = 0, fixed_bytes = 0;
  auto block_bytes = [&](const BlockSpec& spec, const TensorType& t, const std::string& who) {
    return (std::max<int64_t>(1, numel_of(block_shape_of(k_, spec, t, who))) * psize(t.dtype) + 63) / 64 * 64;
  };
  for (size_t i = 0; i < ni; ++i)
    if (!is_any(k_.in_specs[i])) ring_bytes += block_bytes(k_.in_specs[i], s_.in_types[i], spec_name(k_.in_specs[i], "input", i));
  for (size_t i = 0; i < no; ++i)
    if (!is_any(k_.out_specs[i])) ring_bytes += block_bytes(k_.out_specs[i], s_.out_types[i], spec_name(k_.out_specs[i], "output", i));
  for (const ScratchSpec& sc : k_.scratch) fixed_bytes += 2 * ((numel_of(sc.shape) * psize(sc.dtype) + 63) / 64 * 64);
  if (ring_bytes > 0) {
    const int64_t budget = k_.vmem_budget_bytes > 0 ? k_.vmem_budget_bytes : kDefaultVmemBudget;
    const int64_t fit = (std::min(static_cast<int64_t>(cfg_.memory.vmem_bytes) / 2, budget) - fixed_bytes) / ring_bytes;
    depth_ = static_cast<int>(std::clamp<int64_t>(fit, 2, depth_));
  }
  for (size_t i = 0; i < ni; ++i) {
    const std::string who = spec_name(k_.in_specs[i], "input", i);
    check_dtype(s_.in_types[i], who);
    if (is_any(k_.in_specs[i])) continue;
    const auto bs = block_shape_of(k_, k_.in_specs[i], s_.in_types[i], who);
    (void)dims2(bs, k_.name);
    ins_[i].slot.resize(static_cast<size_t>(depth_));
    for (int64_t& slot : ins_[i].slot) slot = alloc_persistent(std::max<int64_t>(1, numel_of(bs)) * psize(s_.in_types[i].dtype), who);
  }
  for (size_t i = 0; i < no; ++i) {
    const std::string who = spec_name(k_.out_specs[i], "output", i);
    check_dtype(s_.out_types[i], who);
    if (is_any(k_.out_specs[i])) continue;
    const auto bs = block_shape_of(k_, k_.out_specs[i], s_.out_types[i], who);
    (void)dims2(bs, k_.name);
    outs_[i].slot.resize(static_cast<size_t>(depth_));
    outs_[i].pending.assign(static_cast<size_t>(depth_), 0);
    for (int64_t& slot : outs_[i].slot) slot = alloc_persistent(std::max<int64_t>(1, numel_of(bs)) * psize(s_.out_types[i].dtype), who);
  }
  for (size_t i = 0; i < k_.scratch.size(); ++i) {
    const ScratchSpec& sc = k_.scratch[i];
    if (sc.dtype == DType::i8) unsupported("an i8 scratch buffer");
    const Dims2 d = dims2(sc.shape, k_.name);
    for (int64_t& slot : scr_[i].slot) slot = alloc_persistent(numel_of(sc.shape) * psize(sc.dtype), "scratch");
    (void)d;
    auto impl = std::make_shared<Value::Impl>();
    impl->vmem = scr_[i].slot[0];
    scr_[i].held[0] = impl;
    deferred_.push_back(Deferred::of_fill(impl, 0.0));  // zeros, emitted where first read
    scr_[i].value = Value(sc.shape, sc.dtype, std::move(impl));
    // The front half reads the buffer's shape and dtype here (a placeholder: holding the slot's
    // value would keep it alive and force a copy out of the slot at every other store).
    s_.scratch.push_back(Value(sc.shape, sc.dtype, std::make_shared<Value::Impl>()));
  }
  temp_base_ = temp_top_ = step_start_ = (top_ + 63) / 64 * 64;
  int64_t steps = 1;
  for (int64_t g : k_.grid) steps *= g;
  TPU_CHECK(steps <= 65536, "kernel '{}': a grid of {} steps is more than the chip lowering unrolls (65536)", k_.name, steps);
  KernelContext ctx(&s_);
  LowererScope scope(this);
  for_each_grid_index(k_.grid, [&](std::span<const int64_t> g) {
    begin_step(g);
    k_.body(ctx);
    end_body();
    prefetch(g);
  });
  end_copies(s_);
  for (size_t i = 0; i < ni; ++i)
    if (!ins_[i].pend.empty()) b_.wait(static_cast<int>(i), static_cast<int64_t>(ins_[i].pend.size()));
  for (size_t i = 0; i < no; ++i) {
    flush(i);
    const int64_t pending = std::count(outs_[i].pending.begin(), outs_[i].pending.end(), 1);
    if (pending) b_.wait(static_cast<int>(ni + i), pending);
  }
  b_.fence();
  sim::Program p = b_.finish();
  fold_store_copies(p);
  return schedule_kernel_program(p, cfg_);
}

}  // namespace chip_lowering

using chip_lowering::SimLowerer;


sim::Program lower_to_chip(const KernelDef& k, std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                           const sim::ChipConfig& cfg, std::span<const Tensor> scalars, bool check_copies) {
  // Up to kDeepestInputRing slots per block where half of VMEM holds them, the steps'
  // values in a ring; if they then do not fit, every step's values from the same base; then two
  // slots per block.
  for (int attempt = 0;; ++attempt) {
    const int depth = attempt < 2 ? chip_lowering::kDeepestInputRing : 2;
    KernelContext::State s;
    s.def = &k;
    s.check_copies = check_copies;
    const size_t nsp = static_cast<size_t>(std::max(0, k.num_scalar_prefetch));
    TPU_CHECK(scalars.size() == nsp && nsp <= inputs.size(), "kernel '{}': {} scalar-prefetch array(s) given for {}",
              k.name, scalars.size(), k.num_scalar_prefetch);
    read_scalars(s, scalars);
    const Scalars sc(&s.scalars, &s.scalar_shapes, &k.name);
    validate_with(k, inputs, outputs, &sc);
    s.in_types.assign(inputs.begin() + static_cast<std::ptrdiff_t>(nsp), inputs.end());
    s.out_types.assign(outputs.begin(), outputs.end());
    s.in_place.resize(s.in_types.size());
    s.out_place.resize(outputs.size());
    begin_copies(s);
    SimLowerer l(k, s, cfg, depth, attempt == 0);
    s.lower = &l;
    try {
      return l.build();
    } catch (const Error&) {
      if (attempt >= 2 || !l.vmem_short()) throw;
    }
  }
}

}  // namespace tpu::kernel::detail
