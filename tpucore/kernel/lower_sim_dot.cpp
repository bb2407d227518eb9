// The chip lowering of dot and of its accumulation: a dot is deferred until its value is read,
// so that `addend + dot(a, b)` is one MXU product accumulating onto the addend, and storing that
// into the scratch buffer the addend was loaded from accumulates in the buffer's slot in place
// (the MXU result accumulates across K tiles and grid steps, as the library's matmul keeps its
// accumulator, with no vector add and no copy per step). A zero fill of the buffer is deferred
// as well, so the first product writes the slot instead of accumulating onto zeros. The dot
// tiles to the MXUs as the library's matmul does: column tiles of the array width, one per MXU,
// and fewer tiles than MXUs split the rows into groups of 8k, one per MXU.
#include "tpucore/kernel/lower_sim_impl.h"

namespace tpu::kernel::detail::chip_lowering {

namespace {

// The MXU mode of a dot of f32 / bf16 operands (f32 at the precision setting).
sim::MxuMode float_dot_mode(DType t) { return t == DType::bf16 ? sim::MxuMode::bf16 : codegen::f32_matmul_mode(); }

}  // namespace

SimLowerer::Deferred* SimLowerer::deferred_of(const Value::Impl* impl) {
  for (Deferred& d : deferred_)
    if (auto r = d.result.lock(); r && r.get() == impl) return &d;
  return nullptr;
}

Value SimLowerer::defer_fill(const std::vector<int64_t>& shape, double v, DType t) {
  Value r = make(shape, t);
  deferred_.push_back(Deferred::of_fill(r.impl(), round_to(t, v)));
  return r;
}

// Emits v's deferred fill or dot (its operands first) into v's vmem.
void SimLowerer::materialize(const Value& v) {
  if (!v.defined() || v.impl()->imm) return;
  auto it = std::find_if(deferred_.begin(), deferred_.end(), [&](const Deferred& d) {
    auto r = d.result.lock();
    return r && r.get() == v.impl().get();
  });
  if (it == deferred_.end()) return;
  const Deferred d = std::move(*it);
  deferred_.erase(it);
  const int64_t at = v.impl()->vmem;
  if (d.is_fill) {
    const Dims2 dd = lane_dims(v.shape(), {});
    b_.fill(dst_at(at, v.dtype(), dd), static_cast<float>(d.fill), dd.rows, dd.cols);
    return;
  }
  bool acc = false;
  if (d.addend.defined()) {
    const Deferred* z = deferred_of(d.addend.impl().get());
    if (!(z && z->is_fill && z->fill == 0.0)) {
      const Dims2 dd{d.m, d.n};
      b_.unary(Op::vmov, dst_at(at, DType::f32, dd), src(d.addend, dd), d.m, d.n);
      acc = true;
    }
  }
  emit_dot(d, at, acc, float_dot_mode(d.a.dtype()), sim::DType::f32);
}

// The product a [m, k] x b [k, n] (b [n, k] when transposed) into `out` [m, n] of dtype
// `out_t` (f32, or i32 for i8 operands) in MXU mode `mode`: column tile j of the array width on
// its own MXU; fewer tiles than MXUs split the rows in groups of 8k, one per MXU; each K tile of
// the array height loads its weights and multiplies, the first writing the result unless
// `accumulate_first`.
void SimLowerer::emit_dot(const Deferred& d, int64_t out, bool accumulate_first, sim::MxuMode mode, sim::DType out_t) {
  materialize(d.a);
  materialize(d.b);
  const Value &a = d.a, &b = d.b;
  const int64_t m = d.m, k = d.k, n = d.n;
  const sim::DType pt = phys(a.dtype());
  const int64_t es = sim::dtype_size(pt), os = sim::dtype_size(out_t);
  const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols;
  const int nm = std::max(1, cfg_.mxu.count);
  const int64_t A = a.impl()->vmem, W = b.impl()->vmem;
  const int64_t jt = (n + C - 1) / C, groups = jt < nm ? std::max<int64_t>(1, std::min(nm / jt, m / 8)) : 1;
  const int64_t grows = ((m + groups - 1) / groups + 7) / 8 * 8;
  for (int64_t jg = 0; jg < jt * groups; ++jg) {
    const int64_t j = jg / groups, r0 = (jg % groups) * grows, rl = std::min(grows, m - r0), nn = std::min(C, n - j * C);
    const int mxu = static_cast<int>(jg % nm);
    for (int64_t p = 0; p * R < k && rl > 0; ++p) {
      const int64_t kk = std::min(R, k - p * R);
      const sim::Operand w = d.transpose_b ? B::vmem(B::at(W + (j * C * k + p * R) * es), pt, 1, k)
                                           : B::vmem(B::at(W + (p * R * n + j * C) * es), pt, n);
      b_.mxu_load_weights(mxu, w, kk, nn, mode);
      b_.mxu_matmul(mxu, B::vmem(B::at(out + (r0 * n + j * C) * os), out_t, n),
                    B::vmem(B::at(A + (r0 * k + p * R) * es), pt, k), rl, kk, nn, accumulate_first || p > 0, mode);
    }
  }
}

Value SimLowerer::dot(const Value& a0, const Value& b, DotOptions o, int64_t m, int64_t k, int64_t n) {
  settle();
  const Value a = o.transpose_a ? transpose(a0) : a0;
  Deferred d;
  d.a = a;
  d.b = b;
  d.transpose_b = o.transpose_b;
  d.m = m;
  d.k = k;
  d.n = n;
  if (a.dtype() != DType::i8) {  // f32 / bf16: deferred until read or accumulated
    Value r = make({m, n}, DType::f32);
    d.result = r.impl();
    deferred_.push_back(std::move(d));
    return r;
  }
  // i8: i32 products on the MXU, then kept as f32 (exact to 2^24).
  Value r = make({m, n}, DType::i32);
  const int64_t out = alloc(m * n * 4);
  emit_dot(d, out, false, sim::MxuMode::i8, sim::DType::i32);
  b_.unary(Op::vcast, dst(r), B::vmem(B::at(out), sim::DType::i32, n), m, n);
  return r;
}

// addend + dot (either order) as one deferred MXU product accumulating onto the addend.
std::optional<Value> SimLowerer::fuse_dot_add(const Value& a, const Value& b, const std::vector<int64_t>& shape,
                                              DType out) {
  if (out != DType::f32 || shape.size() != 2 || a.impl()->imm || b.impl()->imm) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const Value& p = side == 0 ? b : a;
    const Value& addend = side == 0 ? a : b;
    const Deferred* d = deferred_of(p.impl().get());
    if (!d || d->is_fill || d->addend.defined() || addend.dtype() != DType::f32 || addend.shape() != shape ||
        p.shape() != shape)
      continue;
    Deferred fused = *d;
    fused.addend = addend;
    Value r = make(shape, DType::f32);
    fused.result = r.impl();
    deferred_.push_back(std::move(fused));
    return r;
  }
  return std::nullopt;
}

