// The chip program of kv_cache_attention (cached_attention.h): decode attention over the live
// part of a KV cache, the number of live key steps in a scalar register (loopr) and the live
// length read from HBM.
#include "codegen/cached_attention.h"

#include <algorithm>

#include <fmt/format.h>

#include "codegen/elementwise_kernel.h"
#include "codegen/tile_loops.h"
#include "sim/builder.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using B = sim::ProgramBuilder;
using sim::DType;
using sim::Op;

namespace {

constexpr float kMasked = -1e30f;  // finite: exp underflows to 0, no inf - inf
constexpr int kSemQ = 0, kSemK = 1, kSemV = 2, kSemM = 3, kSemO = 4, kSemP = 5;
enum Reg : int {
  rQ = 0, rK, rV, rOut, rMask, rSteps, rPos,
  rB, rStep, rPar, rNext, rNextPar, rStepsM1, rPrev, rW, rNB, rQPar, rNQ
};

// A unit is one batch row: its H query heads are H rows (the group of each KV head together),
// a step brings tk keys and values of every KV head.
struct Layout {
  int64_t rows = 0, tk = 0, kv_step = 0, head_step = 0, qbytes = 0;
  int64_t q = 0, k = 0, v = 0, mask_in = 0, s = 0, mk = 0, o = 0, obuf = 0;
  int64_t m = 0, mnew = 0, l = 0, alpha = 0, negm = 0, rsum = 0, thr = 0, thrw = 0, col = 0, fold = 0, posw = 0, posf = 0;
  int64_t total = 0;
};

Layout plan(const sim::ChipConfig& cfg, const CachedAttentionSpec& s, int64_t tk) {
  Layout p;
  const int64_t es = sim::dtype_size(s.dtype), d = s.head_dim;
  p.rows = s.heads;
  p.tk = tk;
  p.head_step = tk * d * es;
  p.kv_step = align64(s.kv_heads * p.head_step);
  p.qbytes = align64(s.heads * d * es);
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  p.q = take(2 * p.qbytes);   // two buffers (this unit's, the next one's), qbytes apart
  p.k = take(2 * p.kv_step);  // two buffers, kv_step apart
  p.v = take(2 * p.kv_step);
  p.mask_in = take(2 * align64(tk));
  p.s = take(p.rows * tk * 4);
  p.mk = take(p.rows * tk * 4);
  p.o = take(p.rows * d * 4);
  p.obuf = take(p.rows * d * es);
  for (int64_t* v : {&p.m, &p.mnew, &p.l, &p.alpha, &p.negm, &p.rsum, &p.thr, &p.thrw}) *v = take(p.rows * 4);
  p.col = take(tk * 4);
  p.fold = take(p.rows * cfg.vpu.lanes * 4);
  p.posw = take(4);
  p.posf = take(4);
  p.total = at;
  return p;
}

class Emitter {
 public:
  Emitter(const sim::ChipConfig& cfg, const CachedAttentionSpec& s)
      : cfg_(cfg), s_(s), L_(plan(cfg, s, s.tk)), b_("cached_attention"), es_(sim::dtype_size(s.dtype)),
        d_(s.head_dim), g_(s.heads / s.kv_heads) {}

  sim::Program run() {
    // Unit 0's queries and first step; every unit but the last prefetches the next one's.
    b_.sset(rPar, 0);
    load_q(-1, -1);
    fetch(-1, -1, rPar);
    // The live length: the position's low word from HBM, as f32 (thr of the first step).
    b_.dma(B::vmem_at(B::at(L_.posw)), B::hbm_at(B::at(0, {{rPos, 1}})), {.rows = 1, .row_bytes = 4}, 3 % cfg_.dma.engines,
           kSemP);
    // Key columns 0 .. tk-1 (doubling: [n, 2n) = [0, n) + n).
    b_.fill(vm(L_.col), 0, 1, 1);
    for (int64_t n = 1; n < L_.tk; n *= 2)
      b_.binary(Op::vadd, vm(L_.col + n * 4), vm(L_.col), B::imm(float(n)), 1, n);
    b_.wait(kSemP);
    b_.unary(Op::vcast, vm(L_.posf), B::vmem(B::at(L_.posw), DType::i32, 1), 1, 1);
    b_.sadd(rStepsM1, rSteps, -1);
    b_.sset(rPrev, 0);
    if (s_.batch > 1) {
      b_.loop(rB, s_.batch - 1);
      unit(true);
      b_.end_loop();
    }
    b_.sset(rB, s_.batch - 1);
    unit(false);
    b_.wait(kSemO);
    b_.fence();
    return b_.finish();
  }

