// Element-wise reductions for the collectives (the function Gloo's allreduce calls per segment).
// bf16/f16 combine in f32 and round once per pair; bool treats sum/max as "or" and product/min
// as "and".
#include <algorithm>
#include <cstdint>

#include "tpucore/dist/backend.h"

namespace tpu::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::product: return "product";
  }
  return "?";
}

namespace {

template <class T, class Acc, class F>
void loop(void* out, const void* a, const void* b, size_t n, F f) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(f(static_cast<Acc>(x[i]), static_cast<Acc>(y[i])));
}

template <class T, class Acc>
ReduceFn pick(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return [](void* o, const void* a, const void* b, size_t n) { loop<T, Acc>(o, a, b, n, [](Acc x, Acc y) { return x + y; }); };
    case ReduceOp::product:
      return [](void* o, const void* a, const void* b, size_t n) { loop<T, Acc>(o, a, b, n, [](Acc x, Acc y) { return x * y; }); };
    case ReduceOp::max:
      return [](void* o, const void* a, const void* b, size_t n) { loop<T, Acc>(o, a, b, n, [](Acc x, Acc y) { return std::max(x, y); }); };
    case ReduceOp::min:
      return [](void* o, const void* a, const void* b, size_t n) { loop<T, Acc>(o, a, b, n, [](Acc x, Acc y) { return std::min(x, y); }); };
  }
  return nullptr;
}

ReduceFn pick_bool(ReduceOp op) {
  if (op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::max)
    return [](void* o, const void* a, const void* b, size_t n) { loop<bool, bool>(o, a, b, n, [](bool x, bool y) { return x || y; }); };
  return [](void* o, const void* a, const void* b, size_t n) { loop<bool, bool>(o, a, b, n, [](bool x, bool y) { return x && y; }); };
}

}  // namespace

ReduceFn reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return pick<float, float>(op);
    case DType::bf16: return pick<bf16, float>(op);
    case DType::f16: return pick<f16, float>(op);
    // Integers wrap like the element type (computed in 64 bits, then truncated).
    case DType::i32: return pick<int32_t, int64_t>(op);
    case DType::i64:  // sums and products wrap modulo 2^64 (computed unsigned: no signed overflow)
      return op == ReduceOp::max || op == ReduceOp::min ? pick<int64_t, int64_t>(op) : pick<int64_t, uint64_t>(op);
    case DType::i8: return pick<int8_t, int64_t>(op);
    case DType::u8: return pick<uint8_t, int64_t>(op);
    case DType::boolean: return pick_bool(op);
    case DType::f8e4m3: case DType::f8e5m2: fail_float8_compute(dtype);
  }
  return nullptr;
}

}  // namespace tpu::dist
