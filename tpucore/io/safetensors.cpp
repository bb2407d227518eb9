// safetensors reader and writer (see tpucore/safetensors.h for the format and the rules).
#include "tpucore/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "tpucore/core/hooks.h"
#include <set>

#include "tpucore/ops.h"

namespace tpu {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "F32"}, {DType::bf16, "BF16"}, {DType::f16, "F16"},
                                     {DType::i32, "I32"}, {DType::i8, "I8"},     {DType::u8, "U8"},
                                     {DType::boolean, "BOOL"}, {DType::i64, "I64"},
                                     {DType::f8e4m3, "F8_E4M3"}, {DType::f8e5m2, "F8_E5M2"}};
// Valid in the format, not (yet) tensor types of tpucore.
constexpr const char* kUnsupportedNames[] = {"F64", "I16", "U16", "U32", "U64"};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// Where the bytes come from: a file (read piecewise, so big checkpoints are not held twice) or
// a span in memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  virtual void read(uint64_t offset, void* dst, uint64_t n) = 0;  // in range: checked by the caller
};

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const uint8_t> b) : b_(b) {}
  uint64_t size() const override { return b_.size(); }
  void read(uint64_t offset, void* dst, uint64_t n) override {
    if (n) std::memcpy(dst, b_.data() + offset, n);
  }

 private:
  std::span<const uint8_t> b_;
};

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    TPU_CHECK(f_ != nullptr, "load_safetensors: cannot open '{}': {}", path, std::strerror(errno));
    std::error_code ec;
    size_ = std::filesystem::file_size(path, ec);
    if (ec) {
      std::fclose(f_);
      fail("load_safetensors: cannot read the size of '{}': {}", path, ec.message());
    }
  }
  ~FileSource() override { std::fclose(f_); }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* dst, uint64_t n) override {
    if (n == 0) return;
    TPU_CHECK(fseeko(f_, static_cast<off_t>(offset), SEEK_SET) == 0 && std::fread(dst, 1, n, f_) == n,
              "load_safetensors: '{}': reading {} bytes at offset {} failed (file changed while reading?)", path_, n,
              offset);
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t size_ = 0;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// Parses the JSON header, rejecting duplicate keys (nlohmann would keep the last silently).
json parse_header_json(const std::string& text, std::string_view file) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string dup;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) keys.emplace_back();
    else if (ev == json::parse_event_t::object_end) keys.pop_back();
    else if (ev == json::parse_event_t::key && !keys.empty() && dup.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) dup = depth == 1 ? fmt::format("tensor name '{}'", k) : fmt::format("key '{}'", k);
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::exception& e) {
    fail("load_safetensors: '{}': the header is not valid JSON: {}", file, e.what());
  }
  TPU_CHECK(dup.empty(), "load_safetensors: '{}': duplicate {} in the header", file, dup);
  TPU_CHECK(j.is_object(), "load_safetensors: '{}': the header must be a JSON object, got {}", file, j.type_name());
  return j;
}

uint64_t checked_span(const Entry& e, std::string_view file) {
  uint64_t n = dtype_size(e.dtype);
  for (int i = 0; i < e.shape.ndim(); ++i) {
    TPU_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(e.shape[i]), &n),
              "load_safetensors: '{}': tensor '{}': shape {} is too large", file, e.name, e.shape.str());
  }
  return n;
}

Entry parse_entry(const std::string& name, const json& v, std::string_view file) {
  TPU_CHECK(v.is_object(), "load_safetensors: '{}': tensor '{}': the entry must be an object, got {}", file, name,
            v.type_name());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    TPU_CHECK(v.contains(field), "load_safetensors: '{}': tensor '{}': missing field '{}'", file, name, field);
  Entry e;
  e.name = name;
  const json& dt = v["dtype"];
  TPU_CHECK(dt.is_string(), "load_safetensors: '{}': tensor '{}': field 'dtype' must be a string, got {}", file, name,
            dt.type_name());
  e.dtype = parse_safetensors_dtype(dt.get_ref<const std::string&>(),
                                    fmt::format("load_safetensors: '{}': tensor '{}'", file, name));
  const json& sh = v["shape"];
  TPU_CHECK(sh.is_array(), "load_safetensors: '{}': tensor '{}': field 'shape' must be an array, got {}", file, name,
            sh.type_name());
  TPU_CHECK(sh.size() <= static_cast<size_t>(kMaxDims),
            "load_safetensors: '{}': tensor '{}': shape has {} dimensions, at most {} are supported", file, name,
            sh.size(), kMaxDims);
  for (const json& d : sh) {
    TPU_CHECK(d.is_number_integer(), "load_safetensors: '{}': tensor '{}': field 'shape' holds {} ({}), not an integer",
              file, name, d.dump(), d.type_name());
    TPU_CHECK(d.is_number_unsigned() || d.get<int64_t>() >= 0,
              "load_safetensors: '{}': tensor '{}': negative dimension {} in field 'shape'", file, name, d.dump());
    TPU_CHECK(d.is_number_integer() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
              "load_safetensors: '{}': tensor '{}': dimension {} is too large", file, name, d.dump());
    e.shape.push_back(d.get<int64_t>());
  }
  const json& off = v["data_offsets"];
  TPU_CHECK(off.is_array() && off.size() == 2,
            "load_safetensors: '{}': tensor '{}': field 'data_offsets' must be [begin, end], got {}", file, name,
            off.dump());
  for (const json& o : off)
    TPU_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
              "load_safetensors: '{}': tensor '{}': field 'data_offsets' must hold non-negative integers, got {}",
              file, name, off.dump());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  TPU_CHECK(e.begin <= e.end, "load_safetensors: '{}': tensor '{}': data_offsets [{}, {}] end before they begin", file,
            name, e.begin, e.end);
  const uint64_t want = checked_span(e, file);
  TPU_CHECK(e.end - e.begin == want,
            "load_safetensors: '{}': tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}",
            file, name, e.begin, e.end, e.end - e.begin, e.shape.str(), safetensors_dtype_name(e.dtype), want);
  return e;
}

