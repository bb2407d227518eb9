// IDX reading (every element type, gzip through a stored-block encoder written here),
// malformed IDX files, Fashion-MNIST discovery (fake files always; the real package when
// installed), and the DataLoader's batching and shuffling.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "core/testing.h"
#include "tpucore/data.h"
#include "tpucore/ops.h"

using namespace tpu;
using namespace tpu::data;
using tpu::testing::expect_error;

namespace {

using Bytes = std::vector<uint8_t>;

void put_be(Bytes& b, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
Bytes idx_header(uint8_t type, const std::vector<uint32_t>& dims) {
  Bytes b{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be(b, d, 4);
  return b;
}

// gzip with one stored (uncompressed) deflate block per 65535 bytes, and its own CRC-32.
uint32_t crc32_of(const Bytes& b) {
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t x : b) {
    c ^= x;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}
Bytes gzip_stored(const Bytes& data) {
  Bytes out{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, data.size() - pos);
    out.push_back(pos + n == data.size() ? 1 : 0);
    out.push_back(static_cast<uint8_t>(n));
    out.push_back(static_cast<uint8_t>(n >> 8));
    out.push_back(static_cast<uint8_t>(~n));
    out.push_back(static_cast<uint8_t>(~n >> 8));
    out.insert(out.end(), data.begin() + static_cast<long>(pos), data.begin() + static_cast<long>(pos + n));
    pos += n;
  } while (pos < data.size());
  const uint32_t crc = crc32_of(data), size = static_cast<uint32_t>(data.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(crc >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(size >> (8 * i)));
  return out;
}

std::filesystem::path temp_dir() {
  static int counter = 0;
  auto p = std::filesystem::temp_directory_path() / fmt::format("tpucore_data_{}_{}", static_cast<long>(::getpid()), counter++);
  std::filesystem::create_directories(p);
  return p;
}
void write_file(const std::filesystem::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Fake Fashion-MNIST files of n samples: pixel (i, r, c) = (i + r + c) % 256, label i % 10.
void write_fake_fashion_mnist(const std::filesystem::path& dir, const char* prefix, uint32_t n, bool gz) {
  Bytes img = idx_header(0x08, {n, 28, 28}), lbl = idx_header(0x08, {n});
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t r = 0; r < 28; ++r)
      for (uint32_t c = 0; c < 28; ++c) img.push_back(static_cast<uint8_t>((i + r + c) % 256));
    lbl.push_back(static_cast<uint8_t>(i % 10));
  }
  const std::string ext = gz ? ".gz" : "";
  write_file(dir / (std::string(prefix) + "-images-idx3-ubyte" + ext), gz ? gzip_stored(img) : img);
  write_file(dir / (std::string(prefix) + "-labels-idx1-ubyte" + ext), gz ? gzip_stored(lbl) : lbl);
}

struct EnvVar {  // sets (or unsets) a variable for one scope
  std::string name;
  std::optional<std::string> old;
  EnvVar(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (v) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~EnvVar() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

TEST_CASE("idx: every element type, big-endian, plain and gzip", "[data]") {
  const auto dir = temp_dir();
  Bytes u8 = idx_header(0x08, {2, 3});
  for (int i = 0; i < 6; ++i) u8.push_back(static_cast<uint8_t>(250 + i));
  Bytes i8 = idx_header(0x09, {3});
  for (int v : {-128, -1, 127}) i8.push_back(static_cast<uint8_t>(static_cast<int8_t>(v)));
  Bytes i16 = idx_header(0x0B, {3});
  for (int v : {-300, 0, 32767}) put_be(i16, static_cast<uint16_t>(static_cast<int16_t>(v)), 2);
  Bytes i32 = idx_header(0x0C, {2, 1});
  for (int64_t v : {-70000LL, 2147483647LL}) put_be(i32, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
  Bytes f32 = idx_header(0x0D, {2});
  for (float v : {1.5f, -0.25f}) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    put_be(f32, u, 4);
  }
  Bytes f64 = idx_header(0x0E, {2});
  for (double v : {3.0, -1e-3}) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    put_be(f64, u, 8);
  }
  Bytes scalar = idx_header(0x08, {});
  scalar.push_back(42);
  Bytes empty = idx_header(0x0D, {0, 5});

  auto check_all = [&](bool gz) {
    auto rd = [&](const char* name, const Bytes& b) {
      const auto p = dir / (std::string(name) + (gz ? ".gz" : ""));
      write_file(p, gz ? gzip_stored(b) : b);
      return read_idx(p.string());
    };
    Tensor a = rd("u8", u8);
    CHECK(a.dtype() == DType::u8);
    CHECK(a.shape() == Shape{2, 3});
    CHECK(a.to_vector<uint8_t>() == std::vector<uint8_t>{250, 251, 252, 253, 254, 255});
    Tensor b = rd("i8", i8);
    CHECK(b.dtype() == DType::i8);
    CHECK(b.to_vector<int8_t>() == std::vector<int8_t>{-128, -1, 127});
    Tensor c = rd("i16", i16);
    CHECK(c.dtype() == DType::i32);
    CHECK(c.to_vector<int32_t>() == std::vector<int32_t>{-300, 0, 32767});
    Tensor d = rd("i32", i32);
    CHECK(d.shape() == Shape{2, 1});
    CHECK(d.to_vector<int32_t>() == std::vector<int32_t>{-70000, 2147483647});
    CHECK(rd("f32", f32).to_vector<float>() == std::vector<float>{1.5f, -0.25f});
    Tensor f = rd("f64", f64);
    CHECK(f.dtype() == DType::f32);
    CHECK(f.to_vector<float>() == std::vector<float>{3.0f, static_cast<float>(-1e-3)});
    Tensor s = rd("scalar", scalar);
    CHECK(s.dim() == 0);
    CHECK(s.item<int>() == 42);
    CHECK(rd("empty", empty).shape() == Shape{0, 5});
  };
  check_all(false);
  check_all(true);

  // A gzip stream larger than one stored block, and two concatenated gzip members.
  Bytes big = idx_header(0x08, {300, 400});
  for (int i = 0; i < 300 * 400; ++i) big.push_back(static_cast<uint8_t>(i * 7));
  Tensor t = parse_idx(gzip_stored(big), "big.gz");
  REQUIRE(t.shape() == Shape{300, 400});
  CHECK(t.to_vector<uint8_t>()[12345] == static_cast<uint8_t>(12345 * 7));
  Bytes part1(big.begin(), big.begin() + 1000), part2(big.begin() + 1000, big.end());
  Bytes two = gzip_stored(part1), m2 = gzip_stored(part2);
  two.insert(two.end(), m2.begin(), m2.end());
  CHECK(equal(parse_idx(two, "two.gz"), t));
  std::filesystem::remove_all(dir);
}

TEST_CASE("idx: malformed files are tpu::Errors naming the file", "[data]") {
  Bytes ok = idx_header(0x08, {2, 2});
  for (int i = 0; i < 4; ++i) ok.push_back(static_cast<uint8_t>(i));
  CHECK(parse_idx(ok, "ok").shape() == Shape{2, 2});

  expect_error([&] { parse_idx(Bytes{0, 0}, "x.idx"); }, {"read_idx", "x.idx", "truncated file: 2 bytes"});
  Bytes bad = ok;
  bad[0] = 1;
  expect_error([&] { parse_idx(bad, "x.idx"); }, {"x.idx", "bad magic 01 00 08 02"});
  bad = ok;
  bad[2] = 0x0A;
  expect_error([&] { parse_idx(bad, "x.idx"); }, {"unknown IDX type byte 0x0a"});
  bad = ok;
  bad[3] = 9;
  expect_error([&] { parse_idx(bad, "x.idx"); }, {"9 dimensions"});
  expect_error([&] { parse_idx(Bytes(ok.begin(), ok.begin() + 9), "x.idx"); }, {"truncated file: 9 bytes", "needs 12"});
  expect_error([&] { parse_idx(Bytes(ok.begin(), ok.end() - 1), "x.idx"); },
               {"dims [2, 2] of u8 need 4 data bytes, the file has 3", "truncated"});
  bad = ok;
  bad.push_back(0);
  expect_error([&] { parse_idx(bad, "x.idx"); }, {"the file has 5", "trailing bytes"});
  bad = idx_header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF});
  expect_error([&] { parse_idx(bad, "x.idx"); }, {"more than 2^64"});
  // gzip: truncated, corrupt checksum, garbage after the magic.
  const Bytes gz = gzip_stored(ok);
  expect_error([&] { parse_idx(Bytes(gz.begin(), gz.end() - 6), "x.gz"); }, {"gunzip", "x.gz", "truncated gzip stream"});
  Bytes badcrc = gz;
  badcrc[badcrc.size() - 6] ^= 0xFF;
  expect_error([&] { parse_idx(badcrc, "x.gz"); }, {"x.gz", "corrupt gzip stream"});
  expect_error([&] { parse_idx(Bytes{0x1f, 0x8b, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "x.gz"); }, {"x.gz", "corrupt gzip stream"});
  expect_error([&] { read_idx("/nonexistent/file-idx1-ubyte"); }, {"read_idx", "cannot open", "/nonexistent/file-idx1-ubyte"});
}

TEST_CASE("fashion-mnist: discovery by argument and environment, fake files", "[data]") {
  const auto dir = temp_dir();
  {
    EnvVar env("TPU_FASHION_MNIST_DIR", dir.string().c_str());
    CHECK(fashion_mnist_dir() == dir.string());
    CHECK_FALSE(fashion_mnist_available());
    expect_error([&] { load_fashion_mnist(Split::train); },
                 {"load_fashion_mnist", "train-images-idx3-ubyte", "$TPU_FASHION_MNIST_DIR", dir.string(),
                  "apt-get install dataset-fashion-mnist"});
    write_fake_fashion_mnist(dir, "train", 12, true);
    write_fake_fashion_mnist(dir, "t10k", 5, false);
    CHECK(fashion_mnist_available());
    TensorDataset tr = load_fashion_mnist(Split::train);
    CHECK(tr.inputs.dtype() == DType::u8);
    CHECK(tr.inputs.shape() == Shape{12, 28, 28});
    CHECK(tr.targets.dtype() == DType::i32);
    CHECK(tr.targets.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
    CHECK(tr.inputs.select(0, 3).select(0, 2).select(0, 5).item<int>() == 10);
    CHECK(load_fashion_mnist(Split::test).size() == 5);
  }
  const auto other = temp_dir();
  expect_error([&] { load_fashion_mnist(Split::test, other.string()); }, {"the given directory", other.string()});
  // A label outside 0-9, and images of the wrong shape.
  write_fake_fashion_mnist(other, "t10k", 3, false);
  Bytes lbl = idx_header(0x08, {3});
  lbl.insert(lbl.end(), {1, 10, 2});
  write_file(other / "t10k-labels-idx1-ubyte", lbl);
  expect_error([&] { load_fashion_mnist(Split::test, other.string()); }, {"label 10 of sample 1"});
  Bytes img = idx_header(0x08, {1, 2, 2});
  img.insert(img.end(), {0, 0, 0, 0});
  write_file(other / "t10k-images-idx3-ubyte", img);
  expect_error([&] { load_fashion_mnist(Split::test, other.string()); }, {"expected u8 [N, 28, 28]"});
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

TEST_CASE("fashion-mnist: the real dataset when the Debian package is installed", "[data][dataset]") {
  if (!fashion_mnist_available()) {
    WARN("dataset-fashion-mnist not installed (" << fashion_mnist_dir() << "); skipped");
    return;
  }
  TensorDataset test = load_fashion_mnist(Split::test);
  REQUIRE(test.inputs.shape() == Shape{10000, 28, 28});
  REQUIRE(test.targets.shape() == Shape{10000});
  // Fashion-MNIST is balanced: 1000 test images per class.
  std::vector<int> counts(10, 0);
  for (int32_t l : test.targets.to_vector<int32_t>()) ++counts[static_cast<size_t>(l)];
  CHECK(counts == std::vector<int>(10, 1000));
  const double mean_pixel = mean(test.inputs.to(DType::f32)).item<double>();
  CHECK(mean_pixel > 60.0);  // about 73 for Fashion-MNIST
  CHECK(mean_pixel < 90.0);
  TensorDataset train = load_fashion_mnist(Split::train);
  CHECK(train.inputs.shape() == Shape{60000, 28, 28});
  CHECK(train.targets.shape() == Shape{60000});
}

TEST_CASE("DataLoader: batch counts, drop_last, the last partial batch", "[data]") {
  const Tensor x = arange(10 * 4).reshape({10, 4}).to(DType::u8), y = arange(10);
  DataLoader keep(x, y, {.batch_size = 3});
  DataLoader drop(x, y, {.batch_size = 3, .drop_last = true});
  CHECK(keep.size() == 4);
  CHECK(drop.size() == 3);
  CHECK(DataLoader(x, y, {.batch_size = 5, .drop_last = true}).size() == 2);
  CHECK(DataLoader(x, y, {.batch_size = 64}).size() == 1);
  CHECK(DataLoader(x, y, {.batch_size = 64, .drop_last = true}).size() == 0);

  std::vector<Shape> shapes;
  std::vector<int32_t> seen;
  for (const auto& [xb, yb] : keep) {
    shapes.push_back(xb.shape());
    CHECK(xb.is_contiguous());
    for (int32_t v : yb.to_vector<int32_t>()) seen.push_back(v);
    // Row i of the batch is sample yb[i].
    const auto xs = xb.to_vector<int32_t>();
    const auto ys = yb.to_vector<int32_t>();
    for (size_t i = 0; i < ys.size(); ++i) CHECK(xs[i * 4] == ys[i] * 4);
  }
  CHECK(shapes == std::vector<Shape>{{3, 4}, {3, 4}, {3, 4}, {1, 4}});
  CHECK(seen == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  int64_t n = 0;
  for (const auto& b : drop) {
    n += b.inputs.size(0);
    CHECK(b.inputs.size(0) == 3);
  }
  CHECK(n == 9);
  int count = 0;
  for (const auto& b : DataLoader(x, y, {.batch_size = 64, .drop_last = true})) (void)b, ++count;
  CHECK(count == 0);

  // Transforms and the device option.
  DataLoader t(x, y, {.batch_size = 4, .transform = to_float(0.5, true), .device = Device("sim:0")});
  auto it = t.begin();
  CHECK(it->inputs.dtype() == DType::f32);
  CHECK(it->inputs.device() == Device("sim:0"));
  CHECK(it->inputs.to_vector<float>()[5] == 2.5f);
  // Images [N, 28, 28] flatten to [B, 784].
  DataLoader img(zeros({5, 28, 28}, DType::u8), Tensor(), {.batch_size = 2, .transform = to_float(1.0 / 255, true)});
  CHECK((*img.begin()).inputs.shape() == Shape{2, 784});
  CHECK_FALSE((*img.begin()).targets.defined());

  expect_error([&] { DataLoader(x, arange(9), {}); }, {"DataLoader", "[10, 4]", "[9]", "same number of samples"});
  expect_error([&] { DataLoader(x, y, {.batch_size = 0}); }, {"batch_size must be at least 1, got 0"});
  expect_error([&] { DataLoader(scalar_tensor(1), Tensor(), {}); }, {"leading sample dim"});
  expect_error([&] { keep.batch(keep.order(0), 4); }, {"index 4 out of range for 4 batches"});
}

TEST_CASE("DataLoader: shuffling is a seeded permutation per epoch", "[data]") {
  const int64_t n = 1000;
  const Tensor x = arange(n).reshape({n, 1}), y = arange(n);
  auto epoch_order = [](DataLoader& l) {
    std::vector<int32_t> ids;
    for (const auto& [xb, yb] : l) {
      CHECK(equal(xb.reshape({-1}), yb));  // inputs and targets gathered with the same indices
      for (int32_t v : yb.to_vector<int32_t>()) ids.push_back(v);
    }
    return ids;
  };
  DataLoader a(x, y, {.batch_size = 128, .shuffle = true, .seed = 5});
  DataLoader b(x, y, {.batch_size = 128, .shuffle = true, .seed = 5});
  DataLoader c(x, y, {.batch_size = 128, .shuffle = true, .seed = 6});
  const auto a0 = epoch_order(a), a1 = epoch_order(a), b0 = epoch_order(b), b1 = epoch_order(b);
  const auto c0 = epoch_order(c);
  CHECK(a.epoch() == 2);
  // Every sample exactly once per epoch.
  for (const auto* o : {&a0, &a1, &c0}) {
    std::vector<int32_t> s = *o;
    std::sort(s.begin(), s.end());
    std::vector<int32_t> want(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = i;
    CHECK(s == want);
  }
  CHECK(a0 == b0);  // same seed, same order
  CHECK(a1 == b1);
  CHECK(a0 != a1);  // next epoch, another order
  CHECK(a0 != c0);  // another seed, another order
  // Epoch e is the permutation of seed + e: seed 5 epoch 1 == seed 6 epoch 0; set_epoch replays.
  CHECK(a1 == c0);
  a.set_epoch(0);
  CHECK(epoch_order(a) == a0);
  // Not simply shifted or reversed: most positions change.
  int fixed = 0;
  for (int64_t i = 0; i < n; ++i) fixed += a0[static_cast<size_t>(i)] == i;
  CHECK(fixed < 20);
  // Without shuffle the order is 0..N-1 every epoch.
  DataLoader plain(x, y, {.batch_size = 128});
  const auto p0 = epoch_order(plain), p1 = epoch_order(plain);
  CHECK(p0 == p1);
  CHECK(std::is_sorted(p0.begin(), p0.end()));
}
