// Functionalization of in-place writes while tracing (as torch.func.functionalize). Every in-place
// op ends in copy_(self, new_value); the tracer records the new value out of place and rebinds:
//   - a root (a proxy made by a non-view op, an argument, a captured real tensor) takes the new
//     value id, and every live view of it is re-derived by replaying its view ops;
//   - a view writes through to its root: the root's new value is the old one with the view's
//     elements replaced (a view that is a block of rows and columns of the root seen as a
//     matrix, as a narrow along one dim: cat of the root's slices around it and the new values;
//     any other view: arange over the root, the same view ops, scatter and where), then the
//     root is rebound as above.
// A graph input written this way is a mutation: the compiled function writes the final value
// back into the real tensor after the graph ran (mutations()).
#include "graph/tracer.h"
#include "ops/meta_util.h"
#include "tpucore/core/hooks.h"
#include "tpucore/ops.h"

namespace tpu::graph {
namespace {

void traced_copy_hook(const Tensor& self, const Tensor& src) {
  auto* t = dynamic_cast<Tracer*>(ops::interceptor());
  if (!t) {
    const Tensor& p = self.is_proxy() ? self : src;
    TPU_CHECK(!p.is_proxy() || !p.impl().trace->tracer,
              "copy_: a traced tensor ({}) from a finished trace was used; tensors made inside a compiled function "
              "must not be kept across calls",
              ops::describe(p));
    fail("copy_: a traced (proxy) tensor ({}) was used outside of tracing", ops::describe(p));
  }
  t->functional_copy(self, src);
}

bool proxy_contiguous_hook(const Tensor& proxy) {
  auto* t = dynamic_cast<Tracer*>(ops::interceptor());
  return t && t->eager_contiguous(proxy);
}

[[maybe_unused]] const bool g_copy_hook_installed = (detail::set_traced_copy_hook(&traced_copy_hook),
                                                     detail::set_proxy_contiguous_hook(&proxy_contiguous_hook), true);

Tensor apply_view(const Tensor& x, const ViewStep& s) { return apply_view_step(x, s); }

}  // namespace

Tensor apply_view_step(const Tensor& x, const ViewStep& s) {
  if (s.op->name == "view") return tpu::reshape(x, s.out.shape);
  Tensor out[ops::kMaxOutputs];
  Tensor in[1] = {x};
  ops::call(*s.op, in, s.attrs, out);
  return out[0];
}

std::shared_ptr<TraceValue> Tracer::root_of(const Tensor& t) {
  if (t.is_proxy()) {
    const std::shared_ptr<TraceValue>& tv = t.impl().trace;
    return tv->base ? tv->base : tv;
  }
  value_of(t);  // captures it
  return captured_.at(&t.impl());
}

ValueId Tracer::replay(ValueId v, const std::vector<ViewStep>& chain) {
  for (const ViewStep& s : chain) {
    int n = graph_.add_node(*s.op, {v}, s.attrs, {s.out});
    v = graph_.nodes[static_cast<size_t>(n)].outputs[0];
  }
  return v;
}

void Tracer::rebind_root(TraceValue& root, ValueId v, const TraceValue* skip) {
  root.id = v;
  ++root.version;
  auto& views = root.views;
  size_t keep = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    std::shared_ptr<TraceValue> w = views[i].lock();
    if (!w) continue;
    views[keep++] = views[i];
    if (w.get() == skip) continue;
    w->id = replay(v, w->chain);
    ++w->version;
  }
  views.resize(keep);
}

ValueId Tracer::coerce_source(const Tensor& self, const Tensor& src_in) {
  Tensor src = src_in;
  const char* what = "copy_ (in-place write) inside a compiled function";
  if (src.device() != self.device() && !src.impl().wrapped_number) {
    // fill_ makes its value on the cpu: re-create a traced 'full' on self's device.
    const Node* p = src.is_proxy() ? graph_.producer(src.impl().trace->id) : nullptr;
    TPU_CHECK(p && p->op->name == "full" && src.numel() == 1,
              "{}: copying between devices ({} -> {}) is not supported; move the tensor outside the compiled "
              "function",
              what, src.device().str(), self.device().str());
    src = tpu::full(Shape{}, p->attrs.get_scalar("value"), TensorOptions(src.dtype(), self.device()));
  }
  Shape b = broadcast_shapes(self.shape(), src.shape(), "copy_");
  TPU_CHECK(b == self.shape(), "copy_: source of shape {} cannot be broadcast to the destination's shape {}",
            src.shape().str(), self.shape().str());
  if (src.dtype() != self.dtype()) src = tpu::to(src, self.dtype());
  if (src.shape() != self.shape()) src = tpu::expand(src, self.shape());
  return value_of(src);
}

