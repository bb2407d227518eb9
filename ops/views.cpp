// View ops: reshape/view, permute, transpose, squeeze, unsqueeze, expand, flatten, slice,
// narrow, select. Each makes a new TensorImpl over the same storage (no data movement).
#include <numeric>

#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

// Makes a view of `self` with the given shape/strides/offset.
Tensor make_view(const Tensor& self, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  const TensorImpl& s = self.impl();
  impl->storage = s.storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = s.dtype;
  impl->device = s.device;
  impl->recompute_contiguous();
  return Tensor(std::move(impl));
}

// Result shape of a reshape, resolving one -1.
Shape infer_shape(const char* op, const Shape& in, const std::vector<int64_t>& req) {
  Shape out(req);
  int infer = -1;
  int64_t known = 1;
  bool overflow = false, zero = false;
  for (int i = 0; i < out.ndim(); ++i) {
    if (out[i] == -1) {
      TPU_CHECK(infer < 0, "{}: only one dimension can be -1, got shape {}", op, out.str());
      infer = i;
    } else {
      TPU_CHECK(out[i] >= 0, "{}: invalid dimension {} in shape {}", op, out[i], out.str());
      zero |= out[i] == 0;
      if (out[i] != 0) overflow |= __builtin_mul_overflow(known, out[i], &known);
    }
  }
  if (zero) known = 0;
  const int64_t n = in.numel();
  TPU_CHECK(zero || !overflow, "{}: shape {} is invalid for input of shape {} ({} elements)", op, out.str(), in.str(),
            n);
  if (infer >= 0) {
    TPU_CHECK(known != 0 && n % known == 0, "{}: shape {} is invalid for input of shape {} ({} elements)", op,
              out.str(), in.str(), n);
    out[infer] = n / known;
  }
  TPU_CHECK(out.numel() == n, "{}: shape {} is invalid for input of shape {} ({} elements)", op, out.str(), in.str(), n);
  return out;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible
// (the rule PyTorch's view uses: each group of merged/split dims must be contiguous).
bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape, Shape& out) {
  out = Shape::filled(new_shape.ndim(), 1);
  if (shape.numel() == 0 || shape.ndim() == 0) {  // nothing to keep in place / one element
    out = contiguous_strides(new_shape);
    return true;
  }
  int view_d = new_shape.ndim() - 1;
  int64_t chunk_base_stride = strides.ndim() ? strides.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

void view_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  Shape s = infer_shape(a.op.name.c_str(), x.shape(), a.attrs.get_ints("shape"));
  if (!x.is_proxy()) {
    Shape st;
    TPU_CHECK(view_strides(x.shape(), x.strides(), s, st),
              "view: cannot view a tensor of shape {} with strides {} as shape {} without a copy (use reshape)",
              x.shape().str(), x.strides().str(), s.str());
  }
  m.out() = {s, x.dtype(), x.device()};
}
Tensor view_view(const Tensor& x, const Attrs&, const TensorMeta& out) {
  Shape st;
  view_strides(x.shape(), x.strides(), out.shape, st);
  return make_view(x, out.shape, st, x.offset());
}
TPU_DEFINE_OP(view_op, {.name = "view", .num_inputs = 1, .flags = kView, .meta = &view_meta, .view = &view_view,
                        .doc = "the same elements under a new shape (no copy)"});

void permute_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  const auto& dims = a.attrs.get_ints("dims");
  TPU_CHECK(static_cast<int>(dims.size()) == x.dim(), "permute: {} dims given for a tensor of {} dims (shape {})",
            dims.size(), x.dim(), x.shape().str());
  Shape s;
  uint32_t seen = 0;
  for (int64_t d : dims) {
    int w = wrap_dim(d, x.dim(), "permute");
    TPU_CHECK(!((seen >> w) & 1u), "permute: dim {} repeated in [{}]", d, fmt::join(dims, ", "));
    seen |= 1u << w;
    s.push_back(x.dim() ? x.shape()[w] : 1);
  }
  m.out() = {x.dim() ? s : Shape{}, x.dtype(), x.device()};
}
Tensor permute_view(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  const auto& dims = a.get_ints("dims");
  Shape st;
  for (int64_t d : dims) st.push_back(x.strides()[wrap_dim(d, x.dim(), "permute")]);
  if (x.dim() == 0) st = Shape{};
  return make_view(x, out.shape, st, x.offset());
}
TPU_DEFINE_OP(permute_op, {.name = "permute", .num_inputs = 1, .flags = kView, .meta = &permute_meta,
                           .view = &permute_view, .doc = "reorders dims"});

