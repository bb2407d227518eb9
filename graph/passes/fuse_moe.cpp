// The fused mixture-of-experts layer node: the chain a SparseMoE block traces after its router,
//
//   order, sizes = moe_sort(ids)            xs = moe_permute(x, order, k)
//   h = grouped_matmul(xs, gate_up, sizes)  a = silu(h[:, :F]) * h[:, F:]
//   ys = grouped_matmul(a, down, sizes)     out = moe_unpermute(ys, order, w, k)
//
// becomes one node moe_ffn(x, ids, w, gate_up, down) when no value inside the chain is read
// elsewhere (an inference graph: a training graph keeps them for its backward, and stays as
// traced). Only cpu and sim graphs (the PJRT export lowers the chain itself).
//
// The cpu kernel (f32 and bf16) walks the experts in order and each expert's tokens (in slot
// order, as moe_sort orders them) in row tiles: the tile's rows of x are gathered straight from
// x, go through gate/up (one GEMM), silu(gate) * up and down (one GEMM), and the weighted rows
// are added straight into an f32 accumulator of the output; no [T k, hidden] or [T k, inter]
// array exists. The GEMMs split their work over the threads; gather, activation and scatter
// run in parallel over elements. A token's k expert results are summed in expert order (the
// chain sums them in choice order, so results agree to rounding). bf16 on CPUs with AMX, when no
// expert has more than 128 slots (a MoE layer's few tokens), instead gathers the slots' rows once
// and runs each product as one grouped product over all experts with the weights read in place
// (moe_ffn_grouped_bf16). f16 runs the chain op by op.
// The sim kernel is a chip program of its own (codegen/moe_ffn_kernel.cpp).
#include <algorithm>
#include <cstring>
#include <vector>

#include "graph/passes/moe_ffn.h"
#include "graph/passes/passes.h"
#include "ops/cpu/kernels/gemm.h"
#include "ops/cpu/kernels/gemm_grouped.h"
#include "ops/cpu/kernels/scratch.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "tpucore/core/batch_invariant.h"
#include "tpucore/ops.h"

