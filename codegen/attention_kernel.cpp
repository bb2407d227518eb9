#include "codegen/attention_kernel.h"

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

constexpr float kMaskedScore = -1e30f;  // finite: exp underflows to 0, no inf - inf
// Pipeline depths: the scores and exp of step i + kAhead are emitted before the row sums and
// P V of step i; loads run one step further ahead; the O update of step i follows the P V of
// step i + kLag. Buffer rings are sized so that no buffer is rewritten before its last reader
// was emitted.
constexpr size_t kAhead = 2, kLag = 2;
constexpr int kRingKV = 4, kRingS = 4, kRingAlpha = 5, kRingT = 3, kRingQ = 4;
constexpr int kSemK = 0, kSemV = 1, kSemQ = 2, kSemO = 3, kSemM = 4;

struct Layout {
  int64_t q[kRingQ]{}, k[kRingKV]{}, v[kRingKV]{}, s[kRingS]{}, t[kRingT]{}, o[kRingT]{}, out[2]{};
  int64_t m[2]{}, l[kRingT]{}, alpha[kRingAlpha]{}, mnew = 0, negm = 0, rsum = 0, fold_max = 0, fold_sum = 0;
  int64_t valid[kRingAlpha]{};  // with a mask: 1 where the row kept a key, NaN where it kept none
  int64_t mask_in[kRingKV]{}, mask = 0, mask0 = 0, diff = 0, col_iota = 0, row_iota = 0;
  int64_t total = 0;
};

Layout plan_layout(const sim::ChipConfig& cfg, const AttentionSpec& s, int64_t tq, int64_t tk) {
  Layout p;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  const int64_t es = sim::dtype_size(s.dtype), lanes = cfg.vpu.lanes;
  for (int i = 0; i < kRingQ; ++i) p.q[i] = take(tq * s.d * es);
  for (int i = 0; i < kRingKV; ++i) p.k[i] = take(tk * s.d * es);
  for (int i = 0; i < kRingKV; ++i) p.v[i] = take(tk * s.dv * es);
  for (int i = 0; i < kRingS; ++i) p.s[i] = take(tq * tk * 4);
  for (int i = 0; i < 2; ++i) {
    p.out[i] = take(tq * s.dv * es);
    p.m[i] = take(tq * 4);
  }
  for (int i = 0; i < kRingT; ++i) {
    p.t[i] = take(tq * s.dv * 4);
    p.o[i] = take(tq * s.dv * 4);
    p.l[i] = take(tq * 4);
  }
  for (int i = 0; i < kRingAlpha; ++i) p.alpha[i] = take(tq * 4);
  p.mnew = take(tq * 4);
  p.negm = take(tq * 4);
  p.rsum = take(tq * 4);
  p.fold_max = take(tq * lanes * 4);
  p.fold_sum = take(tq * lanes * 4);
  if (s.causal || s.has_mask || s.window > 0) p.mask = take(tq * tk * 4);
  if (s.has_mask) {
    for (int i = 0; i < kRingKV; ++i) p.mask_in[i] = take(tq * tk);
    for (int i = 0; i < kRingAlpha; ++i) p.valid[i] = take(tq * 4);
  }
  if (s.causal || s.window > 0) {
    p.mask0 = take(tq * tk * 4);
    p.diff = take(tq * tk * 4);
    p.col_iota = take(tk * 4);
    p.row_iota = take(tq * 4);
  }
  p.total = at;
  return p;
}

struct Step {
  int64_t head, qblock, q0, ql, k0, kl;
  bool first, last, diag, band;  // band: some key of the block is behind some row's window
};

std::vector<Step> plan_steps(const AttentionSpec& s, int64_t tq, int64_t tk) {
  std::vector<Step> steps;
  int64_t qblock = 0;
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t q0 = 0; q0 < s.lq; q0 += tq, ++qblock) {
      const int64_t ql = std::min(tq, s.lq - q0);
      // Keys past the block's last query row are masked for every row: never computed.
      const int64_t kend = s.causal ? std::min(s.lk, q0 + ql) : s.lk;
      // Keys before the first row's window are masked for every row: never computed either.
      int64_t kstart = 0;
      if (s.window > 0 && kend > 0)
        kstart = std::min(std::max<int64_t>(0, s.q_pos0 + q0 - s.window + 1) / tk, (kend - 1) / tk) * tk;
      for (int64_t k0 = kstart; k0 < kend; k0 += tk) {
        const int64_t kl = std::min(tk, kend - k0);
        steps.push_back({h, qblock, q0, ql, k0, kl, k0 == kstart, k0 + kl >= kend, s.causal && k0 + kl - 1 > q0,
                         s.window > 0 && k0 <= s.q_pos0 + q0 + ql - 1 - s.window});
      }
    }
  return steps;
}