void expand_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  Shape req(a.attrs.get_ints("shape"));
  TPU_CHECK(req.ndim() >= x.dim(), "expand: the target shape {} has fewer dims than the input {}", req.str(),
            x.shape().str());
  const int lead = req.ndim() - x.dim();
  for (int i = 0; i < req.ndim(); ++i) {
    if (i < lead) {
      TPU_CHECK(req[i] >= 0, "expand: new leading dim {} must be non-negative in {}", req[i], req.str());
      continue;
    }
    int64_t src = x.shape()[i - lead];
    if (req[i] == -1) req[i] = src;
    TPU_CHECK(src == req[i] || src == 1, "expand: cannot expand shape {} to {} (dim {}: {} vs {})", x.shape().str(),
              req.str(), i, src, req[i]);
  }
  m.out() = {req, x.dtype(), x.device()};
}
Tensor expand_view(const Tensor& x, const Attrs&, const TensorMeta& out) {
  const int lead = out.shape.ndim() - x.dim();
  Shape st = Shape::filled(out.shape.ndim(), 0);
  for (int i = lead; i < out.shape.ndim(); ++i)
    st[i] = (x.shape()[i - lead] == 1 && out.shape[i] != 1) ? 0 : x.strides()[i - lead];
  return make_view(x, out.shape, st, x.offset());
}
TPU_DEFINE_OP(expand_op, {.name = "expand", .num_inputs = 1, .flags = kView, .meta = &expand_meta,
                          .view = &expand_view, .doc = "broadcasts size-1 dims without copying"});

void slice_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "slice");
  int64_t start = a.attrs.get_int("start"), end = a.attrs.get_int("end"), step = a.attrs.get_int("step");
  TPU_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = x.shape();
  s[d] = (end - start + step - 1) / step;
  m.out() = {s, x.dtype(), x.device()};
}
Tensor slice_view(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  int d = wrap_dim(a.get_int("dim"), x.dim(), "slice");
  int64_t start = a.get_int("start"), step = a.get_int("step");
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  start = std::clamp<int64_t>(start, 0, n);
  Shape st = x.strides();
  st[d] *= step;
  return make_view(x, out.shape, st, x.offset() + start * x.strides()[d]);
}
TPU_DEFINE_OP(slice_op, {.name = "slice", .num_inputs = 1, .flags = kView, .meta = &slice_meta,
                         .view = &slice_view, .doc = "a strided range of one dim"});

void select_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  TPU_CHECK(x.dim() > 0, "select: cannot select from a 0-d tensor");
  int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), "select");
  int64_t i = a.attrs.get_int("index");
  const int64_t n = x.shape()[d];
  TPU_CHECK(i >= -n && i < n, "select: index {} is out of range for dim {} of size {} (shape {})", i, d, n,
            x.shape().str());
  Shape s = x.shape();
  s.erase(d);
  m.out() = {s, x.dtype(), x.device()};
}
Tensor select_view(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  int d = wrap_dim(a.get_int("dim"), x.dim(), "select");
  int64_t i = a.get_int("index");
  if (i < 0) i += x.shape()[d];
  Shape st = x.strides();
  st.erase(d);
  return make_view(x, out.shape, st, x.offset() + i * x.strides()[d]);
}
TPU_DEFINE_OP(select_op, {.name = "select", .num_inputs = 1, .flags = kView, .meta = &select_meta,
                          .view = &select_view, .doc = "one index of one dim (the dim is removed)"});

}  // namespace

void TensorImpl::recompute_contiguous() {
  int64_t expected = 1;
  contiguous = true;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) {
      contiguous = false;
      return;
    }
    expected *= shape[i];
  }
}

