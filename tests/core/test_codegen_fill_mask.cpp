// Chip lowerings of full, triu/tril, masked_fill, cat and logsumexp (codegen/eager_fill_mask.cpp,
// eager_cat.cpp, the logsumexp row op): each runs as chip programs on the tiny chip (no host
// fallback) and matches a naive loop over the host copy of the inputs; shapes large enough to
// take several VMEM tiles; bad input is still a tpu::Error.
#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "codegen_testing.h"
#include "sim/presets.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"

namespace tpu::testing {
namespace {


// bf16 rounding of a double (round to nearest even), for expected bf16 values.
double to_bf16(double v) { return ref_of(scalar_tensor(v, TensorOptions(DType::bf16))).v[0]; }

}  // namespace

TEST_CASE("codegen: full fills f32, bf16 and bool outputs on the chip", "[codegen][fill_mask]") {
  TinySim tiny;
  struct Case {
    Shape s;
    DType dt;
    double v, want;
  };
  // 300 x 257 f32 is 300 KiB: more than the tiny chip's VMEM, so several tiles and a ragged tail.
  for (const Case& c : {Case{{3, 5}, DType::f32, 2.5, 2.5}, Case{{300, 257}, DType::f32, -1.25, -1.25},
                        Case{{17, 33}, DType::bf16, 0.1, to_bf16(0.1)}, Case{{64, 99}, DType::boolean, 1, 1},
                        Case{{7}, DType::f32, -INFINITY, -INFINITY}}) {
    ChipRunProbe probe;
    Tensor t = full(c.s, c.v, TensorOptions(c.dt, tiny.dev()));
    CHECK(probe.new_fallbacks() == 0);
    CHECK(probe.new_runs() == 1);
    const Ref r = ref_of(t);
    int64_t bad = 0;
    for (double x : r.v) bad += x != c.want;
    INFO(dtype_name(c.dt) << " " << c.s.str());
    CHECK(bad == 0);
  }
}

TEST_CASE("codegen: triu and tril match a naive loop for every diagonal", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(21);
  for (DType dt : {DType::f32, DType::bf16, DType::boolean}) {
    const Shape s{2, 5, 7};
    Tensor x = dt == DType::boolean ? gt(rnd(g, s), 0.0) : rnd(g, s, dt);
    const Ref xr = ref_of(x);
    Tensor xd = x.to(tiny.dev());
    for (int64_t diag : {-9, -2, 0, 1, 3, 8}) {
      for (bool lower : {false, true}) {
        ChipRunProbe probe;
        Tensor got = lower ? tril(xd, diag) : triu(xd, diag);
        CHECK(probe.new_fallbacks() == 0);
        Ref want(s);
        for (int64_t p = 0; p < 2; ++p)
          for (int64_t i = 0; i < 5; ++i)
            for (int64_t j = 0; j < 7; ++j) {
              const bool keep = lower ? j - i <= diag : j - i >= diag;
              want.at({p, i, j}) = keep ? xr.at({p, i, j}) : 0.0;
            }
        check_close(got, want, {0, 0}, fmt::format("{} {} diagonal {}", dtype_name(dt), lower ? "tril" : "triu", diag));
      }
    }
  }
  // A transposed view (gathered first) and a causal mask the size of several tiles.
  Tensor big = rnd(g, {40, 300});
  Tensor got = triu(big.to(tiny.dev()).t(), 1);
  const Ref br = ref_of(big);
  Ref want(Shape{300, 40});
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 40; ++j) want.at({i, j}) = j - i >= 1 ? br.at({j, i}) : 0.0;
  check_close(got, want, {0, 0}, "triu of a transposed view");
  expect_error([&] { (void)triu(full({4}, 1.0, TensorOptions(DType::f32, tiny.dev())), 0); }, {"triu", "at least 2 dims"});
}

