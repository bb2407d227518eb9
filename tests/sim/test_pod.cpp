// sim::Pod collectives: values in the chips' HBM against naive per-element loops, for every
// collective, dtype and reduction on 2 and 4 chips (1-D and 2-D), odd and zero sizes; the
// asynchronous start/done clock model; the trace; timing-only pods of 256 chips; bad input.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sim/error.h"
#include "sim/pod.h"
#include "sim/presets.h"

using namespace tpu::sim;

namespace {

// Elements are kept as raw bytes; value(i) reads element i as a double for comparisons.
struct Buf {
  DType t;
  std::vector<uint8_t> b;
  double value(size_t i) const {
    switch (t) {
      case DType::f32: { float f; std::memcpy(&f, &b[i * 4], 4); return f; }
      case DType::bf16: { uint16_t u; std::memcpy(&u, &b[i * 2], 2); return bf16_bits_to_f32(u); }
      case DType::i32: { int32_t v; std::memcpy(&v, &b[i * 4], 4); return v; }
      case DType::i8: return static_cast<int8_t>(b[i]);
      case DType::f8e4m3: return e4m3_bits_to_f32(b[i]);
    }
    return 0;
  }
};

Buf random_buf(DType t, size_t n, std::mt19937& rng) {
  Buf r{t, std::vector<uint8_t>(n * size_t(dtype_size(t)))};
  std::uniform_real_distribution<float> f(-4, 4);
  std::uniform_int_distribution<int> i8(-128, 127), i32(-100000, 100000);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::f32) { float v = f(rng); std::memcpy(&r.b[i * 4], &v, 4); }
    if (t == DType::bf16) { uint16_t v = f32_to_bf16_bits(f(rng)); std::memcpy(&r.b[i * 2], &v, 2); }
    if (t == DType::i32) { int32_t v = i32(rng); std::memcpy(&r.b[i * 4], &v, 4); }
    if (t == DType::i8) r.b[i] = uint8_t(i8(rng));
  }
  return r;
}

// Naive reduction of element i over the ranks, as the dtype stores it (double for comparison).
double naive_reduce(const std::vector<Buf>& in, size_t i, ReduceOp op) {
  const DType t = in[0].t;
  if (t == DType::f32 || t == DType::bf16) {
    float acc = float(in[0].value(i));
    for (size_t r = 1; r < in.size(); ++r) {
      const float v = float(in[r].value(i));
      if (op == ReduceOp::sum || op == ReduceOp::avg) acc += v;
      if (op == ReduceOp::prod) acc *= v;
      if (op == ReduceOp::max) acc = std::max(acc, v);
      if (op == ReduceOp::min) acc = std::min(acc, v);
    }
    if (op == ReduceOp::avg) acc /= float(in.size());
    return t == DType::bf16 ? round_to_bf16(acc) : acc;
  }
  int64_t acc = int64_t(in[0].value(i));
  uint64_t wrap = uint64_t(acc);
  for (size_t r = 1; r < in.size(); ++r) {
    const int64_t v = int64_t(in[r].value(i));
    if (op == ReduceOp::sum) wrap += uint64_t(v);
    if (op == ReduceOp::prod) wrap *= uint64_t(v);
    if (op == ReduceOp::avg) acc += v;
    if (op == ReduceOp::max) acc = std::max(acc, v);
    if (op == ReduceOp::min) acc = std::min(acc, v);
  }
  if (op == ReduceOp::sum || op == ReduceOp::prod) acc = int64_t(wrap);
  if (op == ReduceOp::avg) acc /= int64_t(in.size());
  return t == DType::i32 ? double(int32_t(uint32_t(uint64_t(acc)))) : double(int8_t(uint8_t(uint64_t(acc))));
}

Buf read(Pod& pod, int chip, uint64_t addr, DType t, size_t n) {
  Buf r{t, std::vector<uint8_t>(n * size_t(dtype_size(t)))};
  pod.chip(chip).read_hbm(addr, r.b.data(), r.b.size());
  return r;
}