// A store of `addend + dot` into scratch i whose current value is the addend: settled (emitted)
// at the next operation, when the expression's temporaries are gone and the holders of the
// buffer's old value tell whether it may be overwritten in place.
bool SimLowerer::defer_accumulate_store(size_t i, const Value& v) {
  if (v.impl()->imm) return false;
  const Deferred* d = deferred_of(v.impl().get());
  ScratchState& sc = scr_[i];
  if (!d || d->is_fill || !d->addend.defined() || d->addend.impl() != sc.held[sc.cur].lock() ||
      sc.value.dtype() != DType::f32 || sc.value.shape() != v.shape())
    return false;
  acc_store_.active = true;
  acc_store_.scratch = i;
  acc_store_.v = v;
  return true;
}

void SimLowerer::settle() {
  if (!acc_store_.active) return;
  const size_t i = acc_store_.scratch;
  const Value v = std::move(acc_store_.v);
  acc_store_ = AccumulateStore();
  ScratchState& sc = scr_[i];
  Deferred* dp = deferred_of(v.impl().get());
  std::shared_ptr<Value::Impl> old = sc.held[sc.cur].lock();
  if (!dp || !old || dp->addend.impl() != old) {  // not the pattern any more: an ordinary store
    store(Ref::Kind::scratch, static_cast<int>(i), v, nullptr);
    return;
  }
  const Deferred d = *dp;
  std::erase_if(deferred_, [&](const Deferred& e) { return e.result.lock() == v.impl(); });
  // Holders of the old value: `old`, the buffer and the deferred sum's addend; any other one
  // (a value the body still uses) gets a copy before the slot is overwritten.
  const Deferred* f = deferred_of(old.get());
  const bool filled = f && f->is_fill;
  const double fv = filled ? f->fill : 0.0;
  if (old.use_count() > 3) move_out(*old, DType::f32, sc.value.shape());
  const int64_t slot = sc.slot[sc.cur];
  if (filled && fv != 0.0) b_.fill(dst_at(slot, DType::f32, {d.m, d.n}), static_cast<float>(fv), d.m, d.n);
  emit_dot(d, slot, !(filled && fv == 0.0), float_dot_mode(d.a.dtype()), sim::DType::f32);  // onto zeros: the first K tile writes the slot
  v.impl()->vmem = slot;
  sc.held[sc.cur] = v.impl();
  sc.value = Value(sc.value.shape(), DType::f32, v.impl());
}