ValueId Tracer::scatter_into_root(const TraceValue& root, const std::vector<ViewStep>& chain, ValueId v,
                                  const Tensor& self) {
  const ValueMeta rm = graph_.meta(root.id);
  const int64_t n = rm.shape.numel();
  TPU_CHECK(n < (int64_t{1} << 31), "in-place write into a view inside compile: the viewed tensor ({} elements) is too large",
            n);
  // Which root element each view element is (computed now, with the real view ops).
  std::vector<int64_t> pos;
  {
    TraceScope off(nullptr);
    Tensor idx = tpu::reshape(tpu::arange(Scalar(n), TensorOptions(DType::i32)), rm.shape);
    for (const ViewStep& s : chain) idx = apply_view(idx, s);
    for (int32_t p : idx.contiguous().to_vector<int32_t>()) pos.push_back(p);
  }
  std::vector<char> seen(static_cast<size_t>(n), 0);
  bool identity = static_cast<int64_t>(pos.size()) == n;
  for (size_t k = 0; k < pos.size(); ++k) {
    char& s = seen[static_cast<size_t>(pos[k])];
    TPU_CHECK(!s,
              "in-place write into an expanded view ({}) inside a compiled function: several elements share one "
              "memory location; call contiguous() first",
              ops::describe(self));
    s = 1;
    identity = identity && pos[k] == static_cast<int64_t>(k);
  }
  Tensor nv = make_proxy(v);
  if (identity) return value_of(tpu::reshape(nv, rm.shape));  // the view covers the root in order
  const int64_t m = static_cast<int64_t>(pos.size());
  Tensor flat_root = tpu::reshape(make_proxy(root.id), Shape{n});
  Tensor upd = tpu::reshape(nv, Shape{m});
  // 8-bit floats do not compute (no cat, scatter or where): the merge runs in f32, which holds
  // every one of their values, and the result is converted back exactly.
  const bool f8 = is_float8(rm.dtype);
  if (f8) {
    flat_root = tpu::to(flat_root, DType::f32);
    upd = tpu::to(upd, DType::f32);
  }
  // The view is a block of the root seen as [n / S, S]: rows [r0, r0 + A), columns [c0, c0 + L)
  // in order (one run of consecutive elements when A = 1, as a narrow along the first dim or a
  // flat buffer's slot; a narrow along a later dim otherwise). Then the new root is made of
  // slices of the old one and the view's values joined by cat, no index arithmetic.
  if (m > 0) {
    int64_t L = 1;  // the first run of consecutive positions
    while (L < m && pos[static_cast<size_t>(L)] == pos[0] + L) ++L;
    const int64_t S = L < m ? pos[static_cast<size_t>(L)] - pos[0] : n, A = m / L;
    bool block = m % L == 0 && S >= L && n % S == 0 && pos[0] % S + L <= S;
    for (int64_t k = 0; block && k < m; ++k)
      block = pos[static_cast<size_t>(k)] == pos[0] + (k / L) * S + k % L;
    if (block) {
      const int64_t rows = n / S, r0 = pos[0] / S, c0 = pos[0] % S;
      Tensor root2 = tpu::reshape(flat_root, Shape{rows, S});
      auto join = [](const std::vector<Tensor>& parts, int64_t dim) {
        return parts.size() == 1 ? parts[0] : tpu::cat(parts, dim);
      };
      // Rows [r0, r0 + A): the columns around the view's and its values.
      const Tensor band = A == rows ? root2 : tpu::narrow(root2, 0, r0, A);
      std::vector<Tensor> mid;
      if (c0 > 0) mid.push_back(tpu::narrow(band, 1, 0, c0));
      mid.push_back(tpu::reshape(upd, Shape{A, L}));
      if (c0 + L < S) mid.push_back(tpu::narrow(band, 1, c0 + L, S - c0 - L));
      std::vector<Tensor> all;
      if (r0 > 0) all.push_back(tpu::narrow(root2, 0, 0, r0));
      all.push_back(join(mid, 1));
      if (r0 + A < rows) all.push_back(tpu::narrow(root2, 0, r0 + A, rows - r0 - A));
      const Tensor joined = join(all, 0);
      return value_of(tpu::reshape(f8 ? tpu::to(joined, rm.dtype) : joined, rm.shape));
    }
  }
  // new_root = where(covered, scatter(view values), old_root), all as traced ops on the device.
  const TensorOptions io(DType::i32, rm.device);
  Tensor index = tpu::reshape(tpu::arange(Scalar(n), io), rm.shape);
  for (const ViewStep& s : chain) index = apply_view(index, s);  // traced: the same view ops on the index
  index = tpu::reshape(index, Shape{m});
  Tensor vals = tpu::scatter_add(tpu::zeros(Shape{n}, TensorOptions(upd.dtype(), rm.device)), 0, index, upd);
  Tensor covered = tpu::gt(tpu::scatter_add(tpu::zeros(Shape{n}, io), 0, index, tpu::ones(Shape{m}, io)), 0);
  Tensor merged = tpu::where(covered, vals, flat_root);
  if (f8) merged = tpu::to(merged, rm.dtype);
  return value_of(tpu::reshape(merged, rm.shape));
}

