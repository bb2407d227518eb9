// IDX files (plain or gzip), and Fashion-MNIST from Debian's dataset-fashion-mnist package.
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tpucore/data.h"
#include "tpucore/ops.h"

namespace tpu::data {

namespace {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr uint64_t kMaxDecompressedBytes = uint64_t{1} << 34;  // 16 GiB: a guard against gzip bombs

std::vector<uint8_t> read_file(const std::string& path, const char* op) {
  std::ifstream f(path, std::ios::binary);
  TPU_CHECK(f.good(), "{}: cannot open '{}': {}", op, path, std::strerror(errno));
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TPU_CHECK(!f.bad(), "{}: reading '{}' failed", op, path);
  return b;
}

bool is_gzip(std::span<const uint8_t> b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

struct IdxType {
  uint8_t code;
  const char* name;
  size_t size;
  DType dtype;
};
constexpr IdxType kIdxTypes[] = {{0x08, "u8", 1, DType::u8},   {0x09, "i8", 1, DType::i8},
                                 {0x0B, "i16", 2, DType::i32}, {0x0C, "i32", 4, DType::i32},
                                 {0x0D, "f32", 4, DType::f32}, {0x0E, "f64", 8, DType::f32}};

uint64_t load_be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::vector<uint8_t> gunzip(std::span<const uint8_t> bytes, std::string_view name) {
  z_stream s{};
  TPU_CHECK(inflateInit2(&s, 15 + 32) == Z_OK, "gunzip: '{}': zlib initialization failed", name);
  std::vector<uint8_t> out(std::max<size_t>(bytes.size() * 2, 4096));
  s.next_in = const_cast<Bytef*>(bytes.data());
  uint64_t in_left = bytes.size();
  size_t produced = 0;
  int rc = Z_OK;
  std::string err;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= kMaxDecompressedBytes) {
        err = fmt::format("decompressed data exceeds {} bytes", kMaxDecompressedBytes);
        break;
      }
      out.resize(out.size() * 2);
    }
    const uInt in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
    const uInt out_chunk = static_cast<uInt>(std::min<size_t>(out.size() - produced, 1u << 30));
    s.avail_in = in_chunk;
    s.next_out = out.data() + produced;
    s.avail_out = out_chunk;
    rc = inflate(&s, Z_NO_FLUSH);
    in_left -= in_chunk - s.avail_in;
    produced += out_chunk - s.avail_out;
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (as `cat a.gz b.gz`); trailing zero padding is ignored.
      const uint8_t* rest = s.next_in;
      if (in_left >= 2 && rest[0] == 0x1f && rest[1] == 0x8b) {
        inflateReset(&s);
        continue;
      }
      break;
    }
    if (rc == Z_BUF_ERROR && in_left == 0 && s.avail_out > 0) {
      err = "truncated gzip stream (unexpected end of data)";
      break;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      err = fmt::format("corrupt gzip stream: {}", s.msg ? s.msg : zError(rc));
      break;
    }
  }
  inflateEnd(&s);
  TPU_CHECK(err.empty(), "gunzip: '{}': {}", name, err);
  out.resize(produced);
  return out;
}

