// reduce_buffers (sim/pod.h): the element-wise reduction of a collective, rank by rank in rank
// order. bf16 accumulates in f32 and rounds once; integers wrap (two's complement).
#include <algorithm>
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

// IEEE half <-> f32 (round to nearest even; NaN stays NaN).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13);
  else if (man == 0) bits = sign;
  else {  // subnormal: normalize
    int e = -1;
    do { ++e; man <<= 1; } while (!(man & 0x400u));
    bits = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);              // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);             // overflow (incl. inf)
  if (a < 0x38800000u) {                                             // subnormal or zero
    if (a < 0x33000000u) return sign;                                // rounds to zero
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(a >> 23);                            // 14..24
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((a - 0x38000000u) >> 13);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

}  // namespace

int elem_size(DType dtype, ElemType elem) {
  switch (elem) {
    case ElemType::native: return dtype_size(dtype);
    case ElemType::f16: return 2;
    case ElemType::u8:
    case ElemType::boolean: return 1;
  }
  return 1;
}

std::string elem_name(DType dtype, ElemType elem) {
  switch (elem) {
    case ElemType::native: return std::string(dtype_name(dtype));
    case ElemType::f16: return "f16";
    case ElemType::u8: return "u8";
    case ElemType::boolean: return "bool";
  }
  return "?";
}

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

void reduce_buffers(DType dtype, ReduceOp op, const std::vector<const void*>& in, void* out, uint64_t n,
                    ElemType elem) {
  if (in.empty()) throw SimError("reduce_buffers: no inputs");
  const float ranks = static_cast<float>(in.size());
  switch (elem) {
    case ElemType::native: break;
    case ElemType::f16:
      reduce_loop<float>(
          op, in.size(), n,
          [&](size_t r, uint64_t i) {
            uint16_t h;
            std::memcpy(&h, static_cast<const uint8_t*>(in[r]) + i * 2, 2);
            return f16_to_f32(h);
          },
          [&](uint64_t i, float v) {
            if (op == ReduceOp::avg) v /= ranks;
            const uint16_t h = f32_to_f16(v);
            std::memcpy(static_cast<uint8_t*>(out) + i * 2, &h, 2);
          });
      return;
    case ElemType::u8: {
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t acc = static_cast<const uint8_t*>(in[0])[i], wrap = acc;
        for (size_t r = 1; r < in.size(); ++r) {
          const uint64_t v = static_cast<const uint8_t*>(in[r])[i];
          if (op == ReduceOp::sum) wrap += v;
          if (op == ReduceOp::prod) wrap *= v;
          if (op == ReduceOp::avg) acc += v;
          if (op == ReduceOp::max) acc = std::max(acc, v);
          if (op == ReduceOp::min) acc = std::min(acc, v);
        }
        if (op == ReduceOp::sum || op == ReduceOp::prod) acc = wrap;
        if (op == ReduceOp::avg) acc /= in.size();
        static_cast<uint8_t*>(out)[i] = uint8_t(acc);
      }
      return;
    }
    case ElemType::boolean: {
      const bool any = op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::avg;
      for (uint64_t i = 0; i < n; ++i) {
        bool acc = static_cast<const uint8_t*>(in[0])[i] != 0;
        for (size_t r = 1; r < in.size(); ++r) {
          const bool v = static_cast<const uint8_t*>(in[r])[i] != 0;
          acc = any ? (acc || v) : (acc && v);
        }
        static_cast<uint8_t*>(out)[i] = acc ? 1 : 0;
      }
      return;
    }
  }
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
    case DType::f8e4m3: throw SimError("pod reduction: f8e4m3 buffers cannot be reduced (widen them to bf16 or f32 first)");
  }
}

}  // namespace tpu::sim
