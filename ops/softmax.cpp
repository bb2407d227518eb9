// softmax and log_softmax over one dim. Each row (all indices but the softmax dim) is read
// once into an f32 buffer (any input strides or float dtype), reduced there (max, then the
// sum of exp(x - max) with the vectorized exp of ops/cpu/vec_math.h), and written once; rows are split over the thread pool. Integer and
// bool inputs promote to f32 (PyTorch's behaviour for these dtypes with an explicit float
// result). A row of all -inf gives NaN, a NaN in a row gives a row of NaN, as in PyTorch.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/meta_util.h"
#include "ops/reduce_common.h"
#include "ops/reduce_engine.h"
#include "ops/reduce_vec.h"
#include "ops/registry.h"
#include "tpucore/ops.h"

namespace tpu {
namespace {
using namespace ops;

using reduce::to_f;

void softmax_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& x = a.inputs[0];
  wrap_dim(a.attrs.get_int("dim"), x.dim(), a.op.name.c_str());
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  m.cast_mask = 1;
  m.cast_to = out;
  m.out() = {x.shape(), out, x.device()};
}

// Softmax (or log-softmax) of buf[0..k) in place; tmp holds k floats of scratch.
template <bool kLog>
void softmax_row(float* buf, float* tmp, int64_t k, cpu::VecUnaryFn exp_fn) {
  constexpr int L = 16;
  float lane[L];
  int64_t i = 0;
  // A NaN max makes every x - max NaN: the row becomes NaN, as in PyTorch.
  const float mx = reduce::extremum_f32<true>(buf, k, -std::numeric_limits<float>::infinity());
  for (i = 0; i < k; ++i) buf[i] -= mx;
  float* e = kLog ? tmp : buf;
  exp_fn(e, buf, k);
  for (int j = 0; j < L; ++j) lane[j] = 0;
  for (i = 0; i + L <= k; i += L)
    for (int j = 0; j < L; ++j) lane[j] += e[i + j];
  double sum = 0;
  for (int j = 0; j < L; ++j) sum += lane[j];
  for (; i < k; ++i) sum += e[i];
  if constexpr (kLog) {
    const float ls = static_cast<float>(std::log(sum));
    for (i = 0; i < k; ++i) buf[i] -= ls;
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (i = 0; i < k; ++i) buf[i] *= inv;
  }
}

// Softmax over the middle dim of a contiguous [outer, k, inner] tensor: blocks of kJ
// adjacent columns are processed together so every load is a contiguous run of kJ values
// (a row-at-a-time gather would stride by `inner` for every element).
template <bool kLog, class T>
void softmax_columns(const T* src, T* dst, int64_t outer, int64_t k, int64_t inner, cpu::VecUnaryFn exp_fn) {
  constexpr int64_t kJ = 16;
  const int64_t blocks = (inner + kJ - 1) / kJ;
  const int64_t grain = std::max<int64_t>(1, cpu::kParallelGrain / (k * kJ));
  parallel_for(0, outer * blocks, grain, [&](int64_t tb, int64_t te) {
    std::vector<float> buf(static_cast<size_t>(k * kJ)), e(kLog ? static_cast<size_t>(k * kJ) : 0);
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / blocks, j0 = (t % blocks) * kJ, jn = std::min(kJ, inner - j0);
      const T* p = src + o * k * inner + j0;
      T* q = dst + o * k * inner + j0;
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < kJ; ++j) buf[r * kJ + j] = j < jn ? to_f(p[r * inner + j]) : 0.0f;
      float mx[kJ], sum[kJ];
      for (int64_t j = 0; j < kJ; ++j) mx[j] = -std::numeric_limits<float>::infinity(), sum[j] = 0;
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < kJ; ++j) mx[j] = buf[r * kJ + j] > mx[j] ? buf[r * kJ + j] : mx[j];
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < kJ; ++j) buf[r * kJ + j] -= mx[j];  // NaN or all -inf: NaN column
      float* ex = kLog ? e.data() : buf.data();
      exp_fn(ex, buf.data(), k * kJ);
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < kJ; ++j) sum[j] += ex[r * kJ + j];
      for (int64_t j = 0; j < kJ; ++j) sum[j] = kLog ? std::log(sum[j]) : 1.0f / sum[j];
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < jn; ++j)
          q[r * inner + j] = cpu::convert<T>(kLog ? buf[r * kJ + j] - sum[j] : buf[r * kJ + j] * sum[j]);
    }
  });
}