// Emits the program step by step (see the header for the pipeline).
class Emitter {
 public:
  Emitter(const sim::ChipConfig& cfg, const AttentionSpec& s, int64_t tq, int64_t tk)
      : cfg_(cfg), s_(s), tq_(tq), tk_(tk), L_(plan_layout(cfg, s, tq, tk)), steps_(plan_steps(s, tq, tk)),
        b_(s.name), es_(sim::dtype_size(s.dtype)), kQueueK(0), kQueueV(1 % cfg.dma.engines),
        kQueueQ(2 % cfg.dma.engines), kQueueO(3 % cfg.dma.engines) {}

  sim::Program run() {
    b_.signal(kSemO, 2);  // both output tiles start free
    if (s_.causal || s_.window > 0) emit_diff_tile();
    const size_t n = steps_.size();
    for (size_t i = 0; i <= kAhead && i < n; ++i) loads(i);
    for (size_t i = 0; i < kAhead && i < n; ++i) {
      wait_qk(i);
      emit_scores(i);
      emit_exp(i);
    }
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead + 1 < n) loads(i + kAhead + 1);
      if (i + kAhead < n) {
        wait_qk(i + kAhead);
        emit_scores(i + kAhead);
        emit_exp(i + kAhead);  // on the vector unit ahead of this step's row sums: the EUP never waits
      }
      emit_row_sums(i);
      b_.wait(kSemV);
      emit_pv(i);
      if (i >= kLag) emit_update(i - kLag);
    }
    for (size_t i = n > kLag ? n - kLag : 0; i < n; ++i) emit_update(i);
    b_.wait(kSemO, 2);
    b_.fence();
    return b_.finish();
  }

 private:
  static sim::Operand vm(int64_t addr, DType t = DType::f32, int64_t rs = -1, int64_t cs = 1) {
    return B::vmem(B::at(addr), t, rs, cs);
  }
  static sim::Operand colv(int64_t addr) { return vm(addr, DType::f32, 1, 0); }  // [rows, 1] broadcast along rows

  // Dense vector op over n contiguous f32 values, shaped as full vregs plus a tail.
  void vec(Op op, int64_t dst, std::vector<sim::Operand> src, int64_t n) {
    emit_dense_vec(b_, cfg_.vpu.lanes, op, dst, src, n);
  }

  // Row reduction (xmax / xsum) of an [rows, cols] f32 region at `src` (row stride ld) into the
  // [rows, 1] vector `dst`: lane-wide chunks folded on the vector unit, then one cross-lane op.
  void row_reduce(Op xop, Op vop, int64_t dst, int64_t src, int64_t ld, int64_t fold, int64_t rows, int64_t cols) {
    emit_row_reduce(b_, cfg_.vpu.lanes, xop, vop, dst, src, ld, fold, rows, cols);
  }

  // diff[r, c] = c - r over a tq x tk tile (built once): key j is masked for query i when
  // (j - k0) - (i - q0) > q0 - k0.
  void emit_diff_tile() {
    for (int64_t c = 0; c < tk_; ++c) b_.fill(vm(L_.col_iota + c * 4), float(c), 1, 1);
    for (int64_t r = 0; r < tq_; ++r) b_.fill(vm(L_.row_iota + r * 4), float(r), 1, 1);
    b_.binary(Op::vsub, vm(L_.diff, DType::f32, tk_), vm(L_.col_iota, DType::f32, 0), colv(L_.row_iota), tq_, tk_);
    b_.binary(Op::vcmplt, vm(L_.mask0, DType::f32, tk_), B::imm(0), vm(L_.diff, DType::f32, tk_), tq_, tk_);
  }

  int64_t kv_head(const Step& st) const { return st.head / s_.group; }

  void loads(size_t i) {
    const Step& st = steps_[i];
    const int64_t kvh = kv_head(st);
    const int buf = int(i % kRingKV);
    b_.dma(B::vmem_at(B::at(L_.k[buf])),
           B::hbm_at(B::at((s_.k_off[size_t(kvh)] + st.k0 * s_.k_rs) * es_, {{1, 1}})),
           {.rows = st.kl, .row_bytes = s_.d * es_, .src_row_stride = s_.k_rs * es_}, kQueueK, kSemK);
    b_.dma(B::vmem_at(B::at(L_.v[buf])),
           B::hbm_at(B::at((s_.v_off[size_t(kvh)] + st.k0 * s_.v_rs) * es_, {{2, 1}})),
           {.rows = st.kl, .row_bytes = s_.dv * es_, .src_row_stride = s_.v_rs * es_}, kQueueV, kSemV);
    if (st.first)
      b_.dma(B::vmem_at(B::at(L_.q[st.qblock % kRingQ])),
             B::hbm_at(B::at((s_.q_off[size_t(st.head)] + st.q0 * s_.q_rs) * es_, {{0, 1}})),
             {.rows = st.ql, .row_bytes = s_.d * es_, .src_row_stride = s_.q_rs * es_}, kQueueQ, kSemQ);
    if (s_.has_mask)
      b_.dma(B::vmem_at(B::at(L_.mask_in[buf])),
             B::hbm_at(B::at(s_.m_off[size_t(st.head)] + st.q0 * s_.m_rs + st.k0, {{4, 1}})),
             {.rows = st.ql, .row_bytes = st.kl, .dst_row_stride = tk_, .src_row_stride = s_.m_rs}, kQueueK, kSemM);
  }

  void wait_qk(size_t i) {
    b_.wait(kSemK);
    if (steps_[i].first) b_.wait(kSemQ);
    if (s_.has_mask) b_.wait(kSemM);
  }

  // S = Q K^T: key tile j (array width C) on MXU j % count, head dim in chunks of R rows.
  void emit_scores(size_t i) {
    const Step& st = steps_[i];
    const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols, nm = cfg_.mxu.count;
    const int64_t kbuf = L_.k[i % kRingKV], qbuf = L_.q[st.qblock % kRingQ], sbuf = L_.s[i % kRingS];
    const int64_t jt = (st.kl + C - 1) / C, dc = (s_.d + R - 1) / R;
    for (int64_t j = 0; j < jt; ++j) {
      const int64_t nn = std::min(C, st.kl - j * C);
      const int mxu = int(j % nm);
      for (int64_t c = 0; c < dc; ++c) {
        const int64_t kk = std::min(R, s_.d - c * R);
        b_.mxu_load_weights(mxu, vm(kbuf + (j * C * s_.d + c * R) * es_, s_.dtype, 1, s_.d), kk, nn, s_.mode);
        b_.mxu_matmul(mxu, vm(sbuf + j * C * 4, DType::f32, tk_), vm(qbuf + c * R * es_, s_.dtype, s_.d), st.ql, kk,
                      nn, c > 0, s_.mode);
      }
    }
  }

  // Mask, running max m' and the rescale factor alpha, P = exp(scale (S - m')) in place.
  void emit_exp(size_t i) {
    const Step& st = steps_[i];
    const int p = int(i % 2), pp = 1 - p, r = int(i % kRingAlpha);
    const int64_t sbuf = L_.s[i % kRingS], ql = st.ql, kl = st.kl;
    const sim::Operand S = vm(sbuf, DType::f32, tk_);
    if (s_.softcap > 0) {
      // S -> (cap / scale) tanh(scale S / cap): the exp's scale below makes it cap tanh(scale S / cap).
      b_.binary(Op::vmul, S, S, B::imm(s_.scale / s_.softcap), ql, kl);
      b_.unary(Op::vtanh, S, S, ql, kl);
      b_.binary(Op::vmul, S, S, B::imm(s_.softcap / s_.scale), ql, kl);
    }
    if (st.band) {
      // Key k0 + c is behind row q0 + r's window when c - r < q_pos0 + q0 - k0 - window + 1.
      const sim::Operand M = vm(L_.mask, DType::f32, tk_);
      b_.binary(Op::vcmplt, M, vm(L_.diff, DType::f32, tk_), B::imm(float(s_.q_pos0 + st.q0 - st.k0 - s_.window + 1)),
                ql, kl);
      b_.ternary(Op::vsel, S, M, B::imm(kMaskedScore), S, ql, kl);
    }
    if (st.diag) {
      sim::Operand M = vm(L_.mask0, DType::f32, tk_);  // the common diagonal block (k0 == q0)
      if (st.q0 != st.k0) {
        M = vm(L_.mask, DType::f32, tk_);
        b_.binary(Op::vcmplt, M, B::imm(float(st.q0 - st.k0)), vm(L_.diff, DType::f32, tk_), ql, kl);
      }
      b_.ternary(Op::vsel, S, M, B::imm(kMaskedScore), S, ql, kl);
    }
    if (s_.has_mask) {
      const sim::Operand M = vm(L_.mask, DType::f32, tk_);
      b_.unary(Op::vcast, M, vm(L_.mask_in[i % kRingKV], DType::i8, tk_), ql, kl);
      b_.ternary(Op::vsel, S, M, S, B::imm(kMaskedScore), ql, kl);
    }
    const int64_t m_new = st.first ? L_.m[p] : L_.mnew;
    row_reduce(Op::xmax, Op::vmax, m_new, sbuf, tk_, L_.fold_max, ql, kl);
    if (!st.first) {
      vec(Op::vmax, L_.m[p], {vm(L_.m[pp]), vm(L_.mnew)}, ql);
      vec(Op::vsub, L_.alpha[r], {vm(L_.m[pp]), vm(L_.m[p])}, ql);
      vec(Op::vmul, L_.alpha[r], {vm(L_.alpha[r]), B::imm(s_.scale)}, ql);
      vec(Op::vexp, L_.alpha[r], {vm(L_.alpha[r])}, ql);
    }
    if (s_.has_mask && st.last) {
      // A row whose every key was masked keeps m at the masked score: its P is all ones and
      // O / l would be the mean of V. valid = 1 where m rose above it, 0 / 0 = NaN elsewhere
      // (the cpu's softmax over all -inf), applied to l at the row block's end.
      vec(Op::vcmplt, L_.valid[r], {B::imm(kMaskedScore), vm(L_.m[p])}, ql);
      vec(Op::vdiv, L_.valid[r], {vm(L_.valid[r]), vm(L_.valid[r])}, ql);
    }
    vec(Op::vmul, L_.negm, {vm(L_.m[p]), B::imm(-s_.scale)}, ql);
    b_.ternary(Op::vfma, S, S, B::imm(s_.scale), colv(L_.negm), ql, kl);
    b_.unary(Op::vexp, S, S, ql, kl);
  }

  // The running sum l' = l alpha + rowsum(P).
  void emit_row_sums(size_t i) {
    const Step& st = steps_[i];
    const int r = int(i % kRingT), rp = int((i + kRingT - 1) % kRingT), a = int(i % kRingAlpha);
    const int64_t sbuf = L_.s[i % kRingS];
    if (st.first) {
      row_reduce(Op::xsum, Op::vadd, L_.l[r], sbuf, tk_, L_.fold_sum, st.ql, st.kl);
    } else {
      row_reduce(Op::xsum, Op::vadd, L_.rsum, sbuf, tk_, L_.fold_sum, st.ql, st.kl);
      vec(Op::vfma, L_.l[r], {vm(L_.l[rp]), vm(L_.alpha[a]), vm(L_.rsum)}, st.ql);
    }
  }

  // T = P V (into O directly on a row block's first step): rows split over the MXUs.
  void emit_pv(size_t i) {
    const Step& st = steps_[i];
    const int64_t R = cfg_.mxu.rows, C = cfg_.mxu.cols, nm = cfg_.mxu.count;
    const int64_t pbuf = L_.s[i % kRingS], vbuf = L_.v[i % kRingKV];
    const int64_t obuf = st.first ? L_.o[st.qblock % kRingT] : L_.t[i % kRingT];
    const int64_t rb = std::max<int64_t>(8, (st.ql + nm - 1) / nm + 7) / 8 * 8;
    const int64_t kc = (st.kl + R - 1) / R, nt = (s_.dv + C - 1) / C;
    int blk = 0;
    for (int64_t r0 = 0; r0 < st.ql; r0 += rb, ++blk) {
      const int64_t rows = std::min(rb, st.ql - r0);
      const int mxu = int(blk % nm);
      for (int64_t n = 0; n < nt; ++n) {
        const int64_t nn = std::min(C, s_.dv - n * C);
        for (int64_t c = 0; c < kc; ++c) {
          const int64_t kk = std::min(R, st.kl - c * R);
          b_.mxu_load_weights(mxu, vm(vbuf + (c * R * s_.dv + n * C) * es_, s_.dtype, s_.dv), kk, nn, s_.mode);
          b_.mxu_matmul(mxu, vm(obuf + (r0 * s_.dv + n * C) * 4, DType::f32, s_.dv),
                        vm(pbuf + (r0 * tk_ + c * R) * 4, DType::f32, tk_), rows, kk, nn, c > 0, s_.mode);
        }
      }
    }
  }

  // O = O alpha + T (later steps), and at the row block's end O / l stored.
  void emit_update(size_t i) {
    const Step& st = steps_[i];
    const int r = int(i % kRingT), ob = int(st.qblock % kRingT), sb = int(st.qblock % 2);
    const sim::Operand O = vm(L_.o[ob], DType::f32, s_.dv);
    if (!st.first)
      b_.ternary(Op::vfma, O, O, colv(L_.alpha[i % kRingAlpha]), vm(L_.t[r], DType::f32, s_.dv), st.ql, s_.dv);
    if (!st.last) return;
    if (s_.has_mask) vec(Op::vmul, L_.l[r], {vm(L_.l[r]), vm(L_.valid[i % kRingAlpha])}, st.ql);
    b_.wait(kSemO);  // on the vector unit: a reciprocal on the EUP would queue behind the next exp
    b_.binary(Op::vdiv, vm(L_.out[sb], s_.dtype, s_.dv), O, colv(L_.l[r]), st.ql, s_.dv);
    b_.dma(B::hbm_at(B::at((st.head * s_.lq + st.q0) * s_.dv * es_, {{3, 1}})), B::vmem_at(B::at(L_.out[sb])),
           {.rows = 1, .row_bytes = st.ql * s_.dv * es_}, kQueueO, kSemO);
  }

  const sim::ChipConfig& cfg_;
  const AttentionSpec& s_;
  int64_t tq_, tk_;
  Layout L_;
  std::vector<Step> steps_;
  B b_;
  int64_t es_;
  int kQueueK, kQueueV, kQueueQ, kQueueO;  // DMA queues (shared when the chip has fewer engines)
};

}  // namespace