 private:
  static sim::Operand vm(int64_t addr, DType t = DType::f32, int64_t rs = -1, int64_t cs = 1) {
    return B::vmem(B::at(addr), t, rs, cs);
  }
  static sim::Operand colv(int64_t addr) { return vm(addr, DType::f32, 1, 0); }
  void vec(Op op, int64_t dst, std::vector<sim::Operand> src, int64_t n) {
    emit_dense_vec(b_, cfg_.vpu.lanes, op, dst, src, n);
  }
  void vfill(int64_t dst, float value, int64_t n) { emit_dense_fill(b_, cfg_.vpu.lanes, dst, value, n); }

  // The queries of batch row `brow` (a register; -1: row 0) into the Q buffer of parity `qpar`
  // (a register; -1: 0).
  void load_q(int16_t brow, int16_t qpar) {
    sim::Addr src = B::at(0, {{rQ, 1}});
    if (brow >= 0) src.terms[1] = {brow, s_.heads * d_ * es_};
    sim::Addr dst = B::at(L_.q);
    if (qpar >= 0) dst.terms[0] = {qpar, L_.qbytes};
    b_.dma(B::vmem_at(dst), B::hbm_at(src), {.rows = 1, .row_bytes = s_.heads * d_ * es_}, 2 % cfg_.dma.engines, kSemQ);
  }

  // Keys and values of every KV head (and the mask bytes) of step `step` (a register; -1:
  // step 0) of batch row `brow` (a register; -1: row 0) into the buffers of parity `par`.
  void fetch(int16_t brow, int16_t step, int16_t par) {
    const int64_t plane = s_.capacity * d_ * es_;
    sim::Addr src = B::at(0, {{rK, 1}});
    if (brow >= 0) src.terms[1] = {brow, s_.kv_heads * plane};
    if (step >= 0) src.terms[2] = {step, L_.head_step};
    const sim::DmaShape sh{.planes = s_.kv_heads, .rows = 1, .row_bytes = L_.head_step, .dst_plane_stride = L_.head_step,
                           .src_plane_stride = plane};
    b_.dma(B::vmem_at(B::at(L_.k, {{par, L_.kv_step}})), B::hbm_at(src), sh, 0, kSemK);
    src.terms[0] = {rV, 1};
    b_.dma(B::vmem_at(B::at(L_.v, {{par, L_.kv_step}})), B::hbm_at(src), sh, 1 % cfg_.dma.engines, kSemV);
    if (s_.has_mask) {
      sim::Addr m = B::at(0, {{rMask, 1}});
      if (brow >= 0) m.terms[1] = {brow, s_.mask_batch_stride};
      if (step >= 0) m.terms[2] = {step, L_.tk};
      b_.dma(B::vmem_at(B::at(L_.mask_in, {{par, align64(L_.tk)}})), B::hbm_at(m), {.rows = 1, .row_bytes = L_.tk},
             2 % cfg_.dma.engines, kSemM);
    }
  }

  // Batch row rB, its queries and first step already coming into the buffers of parities
  // rB % 2 and rPar.
  void unit(bool prefetch_next) {
    const int64_t rows = L_.rows;
    b_.smod(rQPar, rB, 2);
    // thr[r] = pos - (first key of the step): key c of the step is live when c <= thr.
    vec(Op::vmov, L_.thr, {B::vmem(B::at(L_.posf), DType::f32, 0, 0)}, rows);
    vfill(L_.m, kMasked, rows);
    vfill(L_.l, 0, rows);
    b_.fill(vm(L_.o, DType::f32, d_), 0, rows, d_);
    b_.wait(kSemQ);
    // Steps 0 .. steps-2 fetch the next one first; the last step fetches the next unit's first.
    b_.loop_reg(rStep, rStepsM1);
    b_.sadd(rNext, rStep, 1);
    b_.sadd(rNextPar, rPar, 1);
    b_.smod(rNextPar, rNextPar, 2);
    fetch(rB, rNext, rNextPar);
    step();
    b_.sadd(rPar, rNextPar, 0);
    b_.end_loop();
    b_.sadd(rNextPar, rPar, 1);
    b_.smod(rNextPar, rNextPar, 2);
    if (prefetch_next) {
      b_.sadd(rNB, rB, 1);
      b_.smod(rNQ, rNB, 2);
      load_q(rNB, rNQ);
      fetch(rNB, -1, rNextPar);
    }
    step();
    b_.sadd(rPar, rNextPar, 0);
    // O / l into the output buffer once the previous unit's store has read it, then one DMA.
    b_.loop_reg(rW, rPrev);
    b_.wait(kSemO);
    b_.end_loop();
    const int64_t qrow = s_.heads * d_ * es_;
    b_.binary(Op::vdiv, B::vmem(B::at(L_.obuf), s_.dtype, d_), vm(L_.o, DType::f32, d_), colv(L_.l), rows, d_);
    b_.dma(B::hbm_at(B::at(0, {{rOut, 1}, {rB, qrow}})), B::vmem_at(B::at(L_.obuf)), {.rows = 1, .row_bytes = qrow},
           3 % cfg_.dma.engines, kSemO);
    b_.sset(rPrev, 1);
  }