namespace tpu::graph {

// The chain, op by op, on the inputs' device (moe_ffn.h).
void moe_ffn_chain(const ops::KernelArgs& a) {
  ops::EagerScope eager;  // run now, never recorded; detached inputs: no autograd history either
  const int64_t e = a.attrs.get_int("num_experts"), k = a.attrs.get_int("top_k");
  const Tensor x = a.inputs[0].detach(), ids = a.inputs[1].detach(), w = a.inputs[2].detach(),
               w1 = a.inputs[3].detach(), w2 = a.inputs[4].detach();
  Tensor sorted[ops::kMaxOutputs];
  const Tensor sort_in[1] = {ids};
  ops::call(*ops::find_op("moe_sort"), sort_in, {{"num_experts", e}}, sorted);
  const Tensor &order = sorted[0], &sizes = sorted[1];
  const ops::OpDef& gmm = *ops::find_op("grouped_matmul");
  const Tensor xs = ops::call(*ops::find_op("moe_permute"), {x, order}, {{"top_k", k}});
  const Tensor h = ops::call(gmm, {xs, w1, sizes}, {{"transpose_w", true}});
  const int64_t f = w1.size(1) / 2;
  const Tensor act = mul(silu(narrow(h, 1, 0, f)), narrow(h, 1, f, f));
  const Tensor ys = ops::call(gmm, {act, w2, sizes}, {{"transpose_w", true}});
  const Tensor out = ops::call(*ops::find_op("moe_unpermute"), {ys, order, w}, {{"top_k", k}, {"has_weights", true}});
  a.outputs[0].copy_(out);
}

namespace {

const char* const kMoeFfn = "moe_ffn";

void moe_ffn_meta(const ops::MetaArgs& a, ops::MetaResult& m) {
  const Tensor &x = a.inputs[0], &ids = a.inputs[1], &w = a.inputs[2], &w1 = a.inputs[3], &w2 = a.inputs[4];
  const int64_t e = a.attrs.get_int("num_experts"), k = a.attrs.get_int("top_k");
  TPU_CHECK(x.dim() == 2 && ids.dim() == 2 && ids.size(0) == x.size(0) && ids.size(1) == k && w.shape() == ids.shape() &&
                w1.dim() == 3 && w1.size(0) == e && w1.size(2) == x.size(1) && w1.size(1) % 2 == 0 && w2.dim() == 3 &&
                w2.size(0) == e && w2.size(2) == w1.size(1) / 2,
            "moe_ffn: x {}, expert ids {}, weights {}, gate_up {} and down {} do not fit {} experts, top-{}", x.shape(),
            ids.shape(), w.shape(), w1.shape(), w2.shape(), e, k);
  m.out() = {Shape{x.size(0), w2.size(1)}, x.dtype(), x.device()};
}

// Rows of one expert per tile of the fused cpu kernel.
constexpr int64_t kMoeFfnTile = 64;

// The expert ids of a 2-D cpu tensor [T, k] as i32 in slot order, each checked to lie in [0, experts).
std::vector<int32_t> moe_ffn_read_ids(const Tensor& ids, int64_t experts) {
  std::vector<int32_t> v(static_cast<size_t>(ids.numel()));
  bool integral = false;
  const int64_t k = ids.size(1);
  dispatch_dtype(ids.dtype(), [&](auto z) {
    using T = decltype(z);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      integral = true;
      const T* p = static_cast<const T*>(ids.raw_data());
      for (size_t i = 0; i < v.size(); ++i) {
        const auto t = static_cast<int64_t>(i) / k, j = static_cast<int64_t>(i) % k;
        const auto x = static_cast<int64_t>(p[t * ids.strides()[0] + j * ids.strides()[1]]);
        TPU_CHECK(x >= 0 && x < experts, "moe_ffn: expert id {} (slot {}) is out of range for {} experts", x, i,
                  experts);
        v[i] = static_cast<int32_t>(x);
      }
    }
  });
  TPU_CHECK(integral, "moe_ffn: expert ids must be an integer tensor, got {}", ids.dtype());
  return v;
}

template <class T>
void moe_ffn_gemm(int64_t M, int64_t N, int64_t K, const T* A, const Tensor& w, int64_t e, int64_t rs, int64_t cs,
                  float* C) {
  const T* B = static_cast<const T*>(w.raw_data()) + e * w.strides()[0];
  if constexpr (std::is_same_v<T, float>) {
    kernels::gemm_f32(M, N, K, A, K, 1, B, rs, cs, C, N, false);
  } else {
    kernels::gemm_bf16(M, N, K, reinterpret_cast<const uint16_t*>(A), K, 1, reinterpret_cast<const uint16_t*>(B), rs,
                       cs, C, N, false);
  }
}

// The bf16 output rounded from the f32 accumulator.
void moe_ffn_round(const ops::KernelArgs& a, const float* acc) {
  const Tensor& out = a.outputs[0];
  bf16* o = static_cast<bf16*>(out.raw_data());
  parallel_for(0, out.numel(), ops::cpu::kParallelGrain, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) o[i] = bf16(acc[i]);
  });
}

