// The fused mixture-of-experts layer node: the chain a SparseMoE block traces after its router,
//
//   order, sizes = moe_sort(ids)            xs = moe_permute(x, order, k)
//   h = grouped_matmul(xs, gate_up, sizes)  a = silu(h[:, :F]) * h[:, F:]
//   ys = grouped_matmul(a, down, sizes)     out = moe_unpermute(ys, order, w, k)
//
// becomes one node moe_ffn(x, ids, w, gate_up, down) when no value inside the chain is read
// elsewhere (an inference graph: a training graph keeps them for its backward, and stays as
// traced). Its kernel runs the same ops one after the other on the node's device (the cpu
// kernels, or the chip programs of a sim device), with no graph values in between, so the
// result equals the chain's. Only cpu and sim graphs (the PJRT export lowers the chain itself).
#include "graph/passes/passes.h"
#include "tpucore/ops.h"

namespace tpu::graph {
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

// The chain, op by op, on the inputs' device.
void moe_ffn_run(const ops::KernelArgs& a) {
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

TPU_DEFINE_OP(moe_ffn_op, {.name = kMoeFfn, .num_inputs = 5, .flags = ops::kNonDifferentiable, .meta = &moe_ffn_meta,
                           .cpu = &moe_ffn_run,
                           .doc = "a mixture-of-experts layer after its router (graph pass fuse_moe): sort, permute, "
                                  "SwiGLU experts as two grouped matmuls, weighted unpermute"});

const bool g_moe_ffn_sim = [] {
  ops::register_kernel(kMoeFfn, DeviceType::sim, &moe_ffn_run);
  return true;
}();

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
