// Expert parallelism: the dispatch and combine all-to-alls around a block's local experts.
#include "tpucore/nn/parallel/expert_parallel.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>

#include "ops/hot_rows.h"
#include "tpucore/autograd.h"
#include "tpucore/nn/parallel/function.h"
#include "tpucore/nn/parallel/tensor_parallel.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel {

using detail::attach_backward;
using detail::collective_buffer;
using detail::recording;

namespace {

// The experts blocks expert_parallel sharded (their weights are not replicated over the group).
std::mutex g_ep_mu;
std::map<const Module*, std::weak_ptr<Module>>& ep_experts() {
  static std::map<const Module*, std::weak_ptr<Module>> m;
  return m;
}


Tensor ep_exchange_rows(const Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                     const dist::ProcessGroupPtr& g) {
  NoGradGuard ng;
  Shape s = x.shape();
  s[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  Tensor out = collective_buffer(s, TensorOptions(x.dtype(), x.device()));
  g->all_to_all_single(out, x.detach().contiguous(), out_splits, in_splits);
  return out;
}

// Identity forward, gradient times `scale` in backward.
Tensor ep_scale_grad(const Tensor& x, double scale) {
  if (scale == 1.0) return x;
  Tensor ins[1] = {x}, outs[1] = {detail::fresh_alias(x)};
  attach_backward("ep_scale_grad", ins, outs, [scale](std::span<const Tensor> go, std::span<Tensor> gi) {
    gi[0] = mul(go[0], scale);
  }, true);
  return outs[0];
}

std::vector<int64_t> ep_host_i64(const Tensor& t) {
  return t.to(Device{}).to(DType::i64).contiguous().to_vector<int64_t>();
}

// The per-expert state of a block made expert-parallel: its options and the dropped-slot count
// of its last forward.
struct EpState {
  std::shared_ptr<MoEExperts> experts;
  int64_t num_experts = 0;
  dist::ProcessGroupPtr group;
  ExpertParallelOptions opts;
  Tensor dropped;
};
std::map<const SparseMoE*, std::weak_ptr<EpState>>& ep_states() {
  static std::map<const SparseMoE*, std::weak_ptr<EpState>> m;
  return m;
}

// The fixed-capacity exchange (the path of tpu::compile, static shapes): every rank sends each
// peer a buffer of C rows (its slots for the peer's experts, then zero padding) and the
// per-expert counts; the receiver sorts the rows it got by local expert (the padding joins the
// last expert's group: zero rows, whose outputs are zero and never read), runs one
// grouped_matmul, and the reverse exchange brings the outputs back. Slots beyond C rows for a
// peer are dropped (their output is zero); their count goes to st.dropped.
Tensor ep_run_fixed(const Tensor& xs, const Tensor& group_sizes, EpState& st) {
  const dist::ProcessGroupPtr& g = st.group;
  const int n = g->size();
  const int64_t e = st.num_experts, local = e / n, slots = xs.size(0);
  TPU_CHECK(group_sizes.dim() == 1 && group_sizes.size(0) == e, "expert_parallel: group sizes {} for {} experts",
            group_sizes.shape(), e);
  int64_t cap = slots;
  if (st.opts.capacity_factor > 0)
    cap = std::min<int64_t>(slots, static_cast<int64_t>(std::ceil(st.opts.capacity_factor * static_cast<double>(slots) /
                                                                   static_cast<double>(n))));
  cap = std::max<int64_t>(cap, 1);
  TPU_CHECK(slots > 0, "expert_parallel: a forward without tokens");
  const Device dev = xs.device();
  // The index arithmetic runs in f32 (the chip's vector unit has no integer arithmetic): exact
  // for integers up to 2^24, and every value below is at most max(slots + cap, n cap).
  TPU_CHECK(slots + cap <= (int64_t{1} << 24) && n * cap <= (int64_t{1} << 24),
            "expert_parallel: the fixed-capacity exchange counts rows in f32, exact up to 2^24 = 16777216; "
            "{} slots with a capacity of {} rows per rank on {} ranks exceed it", slots, cap, n);
  const auto f32 = TensorOptions(DType::f32, dev);
  auto iota = [&](int64_t m) { return ops::f32_iota(m, dev); };  // no integer arange on the chip
  auto as_f32 = [](const Tensor& t) { return tpu::to(t, DType::f32); };
  Tensor counts, theirs;
  {
    NoGradGuard ng;
    counts = as_f32(group_sizes.detach()).to(dev).contiguous();
    theirs = collective_buffer(Shape{e}, f32);  // [source rank][local expert]
    g->all_to_all_single(theirs, counts);
  }
  // The sender's side: per destination rank j, its slot count and the first of its slots.
  const Tensor per_rank = sum(reshape(counts, Shape{n, local}), {-1});  // [n]
  const Tensor seg_end = cumsum(per_rank, 0);                           // inclusive
  const Tensor seg_start = sub(seg_end, per_rank);
  const Tensor r_cap = reshape(iota(cap), Shape{1, cap});               // [1, C]
  const Tensor want = add(unsqueeze(seg_start, 1), r_cap);              // [n, C]
  const Tensor sent_ok = reshape(lt(r_cap, unsqueeze(per_rank, 1)), Shape{n * cap});
  const Tensor src_row = tpu::to(reshape(clamp(want, 0.0, static_cast<double>(slots - 1)), Shape{n * cap}), DType::i32);
  Tensor send = where(unsqueeze(sent_ok, 1), index_select(xs, 0, src_row), 0.0);
  const std::vector<int64_t> blocks(static_cast<size_t>(n), cap);
  Tensor got = all_to_all_rows(send, blocks, blocks, g);  // [n C, H]: block i from rank i
  // The receiver's side: the local expert of every row (padding: the last one), stably sorted.
  const Tensor cum = cumsum(reshape(theirs, Shape{n, local}), 1);  // [n, local]
  const Tensor r3 = reshape(iota(cap), Shape{1, cap, 1});
  Tensor key = sum(as_f32(ge(r3, unsqueeze(cum, 1))), {-1});  // [n, C]
  key = tpu::to(reshape(clamp(key, 0.0, static_cast<double>(local - 1)), Shape{n * cap, 1}), DType::i32);
  const Tensor got_ok = reshape(lt(reshape(r3, Shape{1, cap}), narrow(cum, 1, local - 1, 1)), Shape{n * cap});
  got = where(unsqueeze(got_ok, 1), got, 0.0);
  auto [ord, sizes] = moe_sort(key, local);
  // The local experts serve the whole group: their weight gradients are scaled by 1/n (the mean
  // of the ranks' losses), the gradients sent back to the ranks are not.
  const Tensor grouped = ep_scale_grad(moe_permute(got, ord, 1), static_cast<double>(n));
  MoEExperts& experts = *st.experts;
  const Tensor gs = group_sizes.dtype() == sizes.dtype() ? sizes : tpu::to(sizes, group_sizes.dtype());
  Tensor ys = experts.call({grouped, gs}, [&](std::span<const Tensor> in) { return experts.forward(in[0], in[1]); });
  ys = moe_unpermute(ep_scale_grad(ys, 1.0 / n), ord, Tensor(), 1);
  if (ys.dtype() != xs.dtype()) ys = tpu::to(ys, xs.dtype());
  const Tensor back = all_to_all_rows(ys, blocks, blocks, g);  // block j: my rows rank j ran
  // Every slot's row in `back`: block j(s) (its expert's rank), row s - seg_start[j(s)].
  const Tensor s_idx = unsqueeze(iota(slots), 1);                                 // [S, 1]
  const Tensor j = clamp(sum(as_f32(ge(s_idx, unsqueeze(seg_end, 0))), {-1}, true), 0.0,
                         static_cast<double>(n - 1));                             // [S, 1]
  // seg_start[j(s)] as a sum against the one-hot row of j(s) (one term: exact).
  const Tensor start_of = sum(mul(as_f32(eq(j, unsqueeze(iota(n), 0))), unsqueeze(seg_start, 0)), {-1}, true);
  const Tensor off = sub(s_idx, start_of);                                        // [S, 1]
  const Tensor kept = reshape(lt(off, static_cast<double>(cap)), Shape{slots, 1});
  const Tensor row = tpu::to(reshape(add(mul(j, static_cast<double>(cap)), clamp(off, 0.0, static_cast<double>(cap - 1))),
                                     Shape{slots}), DType::i32);
  Tensor out = where(kept, index_select(back, 0, row), 0.0);
  {
    NoGradGuard ng;
    st.dropped = tpu::to(sum(clamp(sub(per_rank, static_cast<double>(cap)), 0.0, std::nullopt)), DType::i32);
  }
  return out;
}

// The slots of this rank, sorted by global expert (group_sizes [E]), through the group's
// experts and back in the same order.
Tensor ep_run_experts(const Tensor& xs, const Tensor& group_sizes, MoEExperts& experts, int64_t num_experts,
                      const dist::ProcessGroupPtr& g) {
  const int n = g->size();
  const int64_t local = num_experts / n;
  const std::vector<int64_t> counts = ep_host_i64(group_sizes);
  TPU_CHECK(static_cast<int64_t>(counts.size()) == num_experts, "expert_parallel: {} group sizes for {} experts",
            counts.size(), num_experts);
  // Every rank learns how many of its slots each rank sends to each of its local experts.
  // As i32 on the slots' device (the sim pod's ICI carries no i64).
  std::vector<int32_t> counts32(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    TPU_CHECK(counts[e] >= 0 && counts[e] <= INT32_MAX, "expert_parallel: expert {} has {} slots", e, counts[e]);
    counts32[e] = static_cast<int32_t>(counts[e]);
  }
  Tensor mine = from_vector(counts32, Shape{num_experts}).to(xs.device());
  Tensor theirs = empty(Shape{num_experts}, TensorOptions(DType::i32, xs.device()));
  g->all_to_all_single(theirs, mine);
  const std::vector<int64_t> recv_counts = ep_host_i64(theirs);  // [source rank][local expert]
  std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    send[static_cast<size_t>(e / local)] += counts[static_cast<size_t>(e)];
    recv[static_cast<size_t>(e / local)] += recv_counts[static_cast<size_t>(e)];
  }
  const Tensor got = all_to_all_rows(xs, recv, send, g);  // by source rank, then local expert
  // Regroup by local expert (then source rank) for one grouped_matmul.
  std::vector<int64_t> start(static_cast<size_t>(num_experts), 0);
  for (size_t b = 1; b < start.size(); ++b) start[b] = start[b - 1] + recv_counts[b - 1];
  std::vector<int32_t> order;
  std::vector<int64_t> local_sizes(static_cast<size_t>(local), 0);
  order.reserve(static_cast<size_t>(got.size(0)));
  for (int64_t l = 0; l < local; ++l)
    for (int i = 0; i < n; ++i) {
      const auto b = static_cast<size_t>(i * local + l);
      for (int64_t r = 0; r < recv_counts[b]; ++r) order.push_back(static_cast<int32_t>(start[b] + r));
      local_sizes[static_cast<size_t>(l)] += recv_counts[b];
    }
  const Tensor ord = from_vector(order, Shape{static_cast<int64_t>(order.size())}).to(xs.device());
  const Tensor sizes = from_vector(local_sizes, Shape{local}).to(group_sizes.dtype()).to(group_sizes.device());
  // The local experts serve the whole group: their weight gradients are scaled by 1/n (the mean
  // of the ranks' losses), the gradients sent back to the ranks are not.
  const Tensor grouped = ep_scale_grad(moe_permute(got, ord, 1), static_cast<double>(n));
  Tensor ys = experts.call({grouped, sizes}, [&](std::span<const Tensor> in) { return experts.forward(in[0], in[1]); });
  ys = moe_unpermute(ep_scale_grad(ys, 1.0 / n), ord, Tensor(), 1);
  if (ys.dtype() != xs.dtype()) ys = tpu::to(ys, xs.dtype());
  return all_to_all_rows(ys, send, recv, g);
}

// This rank's experts [r k, (r + 1) k) of a stacked weight, as a new leaf.
Tensor ep_local_experts(const Tensor& full, int rank, int64_t k) {
  NoGradGuard ng;
  Tensor t = narrow(full.detach(), 0, rank * k, k).contiguous().clone();
  t.requires_grad_(full.requires_grad());
  return t;
}

// The experts blocks expert_tensor_parallel split (an expired entry is a freed block).
std::map<const Module*, std::weak_ptr<Module>>& ep_tp_split() {
  static std::map<const Module*, std::weak_ptr<Module>> m;
  return m;
}

// Sum over the group; the backward sums the gradients over the group as well (each rank's
// loss holds the sum, and the ranks' gradients are averaged afterwards).
Tensor ep_all_reduce_sum(const Tensor& x, const dist::ProcessGroupPtr& g) {
  auto run = [g](const Tensor& t) {
    NoGradGuard ng;
    Tensor o = t.detach().contiguous().clone();
    g->all_reduce(o, dist::ReduceOp::sum);
    return o;
  };
  Tensor ins[1] = {x}, outs[1] = {run(x)};
  attach_backward("ep_all_reduce_sum", ins, outs, [run](std::span<const Tensor> go, std::span<Tensor> gi) {
    gi[0] = run(go[0]);
  }, true);
  return outs[0];
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                       const dist::ProcessGroupPtr& group) {
  TPU_CHECK(x.defined() && x.dim() >= 1, "all_to_all_rows: expected a tensor with a dim 0, got {}",
            x.defined() ? x.shape().str() : std::string("undefined"));
  Tensor ins[1] = {x}, outs[1] = {ep_exchange_rows(x, out_splits, in_splits, group)};
  attach_backward("ep_all_to_all", ins, outs,
                  [group, out_splits, in_splits](std::span<const Tensor> go, std::span<Tensor> gi) {
                    gi[0] = ep_exchange_rows(go[0], in_splits, out_splits, group);
                  }, true);
  return outs[0];
}

void expert_parallel(SparseMoE& moe, const dist::ProcessGroupPtr& group, const ExpertParallelOptions& opts) {
  TPU_CHECK(opts.capacity_factor >= 0 && std::isfinite(opts.capacity_factor),
            "expert_parallel: capacity_factor must be a finite value >= 0, got {}", opts.capacity_factor);
  TPU_CHECK(group != nullptr && group->is_member(), "expert_parallel: this rank is not a member of the group");
  TPU_CHECK(!moe.run_experts, "expert_parallel: the block's experts are already distributed");
  const int n = group->size();
  const int64_t e = moe.cfg.num_experts;
  TPU_CHECK(e % n == 0, "expert_parallel: {} experts do not split evenly over {} ranks", e, n);
  const int64_t k = e / n;
  MoEExperts& ex = *moe.experts;
  TPU_CHECK(ex.gate_up_proj.size(0) == e && ex.down_proj.size(0) == e,
            "expert_parallel: the experts hold {} and {} stacked matrices, expected {}", ex.gate_up_proj.size(0),
            ex.down_proj.size(0), e);
  ex.gate_up_proj = ep_local_experts(ex.gate_up_proj, group->rank(), k);
  ex.down_proj = ep_local_experts(ex.down_proj, group->rank(), k);
  std::shared_ptr<MoEExperts> experts = moe.experts;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    ep_experts()[experts.get()] = experts;
  }
  auto st = std::make_shared<EpState>();
  st->experts = experts;
  st->num_experts = e;
  st->group = group;
  st->opts = opts;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    ep_states()[&moe] = st;
  }
  moe.run_experts = [st](const Tensor& xs, const Tensor& sizes) {
    if (xs.is_proxy() || recording() || st->opts.fixed_capacity || st->opts.capacity_factor > 0)
      return ep_run_fixed(xs, sizes, *st);
    st->dropped = Tensor();
    return ep_run_experts(xs, sizes, *st->experts, st->num_experts, st->group);
  };
}