Tensor view(const Tensor& x, const Shape& shape) {
  return ops::call(view_op(), {x}, {{"shape", shape.vec()}});
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape s = infer_shape("reshape", x.shape(), shape.vec());
  if (!x.is_proxy()) {
    Shape st;
    if (!view_strides(x.shape(), x.strides(), s, st)) return view(contiguous(x), s);
  }
  return view(x, s);
}

Tensor permute(const Tensor& x, const Shape& dims) { return ops::call(permute_op(), {x}, {{"dims", dims.vec()}}); }

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  const int n = x.dim();
  int a = wrap_dim(d0, n, "transpose"), b = wrap_dim(d1, n, "transpose");
  if (n == 0) return x;
  Shape dims;
  for (int i = 0; i < n; ++i) dims.push_back(i);
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

Tensor squeeze(const Tensor& x, std::optional<int64_t> dim) {
  Shape s;
  if (dim) {
    int d = wrap_dim(*dim, x.dim(), "squeeze");
    if (x.dim() == 0 || x.shape()[d] != 1) return x;
    s = x.shape();
    s.erase(d);
  } else {
    for (int64_t v : x.shape())
      if (v != 1) s.push_back(v);
  }
  return view(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const int n = x.dim() + 1;
  TPU_CHECK(dim >= -n && dim < n, "unsqueeze: dim {} is out of range for a tensor of {} dims (expected in [{}, {}])", dim,
            x.dim(), -n, n - 1);
  int d = static_cast<int>(dim < 0 ? dim + n : dim);
  Shape s = x.shape();
  s.insert(d, 1);
  return view(x, s);
}

Tensor expand(const Tensor& x, const Shape& shape) { return ops::call(expand_op(), {x}, {{"shape", shape.vec()}}); }

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, Shape{1});
  int a = wrap_dim(start_dim, x.dim(), "flatten"), b = wrap_dim(end_dim, x.dim(), "flatten");
  TPU_CHECK(a <= b, "flatten: start_dim {} comes after end_dim {}", start_dim, end_dim);
  Shape s;
  for (int i = 0; i < a; ++i) s.push_back(x.shape()[i]);
  int64_t p = 1;
  for (int i = a; i <= b; ++i) p *= x.shape()[i];
  s.push_back(p);
  for (int i = b + 1; i < x.dim(); ++i) s.push_back(x.shape()[i]);
  return reshape(x, s);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return ops::call(slice_op(), {x}, {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}});
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  TPU_CHECK(x.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  int d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  TPU_CHECK(start >= 0 && length >= 0 && start + length <= n,
            "narrow: start {} + length {} is out of range for dim {} of size {} (shape {})", start, length, d, n,
            x.shape().str());
  return slice(x, d, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  return ops::call(select_op(), {x}, {{"dim", dim}, {"index", index}});
}

// ---- Tensor methods that are views or copies ----
Tensor Tensor::to(DType t) const { return tpu::to(*this, t); }
Tensor Tensor::to(Device d) const { return tpu::to(*this, d); }
Tensor Tensor::contiguous() const { return tpu::contiguous(*this); }
Tensor Tensor::clone() const { return tpu::clone(*this); }
Tensor Tensor::reshape(const Shape& s) const { return tpu::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return tpu::view(*this, s); }
Tensor Tensor::permute(const Shape& d) const { return tpu::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return tpu::transpose(*this, a, b); }
Tensor Tensor::t() const {
  TPU_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dims, got shape {}", shape().str());
  return dim() < 2 ? *this : tpu::transpose(*this, 0, 1);
}
Tensor Tensor::squeeze(std::optional<int64_t> d) const { return tpu::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return tpu::unsqueeze(*this, d); }
Tensor Tensor::expand(const Shape& s) const { return tpu::expand(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return tpu::flatten(*this, a, b); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return tpu::slice(*this, d, s, e, st); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return tpu::narrow(*this, d, s, l); }
Tensor Tensor::select(int64_t d, int64_t i) const { return tpu::select(*this, d, i); }
Tensor& Tensor::fill_(Scalar s) { return tpu::fill_(*this, s); }
Tensor& Tensor::copy_(const Tensor& src) { return tpu::copy_(*this, src); }
Tensor& Tensor::zero_() { return tpu::fill_(*this, 0); }

}  // namespace tpu
