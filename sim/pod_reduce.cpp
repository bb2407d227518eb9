// reduce_buffers (sim/pod.h): the element-wise reduction of a collective, rank by rank in rank
// order. bf16 accumulates in f32 and rounds once; integers wrap (two's complement).
#include <cstring>
#include <vector>

#include "sim/error.h"
#include "sim/pod.h"

namespace tpu::sim {
namespace {

template <class Acc, class Load, class Store>
void reduce_loop(ReduceOp op, size_t ranks, uint64_t n, Load load, Store store) {
  for (uint64_t i = 0; i < n; ++i) {
    Acc acc = load(0, i);
    for (size_t r = 1; r < ranks; ++r) {
      const Acc v = load(r, i);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc = Acc(acc + v); break;
        case ReduceOp::prod: acc = Acc(acc * v); break;
        case ReduceOp::max: acc = (v > acc || v != v) ? v : acc; break;  // NaN wins, as in torch
        case ReduceOp::min: acc = (v < acc || v != v) ? v : acc; break;
      }
    }
    store(i, acc);
  }
}

// Integers: sum/prod wrap in uint64 (then truncate), avg divides the exact int64 sum.
template <class T>
void reduce_int(ReduceOp op, const std::vector<const void*>& in, void* out, uint64_t n) {
  auto load = [&](size_t r, uint64_t i) {
    T v;
    std::memcpy(&v, static_cast<const uint8_t*>(in[r]) + i * sizeof(T), sizeof(T));
    return v;
  };
  for (uint64_t i = 0; i < n; ++i) {
    int64_t acc = load(0, i);
    uint64_t wrap = static_cast<uint64_t>(acc);
    for (size_t r = 1; r < in.size(); ++r) {
      const int64_t v = load(r, i);
      switch (op) {
        case ReduceOp::sum: wrap += static_cast<uint64_t>(v); break;
        case ReduceOp::avg: acc += v; break;
        case ReduceOp::prod: wrap *= static_cast<uint64_t>(v); break;
        case ReduceOp::max: acc = std::max(acc, v); break;
        case ReduceOp::min: acc = std::min(acc, v); break;
      }
    }
    T res;
    if (op == ReduceOp::sum || op == ReduceOp::prod) res = static_cast<T>(wrap);
    else if (op == ReduceOp::avg) res = static_cast<T>(acc / static_cast<int64_t>(in.size()));
    else res = static_cast<T>(acc);
    std::memcpy(static_cast<uint8_t*>(out) + i * sizeof(T), &res, sizeof(T));
  }
}

}  // namespace

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

void reduce_buffers(DType dtype, ReduceOp op, const std::vector<const void*>& in, void* out, uint64_t n) {
  if (in.empty()) throw SimError("reduce_buffers: no inputs");
  const float ranks = static_cast<float>(in.size());
  switch (dtype) {
    case DType::f32:
      reduce_loop<float>(
          op, in.size(), n,
          [&](size_t r, uint64_t i) {
            float v;
            std::memcpy(&v, static_cast<const uint8_t*>(in[r]) + i * 4, 4);
            return v;
          },
          [&](uint64_t i, float v) {
            if (op == ReduceOp::avg) v /= ranks;
            std::memcpy(static_cast<uint8_t*>(out) + i * 4, &v, 4);
          });
      return;
    case DType::bf16:
      reduce_loop<float>(
          op, in.size(), n,
          [&](size_t r, uint64_t i) {
            uint16_t b;
            std::memcpy(&b, static_cast<const uint8_t*>(in[r]) + i * 2, 2);
            return bf16_bits_to_f32(b);
          },
          [&](uint64_t i, float v) {
            if (op == ReduceOp::avg) v /= ranks;
            const uint16_t b = f32_to_bf16_bits(v);
            std::memcpy(static_cast<uint8_t*>(out) + i * 2, &b, 2);
          });
      return;
    case DType::i32: reduce_int<int32_t>(op, in, out, n); return;
    case DType::i8: reduce_int<int8_t>(op, in, out, n); return;
  }
}

}  // namespace tpu::sim