  void row_reduce(Op xop, Op vop, int64_t dst, int64_t src, int64_t ld, int64_t rows, int64_t cols) {
    emit_row_reduce(b_, cfg_.vpu.lanes, xop, vop, dst, src, ld, L_.fold, rows, cols);
  }

  // One step of tk keys of every KV head from the buffers of parity rPar.
  void step() {
    const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols, nm = cfg_.mxu.count, tk = L_.tk, rows = L_.rows;
    b_.wait(kSemK);
    // S = Q K^T per KV head (its group's rows): key tiles spread over the MXUs, the head dim in
    // chunks of R.
    int tile = 0;
    for (int64_t h = 0; h < s_.kv_heads; ++h)
      for (int64_t j = 0; j * C < tk; ++j, ++tile) {
        const int64_t nn = std::min(C, tk - j * C);
        const int mxu = int(tile % nm);
        for (int64_t c = 0; c * R < d_; ++c) {
          const int64_t kk = std::min(R, d_ - c * R);
          b_.mxu_load_weights(
              mxu, B::vmem(B::at(L_.k + h * L_.head_step + (j * C * d_ + c * R) * es_, {{rPar, L_.kv_step}}), s_.dtype, 1, d_),
              kk, nn, s_.mode);
          b_.mxu_matmul(mxu, vm(L_.s + (h * g_ * tk + j * C) * 4, DType::f32, tk),
                        B::vmem(B::at(L_.q + (h * g_ * d_ + c * R) * es_, {{rQPar, L_.qbytes}}), s_.dtype, d_), g_, kk, nn,
                        c > 0, s_.mode);
        }
      }
    // Soft-capping: S = tanh(scale S / softcap); the softmax then scales by softcap.
    const sim::Operand S = vm(L_.s, DType::f32, tk), M = vm(L_.mk, DType::f32, tk);
    const float escale = s_.softcap > 0 ? s_.softcap : s_.scale;
    if (s_.softcap > 0) {
      b_.binary(Op::vmul, S, S, B::imm(s_.scale / s_.softcap), rows, tk);
      b_.unary(Op::vtanh, S, S, rows, tk);
    }
    // Keys the mask drops, keys past the live length and (sliding window) keys at or before
    // pos - window score kMasked.
    if (s_.window > 0) {
      vec(Op::vsub, L_.thrw, {vm(L_.thr), B::imm(float(s_.window))}, rows);
      b_.binary(Op::vcmplt, M, colv(L_.thrw), vm(L_.col, DType::f32, 0), rows, tk);
      b_.ternary(Op::vsel, S, M, S, B::imm(kMasked), rows, tk);
    }
    if (s_.has_mask) {
      b_.wait(kSemM);
      b_.unary(Op::vcast, M, B::vmem(B::at(L_.mask_in, {{rPar, align64(tk)}}), DType::i8, 0), rows, tk);
      b_.ternary(Op::vsel, S, M, S, B::imm(kMasked), rows, tk);
    }
    b_.binary(Op::vcmple, M, vm(L_.col, DType::f32, 0), colv(L_.thr), rows, tk);
    b_.ternary(Op::vsel, S, M, S, B::imm(kMasked), rows, tk);
    vec(Op::vsub, L_.thr, {vm(L_.thr), B::imm(float(tk))}, rows);
    // Online softmax.
    row_reduce(Op::xmax, Op::vmax, L_.mnew, L_.s, tk, rows, tk);
    vec(Op::vmax, L_.mnew, {vm(L_.mnew), vm(L_.m)}, rows);
    vec(Op::vsub, L_.alpha, {vm(L_.m), vm(L_.mnew)}, rows);
    vec(Op::vmul, L_.alpha, {vm(L_.alpha), B::imm(escale)}, rows);
    vec(Op::vexp, L_.alpha, {vm(L_.alpha)}, rows);
    vec(Op::vmov, L_.m, {vm(L_.mnew)}, rows);
    vec(Op::vmul, L_.negm, {vm(L_.m), B::imm(-escale)}, rows);
    b_.ternary(Op::vfma, S, S, B::imm(escale), colv(L_.negm), rows, tk);
    b_.unary(Op::vexp, S, S, rows, tk);
    row_reduce(Op::xsum, Op::vadd, L_.rsum, L_.s, tk, rows, tk);
    vec(Op::vfma, L_.l, {vm(L_.l), vm(L_.alpha), vm(L_.rsum)}, rows);
    b_.binary(Op::vmul, vm(L_.o, DType::f32, d_), vm(L_.o, DType::f32, d_), colv(L_.alpha), rows, d_);
    // O += P V per KV head: output columns in tiles of C, keys in chunks of R.
    b_.wait(kSemV);
    tile = 0;
    for (int64_t h = 0; h < s_.kv_heads; ++h)
      for (int64_t n = 0; n * C < d_; ++n, ++tile) {
        const int64_t nn = std::min(C, d_ - n * C);
        const int mxu = int(tile % nm);
        for (int64_t c = 0; c * R < tk; ++c) {
          const int64_t kk = std::min(R, tk - c * R);
          b_.mxu_load_weights(
              mxu, B::vmem(B::at(L_.v + h * L_.head_step + (c * R * d_ + n * C) * es_, {{rPar, L_.kv_step}}), s_.dtype, d_),
              kk, nn, s_.mode);
          b_.mxu_matmul(mxu, vm(L_.o + (h * g_ * d_ + n * C) * 4, DType::f32, d_),
                        vm(L_.s + (h * g_ * tk + c * R) * 4, DType::f32, tk), g_, kk, nn, true, s_.mode);
        }
      }
  }