void expert_tensor_parallel(SparseMoE& moe, const dist::ProcessGroupPtr& group) {
  TPU_CHECK(group != nullptr && group->is_member(), "expert_tensor_parallel: this rank is not a member of the group");
  MoEExperts& ex = *moe.experts;
  const int n = group->size(), r = group->rank();
  const int64_t f = ex.down_proj.size(2);
  TPU_CHECK(f % n == 0 && ex.gate_up_proj.size(1) == 2 * f,
            "expert_tensor_parallel: the experts' intermediate size {} does not split over {} ranks", f, n);
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    auto it = ep_tp_split().find(&ex);
    TPU_CHECK(it == ep_tp_split().end() || it->second.expired(), "expert_tensor_parallel: the block's experts are "
              "already split over a tensor-parallel group");
    ep_tp_split()[&ex] = moe.experts;
  }
  const int64_t k = f / n;
  {
    NoGradGuard ng;
    const Tensor gu = ex.gate_up_proj.detach();
    Tensor gate_up = cat({narrow(gu, 1, r * k, k), narrow(gu, 1, f + r * k, k)}, 1).contiguous().clone();
    Tensor down = narrow(ex.down_proj.detach(), 2, r * k, k).contiguous().clone();
    gate_up.requires_grad_(ex.gate_up_proj.requires_grad());
    down.requires_grad_(ex.down_proj.requires_grad());
    ex.gate_up_proj = gate_up;
    ex.down_proj = down;
  }
  ex.register_forward_pre_hook([group](Module&, std::vector<Tensor>& x) { x[0] = copy_to_tp(x[0], group); });
  ex.register_forward_hook([group](Module&, std::span<const Tensor>, Tensor& y) { y = reduce_from_tp(y, group); });
}