StringMap parse_metadata(const json& m, std::string_view file) {
  TPU_CHECK(m.is_object(), "load_safetensors: '{}': '__metadata__' must be an object of strings, got {}", file,
            m.type_name());
  StringMap out;
  for (const auto& [k, v] : m.items()) {
    TPU_CHECK(v.is_string(), "load_safetensors: '{}': '__metadata__' entry '{}' must be a string, got {}", file, k,
              v.type_name());
    out[k] = v.get<std::string>();
  }
  return out;
}

// Spans sorted by begin must tile [0, data_size) exactly.
void check_layout(std::vector<Entry>& entries, uint64_t data_size, std::string_view file) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    TPU_CHECK(e.end <= data_size,
              "load_safetensors: '{}': tensor '{}': data_offsets [{}, {}] are out of range: the data buffer has {} "
              "bytes",
              file, e.name, e.begin, e.end, data_size);
    if (e.begin < pos)
      fail("load_safetensors: '{}': tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, prev->name, prev->begin,
           prev->end, e.name, e.begin, e.end);
    TPU_CHECK(e.begin == pos,
              "load_safetensors: '{}': bytes [{}, {}) of the data buffer belong to no tensor (before tensor '{}'; "
              "safetensors files have no holes)",
              file, pos, e.begin, e.name);
    pos = e.end;
    prev = &e;
  }
  TPU_CHECK(pos == data_size,
            "load_safetensors: '{}': the data buffer has {} bytes but the tensors cover only {} (trailing bytes)", file,
            data_size, pos);
}

// Checks the header and layout, then reads the tensors one at a time in file order, handing
// each to `fn` (which may keep or drop it) before reading the next.
StringMap read_each(ByteSource& src, std::string_view file, Device device,
                    const std::function<void(const std::string&, Tensor)>& fn) {
  const uint64_t size = src.size();
  TPU_CHECK(size >= 8, "load_safetensors: '{}': truncated file: {} bytes, fewer than the 8-byte header length", file,
            size);
  uint8_t len_bytes[8];
  src.read(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TPU_CHECK(n <= kMaxHeaderBytes, "load_safetensors: '{}': absurd header length {} (limit {}); not a safetensors file?",
            file, n, kMaxHeaderBytes);
  TPU_CHECK(n <= size - 8,
            "load_safetensors: '{}': truncated file: the header length is {} bytes but only {} follow it", file, n,
            size - 8);
  std::string text(n, '\0');
  src.read(8, text.data(), n);
  TPU_CHECK(!text.empty() && text[0] == '{',
            "load_safetensors: '{}': the header must start with '{{' (a JSON object); not a safetensors file?", file);
  const json j = parse_header_json(text, file);

  StringMap metadata;
  std::vector<Entry> entries;
  for (const auto& [k, v] : j.items()) {
    if (k == "__metadata__") metadata = parse_metadata(v, file);
    else entries.push_back(parse_entry(k, v, file));
  }
  const uint64_t data_start = 8 + n, data_size = size - data_start;
  check_layout(entries, data_size, file);

  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, TensorOptions(e.dtype));
    src.read(data_start + e.begin, t.numel() ? t.raw_data() : nullptr, e.end - e.begin);
    if (e.dtype == DType::boolean) {  // any nonzero byte is true; keep bool storage 0/1
      auto* p = static_cast<uint8_t*>(t.numel() ? t.raw_data() : nullptr);
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] != 0;
    }
    if (!device.is_cpu()) t = t.to(device);
    fn(e.name, std::move(t));
  }
  return metadata;
}

SafetensorsContents read_from(ByteSource& src, std::string_view file, Device device) {
  SafetensorsContents out;
  out.metadata = read_each(src, file, device, [&](const std::string& name, Tensor t) {
    out.tensors.emplace(name, std::move(t));
  });
  return out;
}