constexpr uint64_t kSrc = 4096, kDst = 1 << 20;

// A spec without designated initializers (-Wmissing-field-initializers).
CollectiveSpec mk(CollectiveKind k, DType t, uint64_t count, std::vector<uint64_t> src, std::vector<uint64_t> dst,
                  ReduceOp op = ReduceOp::sum) {
  CollectiveSpec s;
  s.kind = k;
  s.dtype = t;
  s.count = count;
  s.src = std::move(src);
  s.dst = std::move(dst);
  s.op = op;
  return s;
}
template <class F>
CollectiveSpec with(CollectiveSpec s, F f) {
  f(s);
  return s;
}

}  // namespace

TEST_CASE("pod: every collective, dtype and reduction against naive loops (2 and 4 chips)") {
  std::mt19937 rng(7);
  for (const char* shape : {"2", "4", "2x2"}) {
    for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i8}) {
      for (uint64_t count : {0, 1, 7, 36}) {
        Pod pod("tiny", shape);
        const int N = pod.size();
        std::vector<Buf> in;
        std::vector<uint64_t> src(size_t(N), kSrc), dst(size_t(N), kDst);
        for (int c = 0; c < N; ++c) {
          in.push_back(random_buf(t, count, rng));
          pod.chip(c).write_hbm(kSrc, in.back().b.data(), in.back().b.size());
        }
        INFO("slice " << shape << " dtype " << dtype_name(t) << " count " << count);
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::prod, ReduceOp::avg}) {
          pod.collective(mk(CollectiveKind::all_reduce, t, count, src, dst, op));
          INFO("all_reduce " << reduce_op_name(op));
          for (int c = 0; c < N; ++c) {
            Buf o = read(pod, c, kDst, t, count);
            for (size_t i = 0; i < count; ++i) CHECK(o.value(i) == naive_reduce(in, i, op));
          }
        }
        pod.collective(mk(CollectiveKind::all_gather, t, count, src, dst));
        for (int c = 0; c < N; ++c) {
          Buf o = read(pod, c, kDst, t, count * size_t(N));
          for (int r = 0; r < N; ++r)
            for (size_t i = 0; i < count; ++i) CHECK(o.value(size_t(r) * count + i) == in[size_t(r)].value(i));
        }
        const uint64_t cn = count - count % uint64_t(N);  // divisible count for scatter/all-to-all
        pod.collective(mk(CollectiveKind::reduce_scatter, t, cn, src, dst, ReduceOp::sum));
        for (int c = 0; c < N; ++c) {
          Buf o = read(pod, c, kDst, t, cn / size_t(N));
          for (size_t i = 0; i < cn / size_t(N); ++i)
            CHECK(o.value(i) == naive_reduce(in, size_t(c) * (cn / size_t(N)) + i, ReduceOp::sum));
        }
        pod.collective(mk(CollectiveKind::all_to_all, t, cn, src, dst));
        const size_t blk = cn / size_t(N);
        for (int j = 0; j < N; ++j) {
          Buf o = read(pod, j, kDst, t, cn);
          for (int r = 0; r < N; ++r)
            for (size_t i = 0; i < blk; ++i) CHECK(o.value(size_t(r) * blk + i) == in[size_t(r)].value(size_t(j) * blk + i));
        }
        pod.collective(with(mk(CollectiveKind::broadcast, t, count, src, dst), [&](CollectiveSpec& s) { s.root = N - 1; }));
        for (int c = 0; c < N; ++c) {
          Buf o = read(pod, c, kDst, t, count);
          for (size_t i = 0; i < count; ++i) CHECK(o.value(i) == in[size_t(N - 1)].value(i));
        }
        // Permute: a shift by one (rank r sends to r+1), rank 0 receives nothing and keeps dst.
        Buf keep = read(pod, 0, kDst, t, count);
        std::vector<std::pair<int, int>> pairs;
        for (int r = 0; r + 1 < N; ++r) pairs.push_back({r, r + 1});
        pod.collective(with(mk(CollectiveKind::permute, t, count, src, dst), [&](CollectiveSpec& s) { s.pairs = pairs; }));
        for (int c = 0; c < N; ++c) {
          Buf o = read(pod, c, kDst, t, count);
          for (size_t i = 0; i < count; ++i) CHECK(o.value(i) == (c == 0 ? keep.value(i) : in[size_t(c - 1)].value(i)));
        }
      }
    }
  }
}