TEST_CASE("codegen: masked_fill with a broadcast mask, eager and fused", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(22);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (double value : {double(-INFINITY), 2.5, 0.3}) {
      Tensor x = rnd(g, {2, 3, 4, 6}, dt), m = gt(rnd(g, {4, 6}), 0.2);
      const Ref xr = ref_of(x), mr = ref_of(m);
      ChipRunProbe probe;
      Tensor got = masked_fill(x.to(tiny.dev()), m.to(tiny.dev()), value);
      CHECK(probe.new_fallbacks() == 0);
      const double v = dt == DType::bf16 ? to_bf16(value) : double(float(value));
      const Ref want = ref_map({xr, mr}, [&](const std::vector<double>& a) { return a[1] != 0 ? v : a[0]; });
      check_close(got, want, {0, 0}, fmt::format("{} value {}", dtype_name(dt), value));
    }
  }
  // Causal scores as the attention backward builds them, inside a compiled function: the
  // matmul, scale and masked_fill of a bool triu mask made on the chip.
  Tensor q = rnd(g, {2, 16, 8}), k = rnd(g, {2, 16, 8});
  auto f = compile([](const Tensor& a, const Tensor& b) {
    const Tensor fut = triu(ones({16, 16}, TensorOptions(DType::boolean, a.device())), 1);
    return masked_fill(mul(matmul(a, transpose(b, -1, -2)), 0.5), fut, -INFINITY);
  });
  ChipRunProbe probe;
  Tensor got = f(q.to(tiny.dev()), k.to(tiny.dev()));
  CHECK(probe.new_fallbacks() == 0);
  const Ref qr = ref_of(q), kr = ref_of(k);
  Ref want(Shape{2, 16, 16});
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t j = 0; j < 16; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < 8; ++c) acc += qr.at({n, i, c}) * kr.at({n, j, c});
        want.at({n, i, j}) = j > i ? -INFINITY : 0.5 * acc;
      }
  check_close(got, want, {1e-4, 1e-4}, "compiled causal scores");
  expect_error([&] { (void)masked_fill(q.to(tiny.dev()), rnd(g, {2, 16, 8}).to(tiny.dev()), 0.0); },
               {"masked_fill", "bool"});
}

TEST_CASE("codegen: cat along any dim, views included", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(23);
  for (DType dt : {DType::f32, DType::bf16, DType::boolean}) {
    auto mk = [&](const Shape& s) { return dt == DType::boolean ? gt(rnd(g, s), 0.0) : rnd(g, s, dt); };
    for (int dim : {0, 1, 2, -1}) {
      const int d = dim < 0 ? dim + 3 : dim;
      Shape s0{3, 4, 10}, s1{3, 4, 10};
      s1[d] = 2;
      Tensor a = mk(s0), b = mk(s1);
      // Input 0 a sliced view (rows not dense unless the dim is 0), input 2 a transposed one.
      Tensor av = a.to(tiny.dev()).narrow(2, 1, 8);
      Shape s2 = av.shape();
      s2[d] = 3;
      Tensor c = mk(Shape{s2[0], s2[2], s2[1]});  // made transposed
      Shape bs = av.shape();
      bs[d] = 2;
      Tensor bv = b.to(tiny.dev()).narrow(2, 0, bs[2]);
      ChipRunProbe probe;
      Tensor got = cat({av, bv, c.to(tiny.dev()).transpose(1, 2)}, dim);
      CHECK(probe.new_fallbacks() == 0);
      const Ref ar = ref_of(a), br = ref_of(b), cref = ref_of(c);
      const Shape os = got.shape();
      Ref want(os);
      for (int64_t i = 0; i < want.numel(); ++i) {
        std::vector<int64_t> idx = unflatten(os, i);
        const int64_t p = idx[size_t(d)], la = av.shape()[d], lb = bv.shape()[d];
        std::vector<int64_t> j = idx;
        if (p < la) {
          j[2] += 1;  // a's narrow offset
          want.v[size_t(i)] = ar.at(j);
        } else if (p < la + lb) {
          j[size_t(d)] = p - la;
          want.v[size_t(i)] = br.at(j);
        } else {
          j[size_t(d)] = p - la - lb;
          want.v[size_t(i)] = cref.at({j[0], j[2], j[1]});
        }
      }
      check_close(got, want, {0, 0}, fmt::format("{} cat dim {}", dtype_name(dt), dim));
    }
  }
  expect_error([&] { (void)cat({full({2, 3}, 1.0, TensorOptions(DType::f32, tiny.dev())),
                                full({3, 3}, 1.0, TensorOptions(DType::f32, tiny.dev()))}, 1); },
               {"cat"});
}

