// Derivative formulas of the view ops (view, permute, expand, slice, select), the joins (cat,
// stack) and the indexing ops (index_select, gather, scatter_add, embedding, tril/triu).
// Gradients of views and gathers are built out of place (zero padding, cat, scatter_add), so
// they also trace.
#include "tpucore/autograd/formula.h"

namespace tpu::autograd::formula {
namespace {

// A tensor of size n along dim d holding g's entries at start, start + step, ... and zeros
// elsewhere (the gradient of a slice).
Tensor pad_along(const Tensor& g, int d, int64_t n, int64_t start, int64_t step) {
  const int64_t m = g.shape()[d];
  Shape zs = g.shape();
  zs[d] = n;
  if (m == 0) return zeros(zs, TensorOptions(g.dtype(), g.device()));
  Tensor spread = g;
  if (step > 1 && m > 1) {
    Shape ps = unsqueeze(g, d + 1).shape();
    ps[d + 1] = step - 1;
    Tensor inter = cat({unsqueeze(g, d + 1), zeros(ps, TensorOptions(g.dtype(), g.device()))}, d + 1);
    Shape merged = g.shape();
    merged[d] = m * step;
    spread = narrow(reshape(inter, merged), d, 0, (m - 1) * step + 1);
  }
  const int64_t len = spread.shape()[d];
  std::vector<Tensor> parts;
  auto pad = [&](int64_t k) {
    if (k <= 0) return;
    Shape s = g.shape();
    s[d] = k;
    parts.push_back(zeros(s, TensorOptions(g.dtype(), g.device())));
  };
  pad(start);
  parts.push_back(spread);
  pad(n - start - len);
  return parts.size() == 1 ? parts[0] : cat(parts, d);
}

void view_bw(const BackwardArgs& a, Grads g) { g[0] = reshape(a.grad_outputs[0], a.input_meta[0].shape); }
void permute_bw(const BackwardArgs& a, Grads g) {
  const auto& dims = a.attrs.get_ints("dims");
  const int n = static_cast<int>(dims.size());
  if (n == 0) {
    g[0] = a.grad_outputs[0];
    return;
  }
  Shape inv = Shape::filled(n, 0);
  for (int i = 0; i < n; ++i) inv[wrap_dim(dims[static_cast<size_t>(i)], n, "permute")] = i;
  g[0] = permute(a.grad_outputs[0], inv);
}
void expand_bw(const BackwardArgs& a, Grads g) { g[0] = detail::sum_to(a.grad_outputs[0], a.input_meta[0].shape); }
void slice_bw(const BackwardArgs& a, Grads g) {
  const Shape& in = a.input_meta[0].shape;
  const int d = wrap_dim(a.attrs.get_int("dim"), in.ndim(), "slice");
  const int64_t n = in[d];
  int64_t start = a.attrs.get_int("start");
  if (start < 0) start += n;
  start = std::clamp<int64_t>(start, 0, n);
  g[0] = pad_along(a.grad_outputs[0], d, n, start, a.attrs.get_int("step"));
}
void select_bw(const BackwardArgs& a, Grads g) {
  const Shape& in = a.input_meta[0].shape;
  const int d = wrap_dim(a.attrs.get_int("dim"), in.ndim(), "select");
  int64_t i = a.attrs.get_int("index");
  if (i < 0) i += in[d];
  g[0] = pad_along(unsqueeze(a.grad_outputs[0], d), d, in[d], i, 1);
}

void cat_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), go.dim(), "cat");
  int64_t off = 0;
  for (size_t i = 0; i < a.input_meta.size(); ++i) {
    const ops::TensorMeta& m = a.input_meta[i];
    if (m.shape.ndim() != go.dim()) continue;  // a legacy empty [0] input: no elements
    const int64_t len = m.shape[d];
    if (a.needs_grad(i)) g[i] = narrow(go, d, off, len);
    off += len;
  }
}
void stack_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const int d = wrap_dim(a.attrs.get_int("dim"), go.dim(), "stack");
  for (size_t i = 0; i < a.input_meta.size(); ++i)
    if (a.needs_grad(i)) g[i] = select(go, d, static_cast<int64_t>(i));
}

void index_select_bw(const BackwardArgs& a, Grads g) {
  const ops::TensorMeta& m = a.input_meta[0];
  const Tensor& go = a.grad_outputs[0];
  const Tensor& index = a.inputs[1];
  if (m.shape.ndim() == 0) {
    g[0] = reshape(go, m.shape);
    return;
  }
  const int d = wrap_dim(a.attrs.get_int("dim"), m.shape.ndim(), "index_select");
  Shape s = Shape::filled(m.shape.ndim(), 1);
  s[d] = index.numel();
  Tensor idx = expand(reshape(index, s), go.shape());
  g[0] = scatter_add(zeros(m.shape, opts(m)), d, idx, go.to(m.dtype));
}
void gather_bw(const BackwardArgs& a, Grads g) {
  const ops::TensorMeta& m = a.input_meta[0];
  const int d = m.shape.ndim() ? wrap_dim(a.attrs.get_int("dim"), m.shape.ndim(), "gather") : 0;
  g[0] = scatter_add(zeros(m.shape, opts(m)), d, a.inputs[1], a.grad_outputs[0].to(m.dtype));
}
void scatter_add_bw(const BackwardArgs& a, Grads g) {
  const Tensor& go = a.grad_outputs[0];
  const int d = go.dim() ? wrap_dim(a.attrs.get_int("dim"), go.dim(), "scatter_add") : 0;
  if (a.needs_grad(0)) g[0] = go;
  if (a.needs_grad(2)) {
    // src may be larger than index: its elements beyond the index's extent get zeros.
    Tensor gs = gather(go, d, a.inputs[1]);
    const Shape& ss = a.input_meta[2].shape;
    for (int k = 0; k < ss.ndim(); ++k)
      if (gs.shape()[k] < ss[k]) {
        Shape zs = gs.shape();
        zs[k] = ss[k] - gs.shape()[k];
        gs = cat({gs, zeros(zs, TensorOptions(gs.dtype(), gs.device()))}, k);
      }
    g[2] = gs;
  }
}
void embedding_bw(const BackwardArgs& a, Grads g) {
  const ops::TensorMeta& w = a.input_meta[0];
  const Tensor& go = a.grad_outputs[0];
  const int64_t n = a.inputs[1].numel(), dim = w.shape[1];
  Tensor idx = expand(reshape(a.inputs[1], Shape{n, 1}), Shape{n, dim});
  g[0] = scatter_add(zeros(w.shape, opts(w)), 0, idx, reshape(go, Shape{n, dim}).to(w.dtype));
}
void tril_bw(const BackwardArgs& a, Grads g) { g[0] = tril(a.grad_outputs[0], a.attrs.get_int("diagonal")); }
void triu_bw(const BackwardArgs& a, Grads g) { g[0] = triu(a.grad_outputs[0], a.attrs.get_int("diagonal")); }

[[maybe_unused]] const bool views_registered = [] {
  define("view", &view_bw);
  define("permute", &permute_bw);
  define("expand", &expand_bw);
  define("slice", &slice_bw);
  define("select", &select_bw);
  define("cat", &cat_bw);
  define("stack", &stack_bw);
  define("index_select", &index_select_bw, kIn1);
  define("gather", &gather_bw, kIn1);
  define("scatter_add", &scatter_add_bw, kIn1);
  define("embedding", &embedding_bw, kIn1);
  define("tril", &tril_bw);
  define("triu", &triu_bw);
  return true;
}();

}  // namespace
}  // namespace tpu::autograd::formula