TEST_CASE("pod: integer sums wrap, groups along one axis, explicit members") {
  Pod pod("tiny", "2x2");
  const std::vector<uint64_t> a(4, kSrc);
  for (int c = 0; c < 4; ++c) {
    const int32_t v[2] = {INT32_MAX, c};
    pod.chip(c).write_hbm(kSrc, v, 8);
  }
  // Along axis 1: groups {0,1} and {2,3}.
  pod.collective(with(mk(CollectiveKind::all_reduce, DType::i32, 2, a, a), [&](CollectiveSpec& s) { s.axes = {1}; }));
  int32_t o[2];
  pod.chip(2).read_hbm(kSrc, o, 8);
  CHECK(o[0] == -2);  // INT32_MAX + INT32_MAX wraps
  CHECK(o[1] == 2 + 3);
  // Members 3 and 0 (not an axis group): rank 0 is chip 3.
  pod.collective(with(mk(CollectiveKind::all_gather, DType::i32, 1, {kSrc + 4, kSrc + 4}, {kDst, kDst}), [&](CollectiveSpec& s) { s.members = {3, 0}; }));
  int32_t g[2];
  pod.chip(0).read_hbm(kDst, g, 8);
  CHECK(g[0] == 5);  // chip 3's second element after the axis-1 all-reduce (2 + 3)
  CHECK(g[1] == 1);  // chip 0's: 0 + 1
}

TEST_CASE("pod: asynchronous collectives overlap compute, clocks and trace") {
  Pod pod("v5e", "4");
  const std::vector<uint64_t> a(4, 0);
  const CollectiveSpec spec = mk(CollectiveKind::all_reduce, DType::f32, 1 << 20, a, a);
  const double cost = pod.cost(spec).cycles;
  REQUIRE(cost > 0);
  pod.advance(1, 1000);  // chip 1 is late: the collective starts at its clock
  const uint64_t h = pod.start(spec);
  pod.advance(0, cost / 2);  // computes meanwhile; not delayed by the collective
  CHECK(pod.clock(0) == Approx(cost / 2));
  const CollectiveResult r = pod.done(h);
  CHECK(r.start_cycle == 1000);
  CHECK(r.end_cycle == Approx(1000 + cost));
  for (int c = 0; c < 4; ++c) CHECK(pod.clock(c) == Approx(1000 + cost));
  CHECK(r.bytes == 4u << 20);
  CHECK(r.achieved_gbps == Approx(double(r.bytes) / r.seconds / 1e9));
  CHECK_THROWS_WITH(pod.done(h), Catch::Contains("unknown collective handle"));
  // Two collectives back to back queue on the ICI.
  const uint64_t h1 = pod.start(spec), h2 = pod.start(spec);
  pod.done(h1);
  const CollectiveResult r2 = pod.done(h2);
  CHECK(r2.start_cycle == Approx(1000 + 2 * cost));
  const std::string tr = pod.chrome_trace();
  CHECK(tr.find("\"ICI\"") != std::string::npos);
  CHECK(tr.find("achieved_GBps") != std::string::npos);
  CHECK(tr.find("\"bytes\":4194304") != std::string::npos);
}

TEST_CASE("pod: timing-only pods of 256 and 4480 chips cost quickly") {
  const auto t0 = std::chrono::steady_clock::now();
  Pod pod("v5e", "16x16", PodOptions{true, false});
  const std::vector<uint64_t> a(256, 0);
  const CollectiveResult r = pod.collective(mk(CollectiveKind::all_reduce, DType::bf16, uint64_t(128) << 20, a, a));
  const double W = pod.topology().ici.link_bidir_bytes_per_s();
  CHECK(r.seconds == Approx(2 * 256.0 * (1 << 20) / (2 * W)).epsilon(0.1));
  Pod big("v5p", "16x20x14", PodOptions{true, false});
  const std::vector<uint64_t> b(size_t(big.size()), 0);
  CHECK(big.collective(mk(CollectiveKind::all_gather, DType::f32, 1 << 10, b, b))
            .cycles > 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 5.0);
}