TEST_CASE("codegen: logsumexp over rows, long rows and infinities", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(24);
  // 9 x 70 fits one tile; 3 x 30000 (120 KB f32 rows) needs the two-stage reduction on the
  // tiny chip's 256 KiB of VMEM.
  for (const Shape& s : {Shape{9, 70}, Shape{3, 30000}}) {
    Tensor x = rnd(g, s) * 20.0;
    const int64_t R = s[0], C = s[1];
    std::vector<float> host = x.to_vector<float>();
    host[size_t(C + 3)] = INFINITY;  // row 1 has +inf
    for (int64_t j = 0; j < C; ++j) host[size_t(2 * C + j)] = -INFINITY;  // row 2 is all -inf
    x = from_vector(host, s);
    ChipRunProbe probe;
    Tensor got = logsumexp(x.to(tiny.dev()), {-1});
    CHECK(probe.new_fallbacks() == 0);
    Ref want(Shape{R});
    for (int64_t r = 0; r < R; ++r) {
      double m = -INFINITY;
      for (int64_t j = 0; j < C; ++j) m = std::max(m, double(host[size_t(r * C + j)]));
      if (std::isinf(m)) {
        want.v[size_t(r)] = m;
        continue;
      }
      double acc = 0;
      for (int64_t j = 0; j < C; ++j) acc += std::exp(double(host[size_t(r * C + j)]) - m);
      want.v[size_t(r)] = m + std::log(acc);
    }
    check_close(got, want, {1e-4, 1e-5}, fmt::format("logsumexp of {}", s.str()));
  }
  // Over a leading dim (permuted first), bf16.
  Tensor y = rnd(g, {6, 5}, DType::bf16);
  const Ref yr = ref_of(y);
  Tensor got = logsumexp(y.to(tiny.dev()), {0}, true);
  Ref want(Shape{1, 5});
  for (int64_t c = 0; c < 5; ++c) {
    double acc = 0;
    for (int64_t r = 0; r < 6; ++r) acc += std::exp(yr.at({r, c}));
    want.v[size_t(c)] = std::log(acc);
  }
  check_close(got, want, default_tol(DType::bf16), "bf16 logsumexp over dim 0");
}

TEST_CASE("codegen: a causal attention backward runs without host fallbacks", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(25);
  // GQA: 4 query heads on 2 KV heads, rotary on q and k (its backward uses cat).
  Tensor q = rnd(g, {1, 4, 12, 8}), k = rnd(g, {1, 2, 12, 8}), v = rnd(g, {1, 2, 12, 8});
  Tensor cs = rnd(g, {12, 8}), sn = rnd(g, {12, 8}), go = rnd(g, {1, 4, 12, 8});
  auto grads = [&](Device dev) {
    std::vector<Tensor> in;
    for (const Tensor& t : {q, k, v}) in.push_back(t.to(dev).requires_grad_(true));
    Tensor qr = rotary_embedding(in[0], cs.to(dev), sn.to(dev)), kr = rotary_embedding(in[1], cs.to(dev), sn.to(dev));
    Tensor o = scaled_dot_product_attention(qr, kr, in[2], {}, true);
    return autograd::grad({o}, in, {go.to(dev)});
  };
  const std::vector<Tensor> want = grads(Device());
  ChipRunProbe probe;
  const std::vector<Tensor> got = grads(tiny.dev());
  CHECK(probe.new_fallbacks() == 0);
  for (size_t i = 0; i < 3; ++i) check_close(got[i], ref_of(want[i]), {1e-4, 1e-4}, fmt::format("gradient {}", i));
}