struct Prepared {
  std::vector<std::pair<std::string, Tensor>> host;  // contiguous host tensors, in order
  std::string header;                                // padded
};

Prepared prepare(const TensorList& tensors, const StringMap& metadata) {
  Prepared p;
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t pos = 0;
  for (const auto& [name, t_in] : tensors) {
    // A deferred eager value (tpucore/defer.h) is read, as item() does.
    const Tensor t = t_in.defined() && t_in.is_proxy() && detail::proxy_deferred(t_in)
                         ? detail::materialize_proxy(t_in, "save_safetensors")
                         : t_in;
    TPU_CHECK(name != "__metadata__", "save_safetensors: '__metadata__' is reserved and cannot name a tensor");
    TPU_CHECK(seen.insert(name).second, "save_safetensors: duplicate tensor name '{}'", name);
    TPU_CHECK(t.defined(), "save_safetensors: tensor '{}' is undefined", name);
    TPU_CHECK(!t.is_proxy(), "save_safetensors: tensor '{}' is a traced value inside tpu::compile; save outside it",
              name);
    Tensor host = t.contiguous();
    if (!host.device().is_cpu()) host = host.to(Device());
    host = host.contiguous();
    const uint64_t nb = host.nbytes();
    h[name] = {{"dtype", safetensors_dtype_name(host.dtype())},
               {"shape", host.shape().vec()},
               {"data_offsets", {pos, pos + nb}}};
    pos += nb;
    p.host.emplace_back(name, std::move(host));
  }
  p.header = h.dump();
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

void put_u64(uint8_t* dst, uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

std::string_view safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  fail("safetensors: no safetensors name for dtype {}", dtype_name(t));
}

DType parse_safetensors_dtype(std::string_view s, std::string_view where) {
  for (const auto& d : kDTypeNames)
    if (s == d.name) return d.dtype;
  for (const char* u : kUnsupportedNames)
    if (s == u) fail("{}: dtype '{}' is not supported by tpucore (supported: {})", where, s, supported_list());
  fail("{}: unknown dtype '{}' (supported: {})", where, s, supported_list());
}

std::vector<uint8_t> serialize_safetensors(const TensorList& tensors, const StringMap& metadata) {
  Prepared p = prepare(tensors, metadata);
  uint64_t total = 8 + p.header.size();
  for (const auto& [n, t] : p.host) total += t.nbytes();
  std::vector<uint8_t> out(total);
  put_u64(out.data(), p.header.size());
  std::memcpy(out.data() + 8, p.header.data(), p.header.size());
  uint64_t pos = 8 + p.header.size();
  for (const auto& [n, t] : p.host) {
    if (t.nbytes()) std::memcpy(out.data() + pos, t.raw_data(), t.nbytes());
    pos += t.nbytes();
  }
  return out;
}

void save_safetensors(const std::string& path, const TensorList& tensors, const StringMap& metadata) {
  Prepared p = prepare(tensors, metadata);
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  TPU_CHECK(f != nullptr, "save_safetensors: cannot open '{}' for writing: {}", tmp, std::strerror(errno));
  uint8_t len[8];
  put_u64(len, p.header.size());
  bool ok = std::fwrite(len, 1, 8, f.get()) == 8 &&
            std::fwrite(p.header.data(), 1, p.header.size(), f.get()) == p.header.size();
  for (const auto& [n, t] : p.host)
    if (ok && t.nbytes()) ok = std::fwrite(t.raw_data(), 1, t.nbytes(), f.get()) == t.nbytes();
  const int close_rc = std::fclose(f.release());
  if (!ok || close_rc != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail("save_safetensors: writing '{}' failed: {}", tmp, why);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("save_safetensors: cannot rename '{}' to '{}': {}", tmp, path, ec.message());
  }
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const StringMap& metadata) {
  save_safetensors(path, TensorList(tensors.begin(), tensors.end()), metadata);
}

SafetensorsContents read_safetensors(const std::string& path, Device device) {
  FileSource src(path);
  return read_from(src, path, device);
}

StringMap for_each_safetensor(const std::string& path, const std::function<void(const std::string&, Tensor)>& fn,
                              Device device) {
  FileSource src(path);
  return read_each(src, path, device, fn);
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, Device device) {
  return read_safetensors(path, device).tensors;
}

SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, std::string_view name, Device device) {
  MemorySource src(bytes);
  return read_from(src, name, device);
}

void check_checkpoint_tensor(std::string_view what, std::string_view name, std::string_view source,
                             const Tensor& loaded, const Tensor& expected) {
  TPU_CHECK(loaded.defined(), "{}: tensor '{}' is missing from {}", what, name, source);
  if (loaded.dtype() != expected.dtype() || loaded.shape() != expected.shape())
    fail("{}: tensor '{}' in {} is {} {}, the module expects {} {}", what, name, source, dtype_name(loaded.dtype()),
         loaded.shape().str(), dtype_name(expected.dtype()), expected.shape().str());
}

}  // namespace tpu
