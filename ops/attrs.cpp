#include "ops/attrs.h"

#include <fmt/format.h>

#include <cstring>

#include "tpucore/core/error.h"

namespace tpu::ops {

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& a : items_)
    if (name == a.name) return &a.value;
  return nullptr;
}

void Attrs::set(const char* name, AttrValue v) {
  for (auto& a : items_)
    if (std::strcmp(a.name, name) == 0) {
      a.value = std::move(v);
      return;
    }
  items_.push_back({name, std::move(v)});
}

template <class T>
static const T& get_as(const Attrs& a, std::string_view name) {
  const AttrValue* v = a.find(name);
  if (!v) fail("internal: op attribute '{}' is missing", name);
  const T* p = std::get_if<T>(v);
  if (!p) fail("internal: op attribute '{}' has the wrong type", name);
  return *p;
}

int64_t Attrs::get_int(std::string_view name) const {
  const AttrValue* v = find(name);
  if (v) {
    if (auto* b = std::get_if<bool>(v)) return *b;
    if (auto* s = std::get_if<Scalar>(v)) return s->to_int();
  }
  return get_as<int64_t>(*this, name);
}
int64_t Attrs::get_int(std::string_view name, int64_t dflt) const { return has(name) ? get_int(name) : dflt; }
double Attrs::get_float(std::string_view name) const {
  const AttrValue* v = find(name);
  if (v) {
    if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
    if (auto* s = std::get_if<Scalar>(v)) return s->to_double();
  }
  return get_as<double>(*this, name);
}
bool Attrs::get_bool(std::string_view name, bool dflt) const { return has(name) ? get_as<bool>(*this, name) : dflt; }
DType Attrs::get_dtype(std::string_view name) const { return get_as<DType>(*this, name); }
Device Attrs::get_device(std::string_view name) const { return get_as<Device>(*this, name); }
Scalar Attrs::get_scalar(std::string_view name) const {
  const AttrValue* v = find(name);
  if (v) {
    if (auto* d = std::get_if<double>(v)) return Scalar(*d);
    if (auto* i = std::get_if<int64_t>(v)) return Scalar(static_cast<long long>(*i));
    if (auto* b = std::get_if<bool>(v)) return Scalar(*b);
  }
  return get_as<Scalar>(*this, name);
}
const std::vector<int64_t>& Attrs::get_ints(std::string_view name) const {
  return get_as<std::vector<int64_t>>(*this, name);
}
const std::string& Attrs::get_string(std::string_view name) const { return get_as<std::string>(*this, name); }

std::string attr_value_str(const AttrValue& v) {
  struct V {
    std::string operator()(std::monostate) const { return "none"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(DType t) const { return std::string(dtype_name(t)); }
    std::string operator()(const std::vector<int64_t>& d) const { return fmt::format("[{}]", fmt::join(d, ", ")); }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
    std::string operator()(const Scalar& s) const { return s.str(); }
    std::string operator()(const Device& d) const { return d.str(); }
  };
  return std::visit(V{}, v);
}

std::string Attrs::str() const {
  std::string r;
  for (const auto& a : items_) {
    if (!r.empty()) r += ", ";
    r += a.name;
    r += "=";
    r += attr_value_str(a.value);
  }
  return r;
}

}  // namespace tpu::ops