TEST_CASE("codegen: strided copies, cat and attention split over two TensorCores keep their values", "[codegen][fill_mask]") {
  // The tiny chip as one device of two cores: copies long enough split their outer dim.
  auto j = nlohmann::json::parse(sim::preset_json("tiny"));
  j["name"] = "tiny2";
  j["cores_per_chip"] = 2;
  j["timing"]["megacore"] = 2;
  const std::string prev = device::sim_chip(1);
  set_sim_chip(j.dump(), 1);
  struct Restore {
    std::string chip;
    ~Restore() {
      try {
        set_sim_chip(chip, 1);
      } catch (...) {
      }
    }
  } restore{prev};
  Generator g(26);
  for (const Shape& s : {Shape{300, 211}, Shape{5, 64, 97}, Shape{3, 1}}) {
    Tensor x = rnd(g, s);
    const Ref xr = ref_of(x);
    Tensor xd = x.to(Device("sim:1"));
    ChipRunProbe probe;
    Tensor got = (s.ndim() == 2 ? xd.t() : xd.transpose(0, 2)).contiguous();  // an element-strided gather
    CHECK(probe.new_fallbacks() == 0);
    Ref want(got.shape());
    for (int64_t i = 0; i < want.numel(); ++i) {
      std::vector<int64_t> idx = unflatten(got.shape(), i);
      std::reverse(idx.begin(), idx.end());  // t() of 2 dims, transpose(0, 2) of 3
      want.v[size_t(i)] = xr.at(idx);
    }
    check_close(got, want, {0, 0}, fmt::format("transposed copy of {}", s.str()));
  }
  // cat along dim 1: the 6 outer rows split between the cores.
  Tensor a = rnd(g, {6, 40, 30}), b = rnd(g, {6, 25, 30});
  const Ref ar = ref_of(a), br = ref_of(b);
  ChipRunProbe probe;
  Tensor got = cat({a.to(Device("sim:1")), b.to(Device("sim:1"))}, 1);
  CHECK(probe.new_fallbacks() == 0);
  Ref want(Shape{6, 65, 30});
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 65; ++j)
      for (int64_t c = 0; c < 30; ++c) want.at({i, j, c}) = j < 40 ? ar.at({i, j, c}) : br.at({i, j - 40, c});
  check_close(got, want, {0, 0}, "cat split over two cores");
  // Attention: KV heads split between the cores (4 query heads on 2 KV heads, heads split out
  // of a projection; causal, and with a bool mask), against the host.
  for (bool causal : {true, false}) {
    Tensor qp = rnd(g, {24, 4 * 8}), kp = rnd(g, {24, 2 * 8}), vp = rnd(g, {24, 2 * 8});
    Tensor mask = gt(rnd(g, {4, 24, 24}), -1.0);
    auto heads = [](const Tensor& t, int64_t h) { return transpose(reshape(t, {1, 24, h, 8}), 1, 2); };
    auto run = [&](const Device& dev) {
      return scaled_dot_product_attention(heads(qp.to(dev), 4), heads(kp.to(dev), 2), heads(vp.to(dev), 2),
                                          causal ? Tensor() : mask.to(dev), causal);
    };
    ChipRunProbe p2;
    Tensor on_chip = run(Device("sim:1"));
    CHECK(p2.new_fallbacks() == 0);
    check_close(on_chip, ref_of(run(Device())), {1e-4, 1e-4}, causal ? "causal attention" : "masked attention");
  }
}

