// The public functions of tpucore/quantize.h over the registry ops of ops/quantize.cpp.
#include "tpucore/quantize.h"

#include "ops/registry.h"

namespace tpu {
namespace {

const ops::OpDef& op_named(const char* name) {
  const ops::OpDef* d = ops::find_op(name);
  if (!d) fail("internal: op '{}' is not registered", name);
  return *d;
}

}  // namespace

Int8Weight quantize_int8(const Tensor& weight) {
  static const ops::OpDef& op = op_named("quantize_int8");
  Tensor out[ops::kMaxOutputs];
  const Tensor in[1] = {weight};
  ops::call(op, in, {}, out);
  return {std::move(out[0]), std::move(out[1])};
}

Tensor dequantize_int8(const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("dequantize_int8");
  return ops::call(op, {q, scale});
}

Tensor linear_int8(const Tensor& x, const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("linear_int8");
  return ops::call(op, {x, q, scale});
}

Int4Weight quantize_int4(const Tensor& weight, int64_t group, DType scale_dtype) {
  static const ops::OpDef& op = op_named("quantize_int4");
  Tensor out[ops::kMaxOutputs];
  const Tensor in[1] = {weight};
  ops::call(op, in, {{"group", group}, {"scale_dtype", scale_dtype}}, out);
  return {std::move(out[0]), std::move(out[1]), group};
}

Tensor dequantize_int4(const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("dequantize_int4");
  return ops::call(op, {q, scale});
}

Tensor linear_int4(const Tensor& x, const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("linear_int4");
  return ops::call(op, {x, q, scale});
}

Fp8Weight quantize_fp8(const Tensor& weight) {
  static const ops::OpDef& op = op_named("quantize_fp8");
  Tensor out[ops::kMaxOutputs];
  const Tensor in[1] = {weight};
  ops::call(op, in, {}, out);
  return {std::move(out[0]), std::move(out[1])};
}

Tensor dequantize_fp8(const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("dequantize_fp8");
  return ops::call(op, {q, scale});
}

Tensor linear_fp8(const Tensor& x, const Tensor& q, const Tensor& scale) {
  static const ops::OpDef& op = op_named("linear_fp8");
  return ops::call(op, {x, q, scale});
}

Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, int64_t block_n, int64_t block_k) {
  static const ops::OpDef& op = op_named("dequantize_fp8");
  return ops::call(op, {q, scale}, {{"block_n", block_n}, {"block_k", block_k}});
}

Tensor linear_fp8(const Tensor& x, const Tensor& q, const Tensor& scale, int64_t block_n, int64_t block_k) {
  static const ops::OpDef& op = op_named("linear_fp8");
  return ops::call(op, {x, q, scale}, {{"block_n", block_n}, {"block_k", block_k}});
}

}  // namespace tpu