void SimLowerer::end_body() {
  settle();
  for (size_t j = 0; j < deferred_.size();) {
    auto r = deferred_[j].result.lock();
    if (!r) {
      deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(j));
      continue;
    }
    if (deferred_[j].is_fill) {
      ++j;
      continue;
    }
    const Value v({deferred_[j].m, deferred_[j].n}, DType::f32, r);
    materialize(v);  // erases the entry (and may emit others before it)
    j = 0;
  }
}

void SimLowerer::move_out(Value::Impl& held, DType t, const std::vector<int64_t>& shape) {
  const Dims2 d = dims2(shape, k_.name);
  const int64_t moved = alloc(std::max<int64_t>(1, numel_of(shape)) * psize(t));
  if (!deferred_of(&held)) b_.unary(Op::vmov, dst_at(moved, t, d), dst_at(held.vmem, t, d), d.rows, d.cols);
  held.vmem = moved;
}


namespace {

struct FoldBytes {
  int64_t lo = 0, hi = 0;  // [lo, hi); known false: an address through a register (anywhere)
  bool known = true;
  bool overlaps(const FoldBytes& o) const { return !known || !o.known || (lo < o.hi && o.lo < hi); }
};

bool fold_no_regs(const sim::Addr& a) {
  return std::all_of(a.terms.begin(), a.terms.end(), [](const sim::AddrTerm& t) { return t.reg < 0; });
}

// The VMEM bytes an operand of `in` spans (empty when it is not a VMEM operand).
std::optional<FoldBytes> fold_range(const sim::Instr& in, const sim::Operand& o, sim::Role role) {
  if (o.kind != sim::Operand::Kind::mem || o.space != sim::Space::vmem) return std::nullopt;
  if (!fold_no_regs(o.addr)) return FoldBytes{0, 0, false};
  const auto sh = sim::operand_shape(in, role);
  if (sh[0] <= 0 || sh[1] <= 0) return std::nullopt;
  const int64_t es = sim::dtype_size(o.dtype), rs = o.row_stride < 0 ? sh[1] : o.row_stride;
  if (rs < 0 || o.col_stride < 0) return FoldBytes{0, 0, false};
  return FoldBytes{o.addr.offset, o.addr.offset + ((sh[0] - 1) * rs + (sh[1] - 1) * o.col_stride + 1) * es};
}

// The VMEM bytes `in` reads, appended to `out`.
void fold_reads(const sim::Instr& in, std::vector<FoldBytes>& out) {
  using sim::Format;
  const Format f = sim::op_info(in.op).format;
  auto add = [&](const sim::Operand& o, sim::Role r) {
    if (auto br = fold_range(in, o, r)) out.push_back(*br);
  };
  switch (f) {
    case Format::vbinary: add(in.a, sim::Role::a); add(in.b, sim::Role::b); break;
    case Format::vternary: add(in.a, sim::Role::a); add(in.b, sim::Role::b); add(in.c, sim::Role::c); break;
    case Format::vunary: case Format::xreduce: case Format::xtrans: case Format::mxu_lw: add(in.a, sim::Role::a); break;
    case Format::mxu_mm:
      add(in.a, sim::Role::a);
      if (in.acc) add(in.dst, sim::Role::dst);
      break;
    case Format::dma:
    case Format::sld:
      if (in.a.kind == sim::Operand::Kind::mem && in.a.space == sim::Space::vmem) {
        if (!fold_no_regs(in.a.addr)) {
          out.push_back({0, 0, false});
          break;
        }
        const int64_t rows = std::max<int64_t>(1, in.dma_shape[1]), bytes = std::max<int64_t>(4, in.dma_shape[2]);
        const int64_t rs = std::max(bytes, in.src_stride[1]), ps = std::max(rows * rs, in.src_stride[0]);
        out.push_back({in.a.addr.offset, in.a.addr.offset + std::max<int64_t>(1, in.dma_shape[0]) * ps});
      }
      break;
    default: break;
  }
}

}  // namespace