// bf16 on CPUs with AMX when every expert has at most kAmxWeightInPlaceMaxRows slots (outside
// batch-invariant mode): the slots' rows gathered in expert order, both products as one grouped
// product each over all experts with the weights read in place (kernels/gemm_grouped.h: the
// threads stream the experts' weights one after the other, no join between experts), the gate/up
// result in f32, silu(gate) * up rounded to bf16 once, the down result in f32 added with each
// slot's weight into `acc` [T, H] (zeroed). Returns false (nothing done) otherwise.
bool moe_ffn_grouped_bf16(const ops::KernelArgs& a, const std::vector<int64_t>& start,
                          const std::vector<int64_t>& order, const std::vector<float>& gate_w, float* acc) {
  const Tensor &x = a.inputs[0], &w1 = a.inputs[3], &w2 = a.inputs[4];
  const int64_t e_count = a.attrs.get_int("num_experts"), k = a.attrs.get_int("top_k");
  const int64_t hid = x.size(1), f = w2.size(2), slots = static_cast<int64_t>(order.size());
  if (batch_invariant() || !kernels::gemm_bf16_amx_available() || w1.strides()[2] != 1 || w2.strides()[2] != 1 ||
      slots == 0)
    return false;
  for (int64_t e = 0; e < e_count; ++e)
    if (start[static_cast<size_t>(e) + 1] - start[static_cast<size_t>(e)] > kernels::kAmxWeightInPlaceMaxRows)
      return false;
  thread_local kernels::detail::ScratchBuffer xs_buf, h_buf, act_buf, y_buf;
  auto* xs = xs_buf.get_as<uint16_t>(static_cast<size_t>(slots * hid));
  auto* h = h_buf.get_as<float>(static_cast<size_t>(slots * 2 * f));
  auto* act = act_buf.get_as<uint16_t>(static_cast<size_t>(slots * f));
  auto* y = y_buf.get_as<float>(static_cast<size_t>(slots * hid));
  const auto* xp = static_cast<const uint16_t*>(x.raw_data());
  const int64_t xrs = x.strides()[0], xcs = x.strides()[1];
  parallel_for(0, slots, std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(hid, 1)),
               [&](int64_t b, int64_t end) {
                 for (int64_t r = b; r < end; ++r) {
                   const uint16_t* src = xp + (order[static_cast<size_t>(r)] / k) * xrs;
                   for (int64_t c = 0; c < hid; ++c) xs[r * hid + c] = src[c * xcs];
                 }
               });
  std::vector<kernels::WtGroup> g1(static_cast<size_t>(e_count)), g2(static_cast<size_t>(e_count));
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t r0 = start[static_cast<size_t>(e)], n = start[static_cast<size_t>(e) + 1] - r0;
    g1[static_cast<size_t>(e)] = {n, xs + r0 * hid, static_cast<const uint16_t*>(w1.raw_data()) + e * w1.strides()[0],
                                  h + r0 * 2 * f};
    g2[static_cast<size_t>(e)] = {n, act + r0 * f, static_cast<const uint16_t*>(w2.raw_data()) + e * w2.strides()[0],
                                  y + r0 * hid};
  }
  if (!kernels::gemm_bf16_amx_wt_grouped(2 * f, hid, g1.data(), e_count, hid, 1, w1.strides()[1], 2 * f, false))
    return false;
  const ops::cpu::VecMathTable& vm = ops::cpu::vec_math();
  parallel_for(0, slots, std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(f, 1)),
               [&](int64_t b, int64_t end) {
                 for (int64_t r = b; r < end; ++r) {
                   float* gate = h + r * 2 * f;  // silu(gate) * up, in place in the gate half
                   vm.get(ops::cpu::VecUnary::silu)(gate, gate, f);
                   vm.get(ops::cpu::VecBinary::mul)(gate, gate, gate + f, false, 1.0f, f);
                   for (int64_t c = 0; c < f; ++c) act[r * f + c] = bf16(gate[c]).bits;
                 }
               });
  if (!kernels::gemm_bf16_amx_wt_grouped(hid, f, g2.data(), e_count, f, 1, w2.strides()[1], hid, false)) return false;
  // Columns split the work: a token's slots (at most k, in expert order) add into its row in turn.
  parallel_for(0, hid, std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(slots, 1)),
               [&](int64_t b, int64_t end) {
                 for (int64_t r = 0; r < slots; ++r) {
                   const int64_t s = order[static_cast<size_t>(r)];
                   const float wt = gate_w[static_cast<size_t>(s)];
                   float* o = acc + (s / k) * hid;
                   const float* yr = y + r * hid;
                   for (int64_t c = b; c < end; ++c) o[c] += wt * yr[c];
                 }
               });
  return true;
}