void Tracer::functional_copy(const Tensor& self, const Tensor& src) {
  TPU_CHECK(!self.impl().wrapped_number, "copy_: cannot write into a wrapped number inside a compiled function");
  if (self.is_proxy()) {
    const TraceValue& tv = *self.impl().trace;
    TPU_CHECK(tv.tracer == this && tv.epoch == epoch_,
              "copy_: a traced tensor from another trace (or from before a graph break) was written in place; "
              "tensors made inside a compiled function must not be kept across calls");
  }
  if (deferred_) {  // deferred eager: aliasing views of real memory flush first
    if (!self.is_proxy()) {
      before_real_access(self, true);
    } else {
      const TraceValue& tv = *self.impl().trace;
      const TraceValue& root = tv.base ? *tv.base : tv;
      if (root.input >= 0) before_real_access(Tensor(real_inputs_[static_cast<size_t>(root.input)]), true);
    }
    if (!src.is_proxy()) before_real_access(src, false);
  }
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(x) { ++d; }
    ~Depth() { --d; }
  } depth(copy_depth_);  // the ops below belong to this one write: no flush between them
  if (src.is_proxy()) value_of(src);  // checks it belongs to this trace
  const ValueId v = coerce_source(self, src);
  if (self.is_proxy()) {
    TraceValue& tv = *self.impl().trace;
    if (tv.base) {
      const ValueId nb = scatter_into_root(*tv.base, tv.chain, v, self);
      tv.id = v;
      ++tv.version;
      rebind_root(*tv.base, nb, &tv);
      return;
    }
    rebind_root(tv, v, nullptr);
    return;
  }
  std::shared_ptr<TraceValue> root = root_of(self);
  rebind_root(*root, v, nullptr);
}

std::vector<std::pair<int, ValueId>> Tracer::mutations() const {
  std::vector<std::pair<int, ValueId>> m;
  for (const auto& r : input_roots_)
    if (r->id != r->input_value) m.emplace_back(r->input, r->id);
  for (auto [in, v] : m) {
    const Tensor& t = real_inputs_[static_cast<size_t>(in)];
    for (size_t j = 0; j < real_inputs_.size(); ++j) {
      const Tensor& o = real_inputs_[j];
      if (static_cast<int>(j) == in || !o.storage() || o.storage() != t.storage()) continue;
      fail("compile: input {} ({}) is written in place inside the compiled function but shares its memory with "
           "input {} ({}); in-place writes through aliasing inputs (two views of one tensor, or the same tensor "
           "passed twice / passed and captured) are not supported",
           in, ops::describe(t), j, ops::describe(o));
    }
  }
  return m;
}

std::vector<Tracer::OutputAlias> Tracer::output_aliases(std::span<const Tensor> outs) const {
  std::vector<OutputAlias> r;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].is_proxy()) {  // a captured real tensor returned as it is
      auto it = captured_.find(&outs[i].impl());
      if (it != captured_.end() && it->second->input >= 0 && it->second->id != it->second->input_value)
        r.push_back({static_cast<int>(i), it->second->input, {}});
      continue;
    }
    const TraceValue& tv = *outs[i].impl().trace;
    const TraceValue* root = tv.base ? tv.base.get() : &tv;
    if (root->input < 0 || root->id == root->input_value) continue;  // not a written input
    r.push_back({static_cast<int>(i), root->input, tv.base ? tv.chain : std::vector<ViewStep>{}});
  }
  return r;
}

std::vector<char> Tracer::fresh_outputs(std::span<const Tensor> outs) const {
  std::vector<char> f(outs.size(), 0);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].is_proxy()) continue;
    const TraceValue& tv = *outs[i].impl().trace;
    f[i] = (tv.base ? tv.base->input : tv.input) < 0 ? 1 : 0;
  }
  return f;
}

}  // namespace tpu::graph