Tensor expert_parallel_dropped(const SparseMoE& moe) {
  std::lock_guard<std::mutex> lock(g_ep_mu);
  auto it = ep_states().find(&moe);
  auto st = it == ep_states().end() ? nullptr : it->second.lock();
  TPU_CHECK(st != nullptr, "expert_parallel_dropped: the block is not expert-parallel");
  return st->dropped;
}

int expert_parallel(Module& root, const dist::ProcessGroupPtr& group, const ExpertParallelOptions& opts) {
  int count = 0;
  if (auto* m = dynamic_cast<SparseMoE*>(&root)) {
    expert_parallel(*m, group, opts);
    ++count;
  }
  for (auto& [name, m] : root.named_modules())
    if (auto* s = dynamic_cast<SparseMoE*>(m.get())) {
      expert_parallel(*s, group, opts);
      ++count;
    }
  TPU_CHECK(count > 0, "expert_parallel: the {} has no mixture-of-experts (SparseMoE) blocks", root.type_name());
  return count;
}

Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                           const dist::ProcessGroupPtr& group) {
  TPU_CHECK(group != nullptr && group->is_member(), "load_balancing_loss: this rank is not a member of the group");
  TPU_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits (run a forward of a model with "
            "mixture-of-experts layers first)");
  TPU_CHECK(top_k >= 1 && top_k <= num_experts, "load_balancing_loss: top_k {} is outside [1, {}]", top_k, num_experts);
  for (const Tensor& l : router_logits)
    TPU_CHECK(l.defined() && l.dim() == 2 && l.size(1) == num_experts,
              "load_balancing_loss: router logits must be [tokens, {}] tensors, got {}", num_experts,
              l.defined() ? l.shape().str() : std::string("undefined"));
  const Tensor logits = tpu::to(router_logits.size() == 1 ? router_logits[0] : cat(router_logits, 0), DType::f32);
  const Tensor p = softmax(logits, -1);
  const Device dev = logits.device();
  // The per-expert counts of the chosen slots [k, E] and the token count, summed over the group
  // in one all-reduce (constants: the choices carry no gradient).
  Tensor counts, tokens;
  {
    NoGradGuard ng;
    // One-hot rows as f32 from a comparison with an iota (the chip runs it; one_hot is integer).
    const Tensor chosen = tpu::to(ops::hot_rows(std::get<1>(topk(p, top_k)), num_experts), DType::f32);  // [N, k, E]
    Tensor packed = cat({reshape(sum(chosen, {0}), Shape{-1}),
                         full(Shape{1}, static_cast<double>(logits.size(0)), TensorOptions(DType::f32, dev))},
                        0).contiguous();
    group->all_reduce(packed, dist::ReduceOp::sum);
    tokens = narrow(packed, 0, top_k * num_experts, 1);  // [1]
    counts = reshape(narrow(packed, 0, 0, top_k * num_experts), Shape{top_k, num_experts});
  }
  // Inside tpu::compile every shape is known: the group's token count is checked where it is a
  // host value.
  if (!tokens.is_proxy() && !recording())
    TPU_CHECK(tokens.to(Device{}).item<double>() > 0, "load_balancing_loss: the group routed no tokens");
  // The probability sums [E], summed over the group (differentiable).
  const Tensor probs = ep_all_reduce_sum(sum(p, {0}), group);
  const Tensor frac = div(counts, tokens), mean_p = reshape(div(probs, tokens), Shape{1, num_experts});
  return mul(sum(mul(frac, mean_p)), static_cast<double>(num_experts));
}

