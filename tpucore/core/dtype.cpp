#include "tpucore/core/dtype.h"

#include "tpucore/core/error.h"

namespace tpu {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i8: case DType::u8: case DType::boolean: case DType::f8e4m3: case DType::f8e5m2: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  struct Name { std::string_view n; DType t; };
  static constexpr Name names[] = {
      {"f32", DType::f32},    {"float32", DType::f32}, {"float", DType::f32},
      {"bf16", DType::bf16},  {"bfloat16", DType::bf16},
      {"f16", DType::f16},    {"float16", DType::f16}, {"half", DType::f16},
      {"i32", DType::i32},    {"int32", DType::i32},   {"int", DType::i32},
      {"i64", DType::i64},    {"int64", DType::i64},   {"long", DType::i64},
      {"i8", DType::i8},      {"int8", DType::i8},
      {"u8", DType::u8},      {"uint8", DType::u8},
      {"bool", DType::boolean},
      {"f8e4m3", DType::f8e4m3}, {"float8_e4m3fn", DType::f8e4m3}, {"f8e4m3fn", DType::f8e4m3},
      {"f8e5m2", DType::f8e5m2}, {"float8_e5m2", DType::f8e5m2}};
  for (const auto& n : names)
    if (n.n == s) return n.t;
  fail("parse_dtype: unknown dtype '{}' (expected one of f32, bf16, f16, i32, i64, i8, u8, bool, f8e4m3, f8e5m2)", s);
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16 || is_float8(t); }
bool is_integral(DType t, bool include_bool) {
  if (t == DType::boolean) return include_bool;
  return t == DType::i32 || t == DType::i64 || t == DType::i8 || t == DType::u8;
}

DTypeCategory dtype_category(DType t) {
  if (t == DType::boolean) return DTypeCategory::boolean;
  if (is_floating(t)) return DTypeCategory::floating;
  return DTypeCategory::integer;
}

void fail_float8_compute(DType t) {
  fail("dtype {} is a storage type: no kernel computes on it (convert it with to(f32) or to(bf16) first; "
       "float8 tensors support to(dtype), copies, views, printing and item())",
       dtype_name(t));
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_float8(a) || is_float8(b))
    fail("promote_types: promotion of float8 types is not supported ({} and {}); convert explicitly with to(dtype)",
         dtype_name(a), dtype_name(b));
  // Order of the table: f32 bf16 f16 i32 i8 u8 bool i64
  using D = DType;
  static constexpr D table[8][8] = {
      /* f32  */ {D::f32, D::f32, D::f32, D::f32, D::f32, D::f32, D::f32, D::f32},
      /* bf16 */ {D::f32, D::bf16, D::f32, D::bf16, D::bf16, D::bf16, D::bf16, D::bf16},
      /* f16  */ {D::f32, D::f32, D::f16, D::f16, D::f16, D::f16, D::f16, D::f16},
      /* i32  */ {D::f32, D::bf16, D::f16, D::i32, D::i32, D::i32, D::i32, D::i64},
      /* i8   */ {D::f32, D::bf16, D::f16, D::i32, D::i8, D::i32, D::i8, D::i64},
      /* u8   */ {D::f32, D::bf16, D::f16, D::i32, D::i32, D::u8, D::u8, D::i64},
      /* bool */ {D::f32, D::bf16, D::f16, D::i32, D::i8, D::u8, D::boolean, D::i64},
      /* i64  */ {D::f32, D::bf16, D::f16, D::i64, D::i64, D::i64, D::i64, D::i64},
  };
  return table[static_cast<int>(a)][static_cast<int>(b)];
}

void ResultTypeState::update(DType t, bool zero_dim, bool wrapped) {
  int* slot = wrapped ? &wrapped_result : zero_dim ? &zero_dim_result : &dim_result;
  DType v = t;
  if (wrapped) {
    // A wrapped scalar stands for its category's default type.
    v = is_floating(t) ? DType::f32 : (t == DType::boolean ? DType::boolean : DType::i32);
  }
  *slot = *slot < 0 ? static_cast<int>(v) : static_cast<int>(promote_types(static_cast<DType>(*slot), v));
}

static int combine(int higher, int lower) {
  if (higher < 0) return lower;
  if (lower < 0) return higher;
  DType h = static_cast<DType>(higher), l = static_cast<DType>(lower);
  if (dtype_category(h) < dtype_category(l)) {
    // The lower-priority operand lifts the category; use its (default) type, widened only by
    // promote within that category where the higher operand had nothing to say.
    return static_cast<int>(l);
  }
  return higher;
}

DType ResultTypeState::result() const {
  int r = combine(combine(dim_result, zero_dim_result), wrapped_result);
  return r < 0 ? DType::f32 : static_cast<DType>(r);
}

}  // namespace tpu
