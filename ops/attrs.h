// Attrs: the fixed, non-tensor parameters of one op call (dims, scalars, dtypes, flags),
// stored as plain data so the tracer can record, hash, compare and serialize them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tpucore/core/dtype.h"
#include "tpucore/core/scalar.h"
#include "tpucore/core/device.h"

namespace tpu::ops {

using AttrValue = std::variant<std::monostate, int64_t, double, bool, DType, std::vector<int64_t>, std::string, Scalar, Device>;

struct Attr {
  const char* name;  // a string literal
  AttrValue value;
};

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<Attr> items) : items_(items) {}

  bool has(std::string_view name) const { return find(name) != nullptr; }
  const AttrValue* find(std::string_view name) const;
  void set(const char* name, AttrValue v);

  // Typed getters; a missing attribute or wrong type is an internal error naming the attr.
  int64_t get_int(std::string_view name) const;
  int64_t get_int(std::string_view name, int64_t dflt) const;
  double get_float(std::string_view name) const;
  bool get_bool(std::string_view name, bool dflt = false) const;
  DType get_dtype(std::string_view name) const;
  Device get_device(std::string_view name) const;
  Scalar get_scalar(std::string_view name) const;
  const std::vector<int64_t>& get_ints(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;

  const std::vector<Attr>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  std::string str() const;  // "dim=[0, 1], keepdim=true"

 private:
  std::vector<Attr> items_;
};

std::string attr_value_str(const AttrValue& v);

}  // namespace tpu::ops