Tensor parse_idx(std::span<const uint8_t> bytes, std::string_view name) {
  std::vector<uint8_t> inflated;
  if (is_gzip(bytes)) {
    inflated = gunzip(bytes, name);
    bytes = inflated;
  }
  TPU_CHECK(bytes.size() >= 4, "read_idx: '{}': truncated file: {} bytes, fewer than the 4-byte magic", name,
            bytes.size());
  TPU_CHECK(bytes[0] == 0 && bytes[1] == 0,
            "read_idx: '{}': bad magic {:02x} {:02x} {:02x} {:02x} (an IDX file starts with 00 00 <type> <dims>)", name,
            bytes[0], bytes[1], bytes[2], bytes[3]);
  const IdxType* type = nullptr;
  for (const auto& t : kIdxTypes)
    if (t.code == bytes[2]) type = &t;
  TPU_CHECK(type != nullptr, "read_idx: '{}': unknown IDX type byte 0x{:02x} (known: 08 u8, 09 i8, 0B i16, 0C i32, 0D f32, 0E f64)",
            name, bytes[2]);
  const int ndim = bytes[3];
  TPU_CHECK(ndim <= kMaxDims, "read_idx: '{}': {} dimensions, at most {} are supported", name, ndim, kMaxDims);
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  TPU_CHECK(bytes.size() >= header, "read_idx: '{}': truncated file: {} bytes, the header of {} dims needs {}", name,
            bytes.size(), ndim, header);
  Shape shape;
  uint64_t numel = 1, need = 0;
  bool overflow = false;
  for (int i = 0; i < ndim; ++i) {
    const uint64_t d = load_be(bytes.data() + 4 + 4 * i, 4);
    shape.push_back(static_cast<int64_t>(d));
    overflow |= __builtin_mul_overflow(numel, d, &numel);
  }
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(type->size), &need);
  const uint64_t payload = bytes.size() - header;
  TPU_CHECK(!overflow && need == payload, "read_idx: '{}': dims {} of {} need {} data bytes, the file has {} ({})", name,
            shape.str(), type->name, overflow ? std::string("more than 2^64") : std::to_string(need), payload,
            overflow || need > payload ? "truncated, or dims that do not match the data" : "trailing bytes");
  Tensor t = empty(shape, TensorOptions(type->dtype));
  if (numel == 0) return t;
  const uint8_t* src = bytes.data() + header;
  const auto n = static_cast<size_t>(numel);
  switch (type->code) {
    case 0x08:
    case 0x09: std::memcpy(t.raw_data(), src, n); break;
    case 0x0B: {
      auto* d = t.data<int32_t>();
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<int16_t>(load_be(src + 2 * i, 2));
      break;
    }
    case 0x0C: {
      auto* d = t.data<int32_t>();
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(static_cast<uint32_t>(load_be(src + 4 * i, 4)));
      break;
    }
    case 0x0D: {
      auto* d = t.data<float>();
      for (size_t i = 0; i < n; ++i) {
        const auto u = static_cast<uint32_t>(load_be(src + 4 * i, 4));
        std::memcpy(&d[i], &u, 4);
      }
      break;
    }
    case 0x0E: {
      auto* d = t.data<float>();
      for (size_t i = 0; i < n; ++i) {
        const uint64_t u = load_be(src + 8 * i, 8);
        double v;
        std::memcpy(&v, &u, 8);
        d[i] = static_cast<float>(v);
      }
      break;
    }
  }
  return t;
}

Tensor read_idx(const std::string& path) { return parse_idx(read_file(path, "read_idx"), path); }

std::string fashion_mnist_dir(const std::string& dir) {
  if (!dir.empty()) return dir;
  if (const char* e = std::getenv("TPU_FASHION_MNIST_DIR"); e && *e) return e;
  return kDefaultFashionMnistDir;
}

namespace {

// The path of `stem` in dir, plain or .gz; empty if neither exists.
std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {"", ".gz"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / (stem + ext);
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  return {};
}

const char* prefix_of(Split s) { return s == Split::train ? "train" : "t10k"; }

}  // namespace

bool fashion_mnist_available(const std::string& dir) {
  const std::string d = fashion_mnist_dir(dir);
  for (Split s : {Split::train, Split::test})
    for (const char* kind : {"images-idx3-ubyte", "labels-idx1-ubyte"})
      if (find_idx(d, fmt::format("{}-{}", prefix_of(s), kind)).empty()) return false;
  return true;
}

TensorDataset load_fashion_mnist(Split split, const std::string& dir) {
  const std::string d = fashion_mnist_dir(dir);
  const std::string img_stem = fmt::format("{}-images-idx3-ubyte", prefix_of(split));
  const std::string lbl_stem = fmt::format("{}-labels-idx1-ubyte", prefix_of(split));
  const std::string img = find_idx(d, img_stem), lbl = find_idx(d, lbl_stem);
  const char* where = dir.empty() && !std::getenv("TPU_FASHION_MNIST_DIR")
                          ? "the default directory"
                          : (dir.empty() ? "$TPU_FASHION_MNIST_DIR" : "the given directory");
  TPU_CHECK(!img.empty() && !lbl.empty(),
            "load_fashion_mnist: {} (or .gz) not found in {} '{}'; install Debian's dataset with `sudo apt-get install "
            "dataset-fashion-mnist`, or point TPU_FASHION_MNIST_DIR (or the dir argument) at a folder holding the IDX "
            "files",
            img.empty() ? img_stem : lbl_stem, where, d);
  Tensor images = read_idx(img), labels = read_idx(lbl);
  TPU_CHECK(images.dtype() == DType::u8 && images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28,
            "load_fashion_mnist: '{}' holds {} {}, expected u8 [N, 28, 28]", img, dtype_name(images.dtype()),
            images.shape().str());
  TPU_CHECK(labels.dtype() == DType::u8 && labels.dim() == 1 && labels.size(0) == images.size(0),
            "load_fashion_mnist: '{}' holds {} {}, expected u8 [{}] (one label per image)", lbl,
            dtype_name(labels.dtype()), labels.shape().str(), images.size(0));
  const auto* l = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    TPU_CHECK(l[i] < 10, "load_fashion_mnist: '{}': label {} of sample {} is not a class 0-9", lbl, l[i], i);
  return TensorDataset{images, labels.to(DType::i32)};
}

}  // namespace tpu::data