template <bool kLog>
void softmax_cpu(const KernelArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& out = a.outputs[0];
  if (x.numel() == 0) return;
  const int d = wrap_dim(a.attrs.get_int("dim"), x.dim(), a.op.name.c_str());
  const int64_t k = x.dim() ? x.shape()[d] : 1;
  const int64_t in_st = x.dim() ? x.strides()[d] : 0;
  const Shape out_strides = contiguous_strides(out.shape());
  const int64_t out_st = x.dim() ? out_strides[d] : 0;
  // The other dims index the rows, in the same row-major order for input and output.
  reduce::DimGroup rows_in, rows_out;
  for (int i = 0; i < x.dim(); ++i) {
    if (i == d) continue;
    rows_in.add(x.shape()[i], x.strides()[i]);
    rows_out.add(x.shape()[i], out_strides[i]);
  }
  const int64_t nrows = x.numel() / k;
  const cpu::VecUnaryFn exp_fn = cpu::vec_math().get(cpu::VecUnary::exp);
  dispatch_dtype(x.dtype(), [&](auto zx) {
    using T = decltype(zx);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* src = static_cast<const T*>(x.raw_data());
      T* dst = static_cast<T*>(out.raw_data());
      if (x.is_contiguous() && x.dim() >= 1 && d < x.dim() - 1) {
        int64_t inner = 1;
        for (int i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
        softmax_columns<kLog, T>(src, dst, x.numel() / (k * inner), k, inner, exp_fn);
        return;
      }
      const int64_t grain = std::max<int64_t>(1, cpu::kParallelGrain / k);
      parallel_for(0, nrows, grain, [&](int64_t rb, int64_t re) {
        std::vector<float> buf(static_cast<size_t>(k)), tmp(kLog ? static_cast<size_t>(k) : 0);
        for (int64_t r = rb; r < re; ++r) {
          const T* p = src + rows_in.offset_of(r);
          T* q = dst + rows_out.offset_of(r);
          if (in_st == 1) {
            for (int64_t i = 0; i < k; ++i) buf[i] = to_f(p[i]);
          } else {
            for (int64_t i = 0; i < k; ++i) buf[i] = to_f(p[i * in_st]);
          }
          softmax_row<kLog>(buf.data(), tmp.data(), k, exp_fn);
          if (out_st == 1) {
            for (int64_t i = 0; i < k; ++i) q[i] = cpu::convert<T>(buf[i]);
          } else {
            for (int64_t i = 0; i < k; ++i) q[i * out_st] = cpu::convert<T>(buf[i]);
          }
        }
      });
    }
  });
}

TPU_DEFINE_OP(softmax_op, {.name = "softmax", .num_inputs = 1, .meta = &softmax_meta, .cpu = &softmax_cpu<false>,
                           .doc = "exp(x - max) / sum(exp(x - max)) over one dim (ints promote to f32)"});
TPU_DEFINE_OP(log_softmax_op, {.name = "log_softmax", .num_inputs = 1, .meta = &softmax_meta,
                               .cpu = &softmax_cpu<true>,
                               .doc = "x - max - log(sum(exp(x - max))) over one dim (ints promote to f32)"});

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return ops::call(softmax_op(), {x}, {{"dim", dim}}); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return ops::call(log_softmax_op(), {x}, {{"dim", dim}}); }

}  // namespace tpu