  const sim::ChipConfig& cfg_;
  const CachedAttentionSpec& s_;
  Layout L_;
  B b_;
  int64_t es_, d_, g_;
};

void check_spec(const CachedAttentionSpec& s) {
  TPU_CHECK(s.batch > 0 && s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 &&
                s.capacity > 0 && s.tk > 0 && (s.tk & (s.tk - 1)) == 0 && s.capacity % s.tk == 0 && s.scale > 0 &&
                s.window >= 0 && s.softcap >= 0,
            "kv_cache_attention: invalid spec (batch {}, {} heads, {} kv heads, head_dim {}, capacity {}, {} keys "
            "per step, scale {}, window {}, softcap {})",
            s.batch, s.heads, s.kv_heads, s.head_dim, s.capacity, s.tk, s.scale, s.window, s.softcap);
}

}  // namespace

int64_t cached_attention_vmem_bytes(const sim::ChipConfig& cfg, const CachedAttentionSpec& s) {
  return plan(cfg, s, s.tk).total;
}

int64_t choose_cached_attention_tk(const sim::ChipConfig& cfg, const CachedAttentionSpec& s) {
  int64_t tk = 1;
  const int64_t want = int64_t(cfg.mxu.cols) * 2;
  while (tk * 2 <= want && s.capacity % (tk * 2) == 0) tk *= 2;
  CachedAttentionSpec t = s;
  t.tk = tk;
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10;
  while (t.tk > 1 && cached_attention_vmem_bytes(cfg, t) > budget) t.tk /= 2;
  return t.tk;
}

sim::Program make_cached_attention_program(const sim::ChipConfig& cfg, const CachedAttentionSpec& s) {
  check_spec(s);
  TPU_CHECK(cached_attention_vmem_bytes(cfg, s) <= int64_t(cfg.memory.vmem_bytes),
            "kv_cache_attention: steps of {} keys need {} bytes of VMEM, the chip has {}", s.tk,
            cached_attention_vmem_bytes(cfg, s), cfg.memory.vmem_bytes);
  TPU_CHECK(cfg.scalar.registers > int(rNQ), "kv_cache_attention: the chip has {} scalar registers, the program uses {}",
            cfg.scalar.registers, int(rNQ) + 1);
  return Emitter(cfg, s).run();
}

std::string cached_attention_key(const CachedAttentionSpec& s) {
  return fmt::format("cached_attention:{}x{}/{}x{}:c{}:t{}:s{}:{}:{}:m{}/{}:w{}:c{}", s.batch, s.heads, s.kv_heads,
                     s.head_dim, s.capacity, s.tk, s.scale, sim::dtype_name(s.dtype), sim::mxu_mode_name(s.mode),
                     s.has_mask, s.mask_batch_stride, s.window, s.softcap);
}

}  // namespace tpu::codegen