TEST_CASE("pod: bad input is a SimError naming what is wrong, the pod stays usable") {
  CHECK_THROWS_WITH(Pod("tiny", "3x3x3x3"), Catch::Contains("3-D torus"));
  CHECK_THROWS_WITH(Pod("tiny", "4x9"), Catch::Contains("axis 1 has length 9"));
  CHECK_THROWS_WITH(Pod("nochip", "4"), Catch::Contains("nochip"));
  Pod pod("tiny", "4");
  const std::vector<uint64_t> a(4, 0), three(3, 0);
  using K = CollectiveKind;
  CHECK_THROWS_WITH(pod.start(mk(K::all_reduce, DType::f32, 4, three, a)),
                    Catch::Contains("3 source and 4 destination addresses for 4 chips"));
  CHECK_THROWS_WITH(pod.start(mk(K::reduce_scatter, DType::f32, 6, a, a)),
                    Catch::Contains("count 6 is not a multiple of the group size 4"));
  CHECK_THROWS_WITH(pod.start(mk(K::all_to_all, DType::f32, 5, a, a)), Catch::Contains("count 5"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::broadcast, DType::f32, 4, a, a), [&](CollectiveSpec& s) { s.root = 4; })),
                    Catch::Contains("root rank 4"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::permute, DType::f32, 4, a, a), [&](CollectiveSpec& s) { s.pairs = {{0, 1}, {2, 1}}; })),
                    Catch::Contains("rank 1 is the target of two pairs"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::permute, DType::f32, 4, a, a), [&](CollectiveSpec& s) { s.pairs = {{0, 7}}; })),
                    Catch::Contains("pair (0, 7)"));
  const std::vector<uint64_t> far(4, pod.chip(0).hbm_size() - 8);
  CHECK_THROWS_WITH(pod.start(mk(K::all_gather, DType::f32, 4, a, far)),
                    Catch::Contains("chip 0 (rank 0): destination") && Catch::Contains("outside"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::all_reduce, DType::f32, 4, a, a), [&](CollectiveSpec& s) { s.axes = {1}; })),
                    Catch::Contains("axis 1"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::all_reduce, DType::f32, 1, {0, 0}, {0, 0}), [&](CollectiveSpec& s) { s.members = {1, 1}; })),
                    Catch::Contains("chip 1 appears twice"));
  CHECK_THROWS_WITH(pod.start(with(mk(K::all_reduce, DType::f32, 1, {0}, {0}), [&](CollectiveSpec& s) { s.members = {9}; })),
                    Catch::Contains("chip 9 is not in the 4-chip pod"));
  CHECK_THROWS_WITH(pod.chip(4), Catch::Contains("chip 4"));
  // Still usable.
  const float one = 1.0f;
  for (int c = 0; c < 4; ++c) pod.chip(c).write_hbm(0, &one, 4);
  pod.collective(mk(K::all_reduce, DType::f32, 1, a, a));
  float got = 0;
  pod.chip(3).read_hbm(0, &got, 4);
  CHECK(got == 4.0f);
}