TEST_CASE("attention backward in causal query blocks matches a naive double loop", "[codegen][fill_mask]") {
  // L = 64 runs the blocked path (4 blocks of 16 query rows, each against the keys it sees);
  // 2 query heads on 1 KV head. Reference: P, dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)),
  // dQ = dS K s, dK = dS^T Q s in doubles, heads of a group summed.
  TinySim tiny;
  Generator g(27);
  const int64_t H = 2, L = 64, D = 8;
  Tensor q = rnd(g, {1, H, L, D}), k = rnd(g, {1, 1, L, D}), v = rnd(g, {1, 1, L, D}), go = rnd(g, {1, H, L, D});
  const Ref qr = ref_of(q), kr = ref_of(k), vr = ref_of(v), gr = ref_of(go);
  const double sc = 1.0 / std::sqrt(double(D));
  Ref dq(Shape{1, H, L, D}), dk(Shape{1, 1, L, D}), dv(Shape{1, 1, L, D});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> p(size_t(i + 1)), dp(size_t(i + 1));
      double m = -INFINITY, z = 0, rs = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < D; ++c) acc += qr.at({0, h, i, c}) * kr.at({0, 0, j, c});
        p[size_t(j)] = acc * sc;
        m = std::max(m, p[size_t(j)]);
      }
      for (double& x : p) z += (x = std::exp(x - m));
      for (int64_t j = 0; j <= i; ++j) {
        p[size_t(j)] /= z;
        double acc = 0;
        for (int64_t c = 0; c < D; ++c) acc += gr.at({0, h, i, c}) * vr.at({0, 0, j, c});
        dp[size_t(j)] = acc;
        rs += acc * p[size_t(j)];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = p[size_t(j)] * (dp[size_t(j)] - rs);
        for (int64_t c = 0; c < D; ++c) {
          dv.at({0, 0, j, c}) += p[size_t(j)] * gr.at({0, h, i, c});
          dq.at({0, h, i, c}) += ds * kr.at({0, 0, j, c}) * sc;
          dk.at({0, 0, j, c}) += ds * qr.at({0, h, i, c}) * sc;
        }
      }
    }
  for (const Device dev : {Device(), tiny.dev()}) {
    std::vector<Tensor> in;
    for (const Tensor& t : {q, k, v}) in.push_back(t.to(dev).requires_grad_(true));
    Tensor o = scaled_dot_product_attention(in[0], in[1], in[2], {}, true);
    ChipRunProbe probe;
    const std::vector<Tensor> got = autograd::grad({o}, in, {go.to(dev)});
    if (dev != Device()) CHECK(probe.new_fallbacks() == 0);
    const std::string where = dev.str();
    check_close(got[0], dq, {2e-5, 2e-4}, "dq on " + where);
    check_close(got[1], dk, {2e-5, 2e-4}, "dk on " + where);
    check_close(got[2], dv, {2e-5, 2e-4}, "dv on " + where);
  }
}

TEST_CASE("codegen: batched matmul reads narrowed (batch-strided) operands in place", "[codegen][fill_mask]") {
  TinySim tiny;
  Generator g(28);
  Tensor a = rnd(g, {3, 10, 8}), b = rnd(g, {3, 10, 8});
  const Ref ar = ref_of(a), br = ref_of(b);
  Tensor ad = a.to(tiny.dev()), bd = b.to(tiny.dev());
  for (bool tr : {false, true}) {
    const Tensor av = narrow(ad, 1, 2, 5);                                      // [3, 5, 8], batch stride 80
    const Tensor bv = tr ? transpose(narrow(bd, 1, 0, 6), -1, -2) : narrow(narrow(bd, 1, 1, 8), 2, 0, 8);  // [3, 8, 6] / [3, 8, 8]
    const auto copies = [] {
      const auto s = codegen::stats();
      return s.runs_by_kernel.count("strided_copy") ? s.runs_by_kernel.at("strided_copy") : 0;
    };
    const uint64_t c0 = copies();
    Tensor got = matmul(av, bv);
    ChipRunProbe::sync_all();
    CHECK(copies() == c0);  // no gather
    const int64_t n = bv.size(-1);
    Ref want(Shape{3, 5, n});
    for (int64_t z = 0; z < 3; ++z)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < 8; ++c) acc += ar.at({z, i + 2, c}) * (tr ? br.at({z, j, c}) : br.at({z, c + 1, j}));
          want.at({z, i, j}) = acc;
        }
    check_close(got, want, {1e-4, 1e-4}, tr ? "transposed B" : "row-major B");
  }
}

}  // namespace tpu::testing