Tensor load_balancing_loss(Module& root, const dist::ProcessGroupPtr& group) {
  std::vector<Tensor> logits;
  int64_t experts = 0, k = 0;
  auto visit = [&](Module& m) {
    auto* s = dynamic_cast<SparseMoE*>(&m);
    if (s == nullptr) return;
    TPU_CHECK(logits.empty() || (s->cfg.num_experts == experts && s->cfg.top_k == k),
              "load_balancing_loss: the sparse blocks differ in experts or top-k ({} of {} vs {} of {})", s->cfg.top_k,
              s->cfg.num_experts, k, experts);
    experts = s->cfg.num_experts;
    k = s->cfg.top_k;
    logits.push_back(s->router_logits);
  };
  visit(root);
  for (auto& [name, m] : root.named_modules()) visit(*m);
  TPU_CHECK(!logits.empty(), "load_balancing_loss: the {} has no mixture-of-experts (SparseMoE) blocks",
            root.type_name());
  return load_balancing_loss(logits, experts, k, group);
}

void sync_replicated_gradients(Module& root, const dist::ProcessGroupPtr& group) {
  TPU_CHECK(group != nullptr && group->is_member(), "sync_replicated_gradients: this rank is not a member of the group");
  std::set<const Tensor*> skip;
  {
    std::lock_guard<std::mutex> lock(g_ep_mu);
    auto visit = [&](Module& m) {
      auto it = ep_experts().find(&m);
      if (it == ep_experts().end() || it->second.expired()) return;
      for (auto& [n, slot] : m.parameter_slots(false)) skip.insert(slot);
    };
    visit(root);
    for (auto& [name, m] : root.named_modules()) visit(*m);
  }
  std::vector<Tensor> params;
  std::vector<Tensor> flats;
  for (auto& [name, slot] : root.parameter_slots(true)) {
    if (skip.count(slot) || !slot->requires_grad() || !is_floating(slot->dtype())) continue;
    params.push_back(*slot);
    const Tensor g = slot->grad();
    flats.push_back(reshape(g.defined() ? tpu::to(g, DType::f32) : zeros(slot->shape(), TensorOptions(DType::f32, slot->device())), Shape{-1}));
  }
  if (params.empty()) return;
  NoGradGuard ng;
  Tensor flat = cat(flats, 0).contiguous();
  group->all_reduce(flat, dist::ReduceOp::avg);
  int64_t off = 0;
  for (Tensor& p : params) {
    const int64_t numel = p.numel();
    Tensor avg = tpu::to(reshape(narrow(flat, 0, off, numel), p.shape()), p.dtype());
    off += numel;
    Tensor g = p.grad();
    if (g.defined()) g.copy_(avg);
    else p.set_grad(avg.contiguous().clone());
  }
}

}  // namespace tpu::nn::parallel