// The fused layer on the host for T = float or bf16 (see the file comment).
template <class T>
void moe_ffn_fused(const ops::KernelArgs& a) {
  const Tensor &x = a.inputs[0], &w = a.inputs[2], &w1 = a.inputs[3], &w2 = a.inputs[4];
  const Tensor& out = a.outputs[0];
  const int64_t e_count = a.attrs.get_int("num_experts"), k = a.attrs.get_int("top_k");
  const int64_t tokens = x.size(0), hid = x.size(1), f = w2.size(2);
  const std::vector<int32_t> ids = moe_ffn_read_ids(a.inputs[1], e_count);
  // Slots stably sorted by expert (moe_sort's order), each expert's range in it.
  std::vector<int64_t> start(static_cast<size_t>(e_count) + 1, 0);
  for (int32_t id : ids) ++start[static_cast<size_t>(id) + 1];
  for (size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
  std::vector<int64_t> order(ids.size());
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (size_t s = 0; s < ids.size(); ++s) order[static_cast<size_t>(next[static_cast<size_t>(ids[s])]++)] =
        static_cast<int64_t>(s);
  }
  std::vector<float> gate_w(ids.size());
  const T* wp = static_cast<const T*>(w.raw_data());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j)
      gate_w[static_cast<size_t>(t * k + j)] = static_cast<float>(wp[t * w.strides()[0] + j * w.strides()[1]]);
  std::vector<float> acc;
  float* dst = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    dst = static_cast<float*>(out.raw_data());
    std::fill(dst, dst + tokens * hid, 0.0f);
  } else {
    acc.assign(static_cast<size_t>(tokens * hid), 0.0f);
    dst = acc.data();
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (moe_ffn_grouped_bf16(a, start, order, gate_w, dst)) return moe_ffn_round(a, dst);
  }
  const auto tile = static_cast<size_t>(kMoeFfnTile);
  std::vector<T> xt(tile * static_cast<size_t>(hid)), at(tile * static_cast<size_t>(f));
  std::vector<float> ht(tile * static_cast<size_t>(2 * f)), yt(tile * static_cast<size_t>(hid));
  const ops::cpu::VecMathTable& vm = ops::cpu::vec_math();
  const T* xp = static_cast<const T*>(x.raw_data());
  const int64_t xrs = x.strides()[0], xcs = x.strides()[1];
  for (int64_t e = 0; e < e_count; ++e) {
    for (int64_t r0 = start[static_cast<size_t>(e)]; r0 < start[static_cast<size_t>(e) + 1]; r0 += kMoeFfnTile) {
      const int64_t m = std::min(kMoeFfnTile, start[static_cast<size_t>(e) + 1] - r0);
      const int64_t* slots = order.data() + r0;
      // Gather the tile's token rows.
      parallel_for(0, m * hid, ops::cpu::kParallelGrain, [&](int64_t b, int64_t end) {
        for (int64_t i = b; i < end; ++i) {
          const int64_t r = i / hid, c = i % hid;
          xt[static_cast<size_t>(i)] = xp[(slots[r] / k) * xrs + c * xcs];
        }
      });
      // [m, 2F] = xt gate_up[e]^T; then silu(gate) * up, rounded to T for the down GEMM.
      moe_ffn_gemm<T>(m, 2 * f, hid, xt.data(), w1, e, w1.strides()[2], w1.strides()[1], ht.data());
      parallel_for(0, m, std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(f, 1)),
                   [&](int64_t b, int64_t end) {
                     for (int64_t r = b; r < end; ++r) {
                       float* gate = ht.data() + r * 2 * f;  // silu(gate) * up, in place in the gate half
                       vm.get(ops::cpu::VecUnary::silu)(gate, gate, f);
                       vm.get(ops::cpu::VecBinary::mul)(gate, gate, gate + f, false, 1.0f, f);
                       T* dst_row = at.data() + r * f;
                       for (int64_t c = 0; c < f; ++c) dst_row[c] = T(gate[c]);
                     }
                   });
      // [m, H] = at down[e]^T, added with each slot's weight into its token's row (one tile
      // never holds a token twice unless its ids repeat an expert: columns split the work).
      moe_ffn_gemm<T>(m, hid, f, at.data(), w2, e, w2.strides()[2], w2.strides()[1], yt.data());
      parallel_for(0, hid, std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(m, 1)),
                        [&](int64_t b, int64_t end) {
                          for (int64_t r = 0; r < m; ++r) {
                            const float wt = gate_w[static_cast<size_t>(slots[r])];
                            float* o = dst + (slots[r] / k) * hid;
                            const float* y = yt.data() + r * hid;
                            for (int64_t c = b; c < end; ++c) o[c] += wt * y[c];
                          }
                        });
    }
  }
  if constexpr (!std::is_same_v<T, float>) moe_ffn_round(a, dst);
}

void moe_ffn_run(const ops::KernelArgs& a) {
  const DType dt = a.inputs[0].dtype();
  const bool same = a.inputs[2].dtype() == dt && a.inputs[3].dtype() == dt && a.inputs[4].dtype() == dt &&
                    a.outputs[0].dtype() == dt;
  if (same && a.outputs[0].is_contiguous() && dt == DType::f32) return moe_ffn_fused<float>(a);
  if (same && a.outputs[0].is_contiguous() && dt == DType::bf16) return moe_ffn_fused<bf16>(a);
  moe_ffn_chain(a);
}

TPU_DEFINE_OP(moe_ffn_op, {.name = kMoeFfn, .num_inputs = 5, .flags = ops::kNonDifferentiable, .meta = &moe_ffn_meta,
                           .cpu = &moe_ffn_run,
                           .doc = "a mixture-of-experts layer after its router (graph pass fuse_moe): sort, permute, "
                                  "SwiGLU experts as two grouped matmuls, weighted unpermute"});

bool is_op(const Node* n, const char* name) { return n != nullptr && !n->dead && n->op->name == name; }

