// StableHLO export, composite ops: reductions, dot_general (matmul, linear), softmax and
// log_softmax, layer/RMS norm, gelu, rotary embedding and attention, decomposed into StableHLO
// ops. Half-precision inputs of the normalizing ops are computed in f32 and rounded at the end
// (as the cpu kernels do).
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/stablehlo_writer.h"
#include "tpucore/core/error.h"

namespace tpu::graph::shlo {
namespace {

bool half(DType t) { return t == DType::bf16 || t == DType::f16; }
Val up(Writer& w, const Val& v) { return half(v.dtype) ? w.convert(v, DType::f32) : v; }

std::vector<int64_t> norm_dims(const std::vector<int64_t>& dims, int nd) {
  std::vector<int64_t> r;
  for (int64_t d : dims) r.push_back(d < 0 ? d + nd : d);
  if (dims.empty())
    for (int d = 0; d < nd; ++d) r.push_back(d);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// Broadcasts a reduced value (dims removed) back to `s`.
Val unreduce(Writer& w, const Val& r, const Shape& s, const std::vector<int64_t>& dims) {
  std::vector<int64_t> keep;
  for (int d = 0; d < s.ndim(); ++d)
    if (std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) keep.push_back(d);
  return w.broadcast_in_dim(r, s, keep);
}

double lowest(DType t) {
  if (is_floating(t)) return -INFINITY;
  return t == DType::u8 || t == DType::boolean ? 0 : t == DType::i8 ? -128 : t == DType::i32 ? -2147483648.0 : -9.2233720368547758e18;
}
double highest(DType t) {
  if (is_floating(t)) return INFINITY;
  return t == DType::u8 ? 255 : t == DType::boolean ? 1 : t == DType::i8 ? 127 : t == DType::i32 ? 2147483647.0 : 9.2233720368547758e18;
}

Val sum_over(Writer& w, const Val& x, const std::vector<int64_t>& dims) { return w.reduce(x, dims, "add", 0); }

Val mean_over(Writer& w, const Val& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape[int(d)];
  Val s = sum_over(w, x, dims);
  return w.ew("divide", {s, w.scalar(double(n), s.dtype, s.shape)});
}

Val softmax_f(Writer& w, const Val& x0, int64_t dim, bool log) {
  const Val x = up(w, x0);
  const std::vector<int64_t> d{dim};
  Val m = unreduce(w, w.reduce(x, d, "maximum", -INFINITY), x.shape, d);
  Val z = w.ew("subtract", {x, m});
  Val e = w.ew("exponential", {z});
  Val s = unreduce(w, sum_over(w, e, d), x.shape, d);
  Val r = log ? w.ew("subtract", {z, w.ew("log", {s})}) : w.ew("divide", {e, s});
  return w.convert(r, x0.dtype);
}

Val matmul(Writer& w, const Val& a0, const Val& b0, const Shape& os) {
  Val a = a0.shape.ndim() == 1 ? w.reshape(a0, Shape{1, a0.shape[0]}) : a0;
  Val b = b0.shape.ndim() == 1 ? w.reshape(b0, Shape{b0.shape[0], 1}) : b0;
  const int ra = a.shape.ndim(), rb = b.shape.ndim();
  const int nb = std::max(ra, rb) - 2;
  std::vector<int64_t> batch(size_t(nb), 1);
  for (int i = 0; i < nb; ++i) {
    const int ia = i - (nb - (ra - 2)), ib = i - (nb - (rb - 2));
    const int64_t da = ia >= 0 ? a.shape[ia] : 1, db = ib >= 0 ? b.shape[ib] : 1;
    batch[size_t(i)] = std::max(da, db);
  }
  auto with = [&](int64_t x, int64_t y) {
    std::vector<int64_t> s = batch;
    s.push_back(x);
    s.push_back(y);
    return Shape(s);
  };
  const int64_t M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
  a = w.broadcast_to(a, with(M, K));
  b = w.broadcast_to(b, with(K, N));
  std::vector<int64_t> bd;
  for (int i = 0; i < nb; ++i) bd.push_back(i);
  Val r = w.dot_general(a, b, bd, bd, {nb + 1}, {nb}, with(M, N));
  return w.reshape(r, os);
}

Val gelu(Writer& w, const Val& x0, bool tanh_approx) {
  const Val x = up(w, x0);
  const Shape& s = x.shape;
  Val inner;
  if (tanh_approx) {
    Val x3 = w.ew("multiply", {x, w.ew("multiply", {x, x})});
    Val u = w.ew("add", {x, w.ew("multiply", {x3, w.scalar(0.044715, x.dtype, s)})});
    inner = w.ew("tanh", {w.ew("multiply", {u, w.scalar(std::sqrt(2.0 / M_PI), x.dtype, s)})});
  } else {
    inner = erf_approx(w, w.ew("multiply", {x, w.scalar(M_SQRT1_2, x.dtype, s)}));
  }
  Val r = w.ew("multiply", {w.ew("multiply", {x, w.scalar(0.5, x.dtype, s)}),
                            w.ew("add", {inner, w.scalar(1.0, x.dtype, s)})});
  return w.convert(r, x0.dtype);
}

Val attention(Writer& w, const Node& n, const std::vector<Val>& in, const Shape& os) {
  Val q = up(w, in[0]), k = up(w, in[1]), v = up(w, in[2]);
  const int r = q.shape.ndim();
  TPU_CHECK(r >= 2 && k.shape.ndim() == r, "export_stablehlo: scaled_dot_product_attention of rank {} does not map", r);
  const int64_t hq = r >= 3 ? q.shape[r - 3] : 1, hk = r >= 3 ? k.shape[r - 3] : 1, lq = q.shape[r - 2],
                lk = k.shape[r - 2];
  // (Zero heads would divide by zero below; such an attention is refused, not exported.)
  TPU_CHECK(hk > 0 && hq % hk == 0, "export_stablehlo: scaled_dot_product_attention with {} query head(s) over {} "
            "key/value head(s) does not map", hq, hk);
  auto repeat_kv = [&](const Val& t) {  // grouped KV heads: query head h reads KV head h / (hq / hk)
    if (hq == hk) return t;
    const int64_t g = hq / hk;
    std::vector<int64_t> s5 = t.shape.vec(), dims;
    s5.insert(s5.begin() + (r - 2), g);
    for (int i = 0; i < r; ++i) dims.push_back(i < r - 2 ? i : i + 1);
    Val b = w.broadcast_in_dim(t, Shape(s5), dims);
    std::vector<int64_t> s4 = t.shape.vec();
    s4[size_t(r - 3)] = hq;
    return w.reshape(b, Shape(s4));
  };
  k = repeat_kv(k);
  v = repeat_kv(v);
  std::vector<int64_t> bd;
  for (int i = 0; i < r - 2; ++i) bd.push_back(i);
  std::vector<int64_t> ss = q.shape.vec();
  ss[size_t(r - 1)] = lk;
  const Shape sshape(ss);
  Val s = w.dot_general(q, k, bd, bd, {r - 1}, {r - 1}, sshape);
  s = w.ew("multiply", {s, w.scalar(n.attrs.get_float("scale"), s.dtype, sshape)});
  const Val ninf = w.scalar(-INFINITY, s.dtype, sshape);
  if (n.attrs.get_bool("has_mask")) {
    s = w.select(w.convert(w.broadcast_to(in[3], sshape), DType::boolean), s, ninf);
  } else if (n.attrs.get_bool("causal")) {
    const Shape lql{lq, lk};
    Val keep = w.compare(w.iota(lql, DType::i32, 0), w.iota(lql, DType::i32, 1), "GE");  // key j <= query i
    s = w.select(w.broadcast_to(keep, sshape), s, ninf);
  }
  Val p = softmax_f(w, s, r - 1, false);
  Val o = w.dot_general(p, v, bd, bd, {r - 1}, {r - 2}, Shape([&] {
                          std::vector<int64_t> x = q.shape.vec();
                          x[size_t(r - 1)] = v.shape[r - 1];
                          return x;
                        }()));
  return w.convert(w.reshape(o, os), in[0].dtype);
}

}  // namespace

Val erf_approx(Writer& w, const Val& x) {
  // erf(|x|) ~ 1 - (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) e^(-x^2), t = 1 / (1 + p |x|);
  // Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7. Odd: the sign of x is put back at the end.
  const Shape& s = x.shape;
  auto c = [&](double v) { return w.scalar(v, x.dtype, s); };
  const double a[5] = {0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429};
  Val ax = w.ew("abs", {x});
  Val t = w.ew("divide", {c(1), w.ew("add", {c(1), w.ew("multiply", {ax, c(0.3275911)})})});
  Val poly = c(a[4]);
  for (int i = 3; i >= 0; --i) poly = w.ew("add", {w.ew("multiply", {poly, t}), c(a[i])});
  poly = w.ew("multiply", {poly, t});
  Val e = w.ew("exponential", {w.ew("negate", {w.ew("multiply", {x, x})})});
  Val y = w.ew("subtract", {c(1), w.ew("multiply", {poly, e})});
  return w.ew("multiply", {w.ew("sign", {x}), y});
}

bool emit_composite(Writer& w, const Node& n, const std::vector<Val>& in, const std::vector<ValueMeta>& outs,
                    std::vector<Val>& res) {
  const std::string& name = n.op->name;
  const ValueMeta& om = outs.at(0);
  const Shape& os = om.shape;
  if (name == "sum" || name == "mean" || name == "prod" || name == "amax" || name == "amin" || name == "all" ||
      name == "any") {
    // A 0-d input (dims [0] / [-1] name the scalar itself) is reduced as a [1] tensor.
    const Val x0 = in[0].shape.ndim() == 0 ? w.reshape(in[0], Shape{1}) : in[0];
    const std::vector<int64_t> dims = norm_dims(n.attrs.get_ints("dims"), x0.shape.ndim());
    const bool wide = half(om.dtype) && (name == "sum" || name == "mean");
    const bool logical = name == "all" || name == "any";  // on bool values (a u8 result is 0 / 1)
    const DType ct = wide ? DType::f32 : logical ? DType::boolean : om.dtype;
    Val x = w.convert(x0, ct);
    Val r;
    if (name == "sum") r = sum_over(w, x, dims);
    else if (name == "mean") r = mean_over(w, x, dims);
    else if (name == "prod") r = w.reduce(x, dims, "multiply", 1);
    else if (name == "amax") r = w.reduce(x, dims, "maximum", lowest(ct));
    else if (name == "amin") r = w.reduce(x, dims, "minimum", highest(ct));
    else if (name == "all") r = w.reduce(x, dims, "and", 1);
    else r = w.reduce(x, dims, "or", 0);
    res.push_back(w.reshape(w.convert(r, om.dtype), os));  // keepdim: the reduced dims as 1s
    return true;
  }
  if (name == "var" || name == "std") {  // sum((x - mean)^2) / max(0, N - correction), in f32 for half types
    const Val x = up(w, in[0].shape.ndim() == 0 ? w.reshape(in[0], Shape{1}) : in[0]);
    const std::vector<int64_t> dims = norm_dims(n.attrs.get_ints("dims"), x.shape.ndim());
    int64_t count = 1;
    for (int64_t d : dims) count *= x.shape[int(d)];
    const Val dev = w.ew("subtract", {x, unreduce(w, mean_over(w, x, dims), x.shape, dims)});
    const Val ss = sum_over(w, w.ew("multiply", {dev, dev}), dims);
    const double den = std::max(0.0, double(count) - double(n.attrs.get_int("correction")));
    Val v = w.ew("divide", {ss, w.scalar(den, ss.dtype, ss.shape)});
    if (name == "std") v = w.ew("sqrt", {v});
    res.push_back(w.reshape(w.convert(v, om.dtype), os));
    return true;
  }
  if (name == "matmul") {
    res.push_back(matmul(w, in[0], in[1], os));
    return true;
  }
  if (name == "linear") {
    const Val& x = in[0];
    const int r = x.shape.ndim();
    Val y = w.dot_general(x, in[1], {}, {}, {r - 1}, {1}, os);
    if (n.attrs.get_bool("has_bias")) y = w.ew("add", {y, w.broadcast_to(in[2], os)});
    res.push_back(y);
    return true;
  }
  if (name == "softmax" || name == "log_softmax") {
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += in[0].shape.ndim();
    if (in[0].shape.ndim() == 0) return false;
    res.push_back(softmax_f(w, in[0], d, name == "log_softmax"));
    return true;
  }
  if (name == "layer_norm" || name == "rms_norm") {
    const Val x = up(w, in[0]);
    const int nd = int(n.attrs.get_ints("normalized_shape").size()), r = x.shape.ndim();
    std::vector<int64_t> dims;
    for (int d = r - nd; d < r; ++d) dims.push_back(d);
    const Val eps = w.scalar(n.attrs.get_float("eps"), x.dtype, x.shape);
    Val y;
    if (name == "layer_norm") {
      Val xc = w.ew("subtract", {x, unreduce(w, mean_over(w, x, dims), x.shape, dims)});
      Val var = unreduce(w, mean_over(w, w.ew("multiply", {xc, xc}), dims), x.shape, dims);
      y = w.ew("multiply", {xc, w.ew("rsqrt", {w.ew("add", {var, eps})})});
    } else {
      Val ms = unreduce(w, mean_over(w, w.ew("multiply", {x, x}), dims), x.shape, dims);
      y = w.ew("multiply", {x, w.ew("rsqrt", {w.ew("add", {ms, eps})})});
    }
    if (n.attrs.get_bool("has_weight")) y = w.ew("multiply", {y, w.broadcast_to(up(w, in[1]), x.shape)});
    if (name == "layer_norm" && n.attrs.get_bool("has_bias")) y = w.ew("add", {y, w.broadcast_to(up(w, in[2]), x.shape)});
    res.push_back(w.convert(y, om.dtype));
    return true;
  }
  if (name == "gelu") {
    res.push_back(gelu(w, in[0], n.attrs.get_bool("tanh_approx", false)));
    return true;
  }
  if (name == "rotary_embedding") {
    const Val& x = in[0];
    const int r = x.shape.ndim();
    const int64_t dd = x.shape[r - 1], h = dd / 2;
    std::vector<int64_t> st(size_t(r), 0), lim = x.shape.vec(), str(size_t(r), 1);
    lim[size_t(r - 1)] = h;
    Val x1 = w.slice(x, st, lim, str);
    st[size_t(r - 1)] = h;
    lim[size_t(r - 1)] = dd;
    Val x2 = w.slice(x, st, lim, str);
    Val rot = w.concatenate({w.ew("negate", {x2}), x1}, r - 1);
    Val y = w.ew("add", {w.ew("multiply", {x, w.broadcast_to(in[1], os)}), w.ew("multiply", {rot, w.broadcast_to(in[2], os)})});
    res.push_back(y);
    return true;
  }
  if (name == "scaled_dot_product_attention") {
    res.push_back(attention(w, n, in, os));
    return true;
  }
  return false;
}

}  // namespace tpu::graph::shlo