// A vector op writing a temporary that a copy then moves into a block (the store of a value
// into an output block: `out.store(relu(y))`) writes the block directly when nothing reads the
// temporary afterwards before it is wholly overwritten; the copy is dropped.
void fold_store_copies(sim::Program& p) {
  for (const sim::Instr& in : p.code)
    if (in.op == sim::Op::loop || in.op == sim::Op::loopr) return;  // straight-line programs only
  using sim::Format;
  std::vector<FoldBytes> reads;
  for (size_t i = 1; i < p.code.size(); ++i) {
    const sim::Instr& mv = p.code[i];
    sim::Instr& prev = p.code[i - 1];
    const Format pf = sim::op_info(prev.op).format;
    if (mv.op != sim::Op::vmov || !(pf == Format::vbinary || pf == Format::vternary || pf == Format::vunary)) continue;
    if (!(prev.dst == mv.a) || prev.rows != mv.rows || prev.cols != mv.cols) continue;
    const auto t = fold_range(prev, prev.dst, sim::Role::dst), d = fold_range(mv, mv.dst, sim::Role::dst);
    if (!t || !d || !t->known || !d->known || mv.a.col_stride != 1 || mv.dst.col_stride != 1) continue;
    reads.clear();
    fold_reads(prev, reads);
    if (std::any_of(reads.begin(), reads.end(), [&](const FoldBytes& r) { return r.overlaps(*d); })) continue;
    bool dead = true;
    for (size_t j = i + 1; j < p.code.size() && dead; ++j) {
      const sim::Instr& in = p.code[j];
      reads.clear();
      fold_reads(in, reads);
      if (std::any_of(reads.begin(), reads.end(), [&](const FoldBytes& r) { return r.overlaps(*t); })) dead = false;
      const Format f = sim::op_info(in.op).format;
      if (f == Format::vbinary || f == Format::vternary || f == Format::vunary || f == Format::vfill) {
        const auto w = fold_range(in, in.dst, sim::Role::dst);
        const bool dense = in.dst.col_stride == 1 && (in.dst.row_stride < 0 || in.dst.row_stride == in.cols);
        if (dead && w && w->known && dense && w->lo <= t->lo && w->hi >= t->hi) break;  // overwritten whole
      }
    }
    if (!dead) continue;
    prev.dst = mv.dst;
    p.code.erase(p.code.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
  }
  p.finalize();
}

}  // namespace tpu::kernel::detail::chip_lowering