AttentionTiling choose_attention_tiling(const sim::ChipConfig& cfg, const AttentionSpec& s) {
  const int64_t width = int64_t(cfg.mxu.count) * cfg.mxu.cols;
  const int64_t budget = int64_t(cfg.memory.vmem_bytes) * 9 / 10;
  auto round8 = [](int64_t v) { return std::max<int64_t>(8, (v + 7) / 8 * 8); };
  AttentionTiling t;
  t.tk = s.tk > 0 ? s.tk : std::min(width, round8(s.lk));
  t.tq = s.tq > 0 ? s.tq : std::min(width, round8(s.lq));
  for (;;) {
    t.vmem_bytes = plan_layout(cfg, s, t.tq, t.tk).total;
    if (t.vmem_bytes <= budget) return t;
    if (t.tq > 8 && t.tq >= t.tk) t.tq = round8(t.tq / 2);
    else if (t.tk > 8) t.tk = round8(t.tk / 2);
    else fail("scaled_dot_product_attention: no tiling of head dims {}/{} fits the chip's {} bytes of VMEM", s.d, s.dv,
              cfg.memory.vmem_bytes);
  }
}

sim::Program make_attention_program(const sim::ChipConfig& cfg, const AttentionSpec& s) {
  TPU_CHECK(s.window >= 0 && s.softcap >= 0 && (!s.causal || s.q_pos0 == 0),
            "internal: codegen: attention window {} (query offset {}, causal {}) or softcap {}", s.window, s.q_pos0,
            s.causal, s.softcap);
  TPU_CHECK(s.scale > 0 && int64_t(s.q_off.size()) == s.heads && s.group > 0 &&
                (!s.has_mask || int64_t(s.m_off.size()) == s.heads) &&
                int64_t(s.k_off.size()) * s.group == s.heads && s.k_off.size() == s.v_off.size(),
            "internal: codegen: inconsistent attention spec ({} heads, group {})", s.heads, s.group);
  const AttentionTiling t = choose_attention_tiling(cfg, s);
  return Emitter(cfg, s, t.tq, t.tk).run();
}

std::string attention_key(const AttentionSpec& s) {
  std::string k = fmt::format("sdpa:{}x{}:{}x{}x{}x{}:c{}:s{}:{}:{}:rs{}/{}/{}:t{}/{}:", s.heads, s.group, s.lq, s.lk,
                              s.d, s.dv, s.causal, s.scale, sim::dtype_name(s.dtype), sim::mxu_mode_name(s.mode),
                              s.q_rs, s.k_rs, s.v_rs, s.tq, s.tk);
  for (const auto* v : {&s.q_off, &s.k_off, &s.v_off}) k += fmt::format("{};", fmt::join(*v, ","));
  if (s.has_mask) k += fmt::format("mask{}:{};", s.m_rs, fmt::join(s.m_off, ","));
  if (s.window > 0 || s.softcap > 0) k += fmt::format("w{}@{}:cap{};", s.window, s.q_pos0, s.softcap);
  return k;
}

}  // namespace tpu::codegen