TEST_CASE("pod: f16, u8 and bool elements (ElemType) reduce and move") {
  auto red = [](ElemType e, ReduceOp op, std::vector<std::vector<uint16_t>> in) {
    std::vector<const void*> p;
    for (auto& v : in) p.push_back(v.data());
    std::vector<uint16_t> out(in[0].size());
    reduce_buffers(DType::f32, op, p, out.data(), in[0].size(), e);
    return out;
  };
  // f16 bit patterns: 1.0 0x3C00, 0.5 0x3800, 1.5 0x3E00, 65504 0x7BFF, inf 0x7C00, 2^-24 0x0001,
  // -1.5 0xBE00, 3.0 0x4200, 0.75 0x3A00.
  CHECK(red(ElemType::f16, ReduceOp::sum, {{0x3C00, 0x7BFF, 0x0001, 0xBE00}, {0x3800, 0x7BFF, 0x0001, 0xBE00}}) ==
        std::vector<uint16_t>{0x3E00, 0x7C00, 0x0002, 0xC200});
  CHECK(red(ElemType::f16, ReduceOp::max, {{0x3C00, 0xBE00}, {0x3800, 0x3C00}}) == std::vector<uint16_t>{0x3C00, 0x3C00});
  CHECK(red(ElemType::f16, ReduceOp::avg, {{0x3C00}, {0x3800}}) == std::vector<uint16_t>{0x3A00});
  // One rank: every non-NaN half survives the f16 -> f32 -> f16 round trip bit for bit.
  std::vector<uint16_t> all;
  for (uint32_t h = 0; h < 65536; ++h)
    if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) all.push_back(uint16_t(h));
  CHECK(red(ElemType::f16, ReduceOp::sum, {all}) == all);
  // u8 wraps, bool is or / and (one byte per element: pack two per uint16 lane).
  std::vector<uint8_t> a = {200, 1, 0, 7}, b = {100, 1, 1, 0}, o(4);
  reduce_buffers(DType::f32, ReduceOp::sum, {a.data(), b.data()}, o.data(), 4, ElemType::u8);
  CHECK(o == std::vector<uint8_t>{44, 2, 1, 7});
  reduce_buffers(DType::f32, ReduceOp::sum, {a.data(), b.data()}, o.data(), 4, ElemType::boolean);
  CHECK(o == std::vector<uint8_t>{1, 1, 1, 1});
  reduce_buffers(DType::f32, ReduceOp::min, {a.data(), b.data()}, o.data(), 4, ElemType::boolean);
  CHECK(o == std::vector<uint8_t>{1, 1, 0, 0});
  // Through a pod: an f16 all-gather moves 2-byte elements, an f16 all-reduce adds them.
  Pod pod("tiny", "2");
  for (int c = 0; c < 2; ++c) {
    const uint16_t v[3] = {0x3C00, 0x3800, uint16_t(c ? 0x4200 : 0x3C00)};
    pod.chip(c).write_hbm(0, v, 6);
  }
  CollectiveSpec s = mk(CollectiveKind::all_reduce, DType::f32, 3, {0, 0}, {64, 64});
  s.elem = ElemType::f16;
  CHECK(pod.collective(s).bytes == 6);
  uint16_t got[3];
  pod.chip(1).read_hbm(64, got, 6);
  CHECK(got[0] == 0x4000);  // 2.0
  CHECK(got[1] == 0x3C00);  // 1.0
  CHECK(got[2] == 0x4400);  // 4.0
}

TEST_CASE("pod: over chips owned elsewhere, some absent") {
  Chip a(preset_config("tiny")), b(preset_config("tiny"));
  Pod pod(std::vector<Chip*>{&a, nullptr, &b, nullptr}, ici_preset("tiny"), {4});
  const float x = 2.0f, y = 5.0f;
  a.write_hbm(0, &x, 4);
  b.write_hbm(0, &y, 4);
  CollectiveSpec s = mk(CollectiveKind::all_reduce, DType::f32, 1, {0, 0}, {8, 8});
  s.members = {0, 2};
  pod.collective(s);
  float got = 0;
  b.read_hbm(8, &got, 4);
  CHECK(got == 7.0f);
  s.members = {0, 1};
  CHECK_THROWS_WITH(pod.collective(s), Catch::Contains("chip 1 was not given to this pod"));
  CHECK_THROWS_WITH(Pod(std::vector<Chip*>{nullptr, nullptr}, ici_preset("tiny"), {2}), Catch::Contains("no chips"));
  CHECK_THROWS_WITH(Pod(std::vector<Chip*>{&a, &b}, ici_preset("tiny"), {4}), Catch::Contains("2 chips given"));
}