// A slice of dim 1 (of a 2-D value) [start, end) with step 1.
bool is_cols(const Graph& g, const Node* n, ValueId of, int64_t start, int64_t end) {
  if (!is_op(n, "slice") || n->inputs[0] != of || g.meta(of).shape.ndim() != 2) return false;
  const int64_t d = n->attrs.get_int("dim");
  return (d == 1 || d == -1) && n->attrs.get_int("start") == start && n->attrs.get_int("end") == end &&
         n->attrs.get_int("step") == 1;
}

}  // namespace

int fuse_moe(Graph& g) {
  int changes = 0;
  std::vector<int32_t> uses = g.use_counts();
  auto used = [&](ValueId v) { return uses[static_cast<size_t>(v)]; };
  for (Node& u : g.nodes) {
    if (u.dead || u.op->name != "moe_unpermute" || !u.attrs.get_bool("has_weights")) continue;
    const Device dev = g.meta(u.outputs[0]).device;
    if (dev.type != DeviceType::cpu && dev.type != DeviceType::sim) continue;
    const ValueId ys = u.inputs[0], order = u.inputs[1], w = u.inputs[2];
    const int64_t k = u.attrs.get_int("top_k");
    Node* g2 = g.producer(ys);
    if (!is_op(g2, "grouped_matmul") || !g2->attrs.get_bool("transpose_w") || used(ys) != 1) continue;
    const ValueId act = g2->inputs[0], w2 = g2->inputs[1], sizes = g2->inputs[2];
    Node* mul_n = g.producer(act);
    if (!is_op(mul_n, "mul") || used(act) != 1) continue;
    Node* silu_n = g.producer(mul_n->inputs[0]);
    Node* up = g.producer(mul_n->inputs[1]);
    if (!is_op(silu_n, "silu") || used(mul_n->inputs[0]) != 1 || up == nullptr || used(mul_n->inputs[1]) != 1) continue;
    Node* gate = g.producer(silu_n->inputs[0]);
    if (gate == nullptr || used(silu_n->inputs[0]) != 1) continue;
    const ValueId h = gate->inputs.empty() ? kNoValue : gate->inputs[0];
    if (h == kNoValue || g.meta(h).shape.ndim() != 2) continue;
    const int64_t f = g.meta(h).shape[1] / 2;
    if (!is_cols(g, gate, h, 0, f) || !is_cols(g, up, h, f, 2 * f) || used(h) != 2) continue;
    Node* g1 = g.producer(h);
    if (!is_op(g1, "grouped_matmul") || !g1->attrs.get_bool("transpose_w") || g1->inputs[2] != sizes) continue;
    const ValueId xs = g1->inputs[0], w1 = g1->inputs[1];
    Node* perm = g.producer(xs);
    if (!is_op(perm, "moe_permute") || used(xs) != 1 || perm->inputs[1] != order || perm->attrs.get_int("top_k") != k)
      continue;
    Node* sort = g.producer(order);
    if (!is_op(sort, "moe_sort") || sort->outputs.size() != 2 || sort->outputs[1] != sizes || used(order) != 2 ||
        used(sizes) != 2)
      continue;
    const ValueId x = perm->inputs[0], ids = sort->inputs[0];
    const int64_t e = sort->attrs.get_int("num_experts");
    // The fused node must give what the chain gave (shape, dtype, device).
    const ValueMeta& mx = g.meta(x);
    const ValueMeta& mo = g.meta(u.outputs[0]);
    if (mo.dtype != mx.dtype || g.meta(w).dtype != mx.dtype || g.meta(w1).dtype != mx.dtype ||
        g.meta(w2).dtype != mx.dtype || g.meta(ids).shape.ndim() != 2 || g.meta(ids).shape[1] != k ||
        g.meta(w1).shape.ndim() != 3 || g.meta(w1).shape[0] != e || g.meta(w1).shape[1] != 2 * f ||
        g.meta(w2).shape.ndim() != 3 || g.meta(w2).shape[0] != e || g.meta(w2).shape[2] != f)
      continue;
    for (Node* n : {g2, mul_n, silu_n, up, gate, g1, perm, sort}) n->dead = true;
    // The unpermute becomes the fused node in place (its inputs all come before it).
    u.op = &moe_ffn_op();
    u.inputs = {x, ids, w, w1, w2};
    u.attrs = ops::Attrs{{"num_experts", e}, {"top_k", k}};
    u.region = -1;
    uses = g.use_counts();
    ++changes;
  }
  if (changes) g.compact();
  return changes;
}

}  // namespace tpu::graph
