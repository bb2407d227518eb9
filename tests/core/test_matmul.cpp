// matmul, mm, bmm, linear: OpInfo entries with a naive triple-loop reference in double over
// every rank combination, broadcast batches, transposed/sliced/expanded views, ragged sizes
// (1, 7, 33, 65), K = 0, each dtype (bf16 with a tolerance that grows with K), promotion,
// and the error cases.
#include "test_reduce_util.h"

namespace tpu::testing {
namespace {
using namespace red;
using L = Layout;

// PyTorch's matmul on host values: vectors become a matrix with a 1 prepended (a) or
// appended (b) that is removed from the result; batch dims broadcast.
Ref ref_matmul(const Ref& a, const Ref& b) {
  Shape sa = a.shape, sb = b.shape;
  const bool va = sa.ndim() == 1, vb = sb.ndim() == 1;
  if (va) sa.insert(0, 1);
  if (vb) sb.push_back(1);
  const int64_t M = sa[sa.ndim() - 2], K = sa[sa.ndim() - 1], N = sb[sb.ndim() - 1];
  Shape ba, bb;
  for (int i = 0; i + 2 < sa.ndim(); ++i) ba.push_back(sa[i]);
  for (int i = 0; i + 2 < sb.ndim(); ++i) bb.push_back(sb[i]);
  const Shape batch = broadcast_shapes(ba, bb, "ref_matmul");
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  Ref out(full);
  Ref A = a, B = b;
  A.shape = sa;
  B.shape = sb;
  const int nb = batch.ndim();
  Shape fa = batch, fb = batch;
  fa.push_back(M), fa.push_back(K);
  fb.push_back(K), fb.push_back(N);
  for (int64_t f = 0; f < out.numel(); ++f) {
    auto idx = unflatten(full, f);
    const int64_t i = idx[static_cast<size_t>(nb)], j = idx[static_cast<size_t>(nb + 1)];
    // Index vectors built once per output element; only the k entries change in the loop.
    auto ia = std::vector<int64_t>(idx.begin(), idx.begin() + nb);
    ia.push_back(i);
    ia.push_back(0);
    auto ib = std::vector<int64_t>(idx.begin(), idx.begin() + nb);
    ib.push_back(0);
    ib.push_back(j);
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      ia[static_cast<size_t>(nb + 1)] = k;
      ib[static_cast<size_t>(nb)] = k;
      acc += A.bcast(fa, ia) * B.bcast(fb, ib);
    }
    out.v[static_cast<size_t>(f)] = acc;
  }
  Shape res = batch;
  if (!va) res.push_back(M);
  if (!vb) res.push_back(N);
  out.shape = res;
  return out;
}

// Integer results wrap to the promoted integer type (here i32 for i32 and u8/i8 products
// that stay in range: values are small).
double wrap_to(DType dt, double v) {
  switch (dt) {
    case DType::i32: return as_i32(v);
    case DType::i8: return static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(v)));
    case DType::u8: return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
    default: return v;
  }
}

// bf16/f16 results: inputs are exact, products accumulate in f32 and the result rounds once.
Tol matmul_tol(DType t) {
  switch (t) {
    case DType::f32: return {2e-5, 2e-5};
    case DType::bf16: return {2e-2, 1e-2};
    case DType::f16: return {2e-3, 2e-3};
    default: return {0, 0};
  }
}

struct MmCase {
  Shape a, b;
  L la, lb;
};

std::vector<MmCase> matmul_cases(DType dt) {
  std::vector<MmCase> c = {
      {{7}, {7}, L::contiguous, L::sliced},                 // dot
      {{1}, {1}, L::contiguous, L::contiguous},
      {{0}, {0}, L::contiguous, L::contiguous},             // empty dot = 0
      {{5, 7}, {7, 3}, L::contiguous, L::contiguous},       // mm
      {{5, 7}, {7, 3}, L::transposed, L::transposed},
      {{33, 65}, {65, 7}, L::sliced, L::transposed},
      {{1, 1}, {1, 1}, L::contiguous, L::contiguous},
      {{65, 33}, {33, 1}, L::transposed, L::contiguous},
      {{7}, {7, 5}, L::sliced, L::transposed},              // vector x matrix
      {{5, 7}, {7}, L::transposed, L::contiguous},          // matrix x vector
      {{2, 5, 7}, {2, 7, 3}, L::contiguous, L::transposed}, // bmm
      {{3, 5, 7}, {7, 4}, L::expanded, L::contiguous},      // batch x matrix
      {{5, 7}, {3, 7, 4}, L::transposed, L::expanded},      // matrix x batch
      {{2, 1, 4, 6}, {3, 6, 5}, L::sliced, L::transposed},  // broadcast batch
      {{4, 1, 3, 2}, {1, 5, 2, 3}, L::contiguous, L::sliced},
      {{7}, {2, 3, 7, 4}, L::contiguous, L::contiguous},    // vector x batch
      {{2, 3, 4, 7}, {7}, L::transposed, L::sliced},        // batch x vector
      {{5, 0}, {0, 3}, L::contiguous, L::contiguous},       // K = 0: zeros
      {{2, 3, 0}, {0, 4}, L::contiguous, L::contiguous},
      {{0, 7}, {7, 3}, L::contiguous, L::contiguous},       // M = 0
      {{5, 7}, {7, 0}, L::contiguous, L::contiguous},       // N = 0
      {{0, 5, 7}, {7, 3}, L::contiguous, L::contiguous},    // empty batch
  };
  if (dt == DType::f32 || dt == DType::bf16) {
    c.push_back({{70, 129}, {129, 66}, L::contiguous, L::transposed});
    c.push_back({{16, 9, 17}, {16, 17, 10}, L::transposed, L::contiguous});  // many small products
  }
  return c;
}

OpInfoRegistrar reg_matmul({
    .op = "matmul",
    .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8},
    .samples =
        [](DType dt, Generator& g) {
          std::vector<OpSample> out;
          // Integer values -2..1 (u8: 0..2) keep i8/u8 products in range.
          const double lo = dt == DType::u8 ? 0.0 : -2.0;
          for (const MmCase& c : matmul_cases(dt))
            out.push_back({fmt::format("{} {} x {} {}", layout_name(c.la), c.a.str(), layout_name(c.lb), c.b.str()),
                           {make_input(g, c.a, dt, c.la, lo, 2.0), make_input(g, c.b, dt, c.lb, lo, 2.0)}});
          return out;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          Tensor r = matmul(in[0], in[1]);
          CHECK(r.dtype() == in[0].dtype());
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          Ref o = ref_matmul(r[0], r[1]);
          for (double& v : o.v) v = wrap_to(dt, v);
          return o;
        },
    .tol = matmul_tol,
});

// linear(x, W, b): inputs {x, W, b, spec[has_bias]}.
OpInfoRegistrar reg_linear({
    .op = "linear",
    .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32},
    .samples =
        [](DType dt, Generator& g) {
          struct C {
            Shape x;
            int64_t n;
            L lx, lw;
            bool bias;
          };
          std::vector<C> cs = {{{5, 7}, 3, L::contiguous, L::contiguous, true},
                               {{5, 7}, 3, L::transposed, L::transposed, false},
                               {{7}, 4, L::sliced, L::contiguous, true},
                               {{2, 3, 7}, 5, L::expanded, L::transposed, true},
                               {{2, 3, 33}, 65, L::sliced, L::sliced, false},
                               {{4, 0}, 3, L::contiguous, L::contiguous, true},  // K = 0: bias only
                               {{0, 5}, 3, L::contiguous, L::contiguous, true},
                               {{2, 1, 4, 6}, 1, L::transposed, L::contiguous, true}};
          std::vector<OpSample> out;
          for (const C& c : cs) {
            const int64_t k = c.x[c.x.ndim() - 1];
            out.push_back({fmt::format("x {} {} W [{}, {}] {}{}", layout_name(c.lx), c.x.str(), c.n, k,
                                       layout_name(c.lw), c.bias ? " +bias" : ""),
                           {make_input(g, c.x, dt, c.lx), make_input(g, {c.n, k}, dt, c.lw),
                            make_input(g, {c.n}, dt, L::sliced), spec({c.bias})}});
          }
          return out;
        },
    .run =
        [](const std::vector<Tensor>& in) {
          Tensor r = linear(in[0], in[1], spec_of(in[3])[0] ? in[2] : Tensor());
          CHECK(r.dtype() == in[0].dtype());
          return r;
        },
    .reference =
        [](const std::vector<Ref>& r, DType dt) {
          const Ref& x = r[0];
          const Ref& w = r[1];
          const bool hb = spec_of(r[3])[0] != 0;
          const int64_t n = w.shape[0], k = w.shape[1];
          Shape os = x.shape;
          os[os.ndim() - 1] = n;
          Ref o(os);
          const int64_t rows = k ? x.numel() / k : o.numel() / n;
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double acc = hb ? r[2].v[static_cast<size_t>(j)] : 0.0;
              for (int64_t q = 0; q < k; ++q) acc += x.v[static_cast<size_t>(i * k + q)] * w.v[static_cast<size_t>(j * k + q)];
              o.v[static_cast<size_t>(i * n + j)] = wrap_to(dt, acc);
            }
          return o;
        },
    .tol = matmul_tol,
});

}  // namespace

TEST_CASE("matmul: shapes of every rank combination, mm and bmm", "[matmul]") {
  CHECK(matmul(ones({3}), ones({3})).shape() == Shape{});
  CHECK(matmul(ones({3}), ones({3})).item<double>() == 3.0);
  CHECK(matmul(ones({3}), ones({3, 4})).shape() == Shape{4});
  CHECK(matmul(ones({2, 3}), ones({3})).shape() == Shape{2});
  CHECK(matmul(ones({5, 2, 3}), ones({3})).shape() == Shape{5, 2});
  CHECK(matmul(ones({3}), ones({5, 3, 4})).shape() == Shape{5, 4});
  CHECK(matmul(ones({2, 1, 2, 3}), ones({4, 3, 5})).shape() == Shape{2, 4, 2, 5});
  CHECK(mm(ones({2, 3}), ones({3, 4})).shape() == Shape{2, 4});
  CHECK(bmm(ones({6, 2, 3}), ones({6, 3, 4})).shape() == Shape{6, 2, 4});
  for (float v : matmul(ones({4, 0}), ones({0, 5})).to_vector<float>()) CHECK(v == 0.0f);
}

TEST_CASE("matmul: dtype promotion and bf16 accumulation in f32", "[matmul]") {
  CHECK(matmul(ones({2, 3}, DType::bf16), ones({3, 2})).dtype() == DType::f32);
  CHECK(matmul(ones({2, 3}, DType::bf16), ones({3, 2}, DType::f16)).dtype() == DType::f32);
  CHECK(matmul(ones({2, 3}, DType::i32), ones({3, 2}, DType::u8)).dtype() == DType::i32);
  CHECK(matmul(ones({2, 3}, DType::u8), ones({3, 2}, DType::i8)).dtype() == DType::i32);
  CHECK(matmul(ones({2, 3}, DType::i8), ones({3, 2}, DType::f16)).dtype() == DType::f16);
  // 4096 products of 1 in bf16: an f32 accumulator gives exactly 4096 (bf16 steps of 32 there);
  // a bf16 accumulator would stall at 256.
  Tensor a = ones({1, 4096}, DType::bf16), b = ones({4096, 1}, DType::bf16);
  CHECK(matmul(a, b).item<double>() == 4096.0);
  CHECK(linear(ones({2, 4096}, DType::bf16), ones({3, 4096}, DType::bf16), ones({3}, DType::bf16))
            .to_vector<float>()[0] == 4096.0f);  // 4097 rounds to 4096 in bf16
  // Integer products wrap like the integer type.
  CHECK(matmul(full({1, 2}, 100, DType::i8), full({2, 1}, 1, DType::i8)).item<int>() == static_cast<int8_t>(200));
}

// bf16 / f16 results of more than 2^19 values are computed in column slices (a multiple of 64
// columns, then a ragged tail) and rounded slice by slice: small integers, so every product,
// sum and rounding is exact and the naive loop must match to the bit.
TEST_CASE("linear: bf16 and f16 results in column slices match a naive loop", "[matmul]") {
  const int64_t M = 70, N = 7777, K = 9;
  std::vector<float> xv(M * K), wv(N * K), bv(N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) xv[i * K + k] = static_cast<float>((i * 3 + k) % 5 - 2);
  for (int64_t j = 0; j < N; ++j) {
    for (int64_t k = 0; k < K; ++k) wv[j * K + k] = static_cast<float>((j * 7 + k * 5) % 9 - 4);
    bv[j] = static_cast<float>(j % 11 - 5);
  }
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = from_vector(xv, {M, K}).to(dt), w = from_vector(wv, {N, K}).to(dt), b = from_vector(bv).to(dt);
    const std::vector<float> got = linear(x, w, b).to(DType::f32).to_vector<float>();
    const std::vector<float> got_nb = linear(x, w).to(DType::f32).to_vector<float>();
    REQUIRE(got.size() == static_cast<size_t>(M * N));
    int64_t bad = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float ref = 0.0f;
        for (int64_t k = 0; k < K; ++k) ref += xv[i * K + k] * wv[j * K + k];
        bad += got[i * N + j] != ref + bv[j];
        bad += got_nb[i * N + j] != ref;
      }
    CHECK(bad == 0);
  }
}

TEST_CASE("matmul/mm/bmm/linear: errors name the op and both shapes", "[matmul][errors]") {
  expect_error([] { matmul(ones({2, 3}), ones({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"});
  expect_error([] { matmul(ones({3}), ones({4})); }, {"matmul", "[3]", "[4]"});
  expect_error([] { matmul(ones({}), ones({3})); }, {"matmul", "at least 1 dimension", "[]", "[3]"});
  expect_error([] { matmul(ones({3, 2}), ones({})); }, {"matmul", "[3, 2]"});
  expect_error([] { matmul(ones({2, 2, 3}), ones({3, 3, 4})); }, {"matmul", "[2, 2, 3]", "[3, 3, 4]", "broadcast"});
  expect_error([] { matmul(ones({2, 2}, DType::boolean), ones({2, 2})); }, {"matmul", "bool"});
  expect_error([] { mm(ones({2, 3, 4}), ones({4, 2})); }, {"mm", "2-D", "[2, 3, 4]", "[4, 2]"});
  expect_error([] { mm(ones({3}), ones({3, 2})); }, {"mm", "[3]"});
  expect_error([] { mm(ones({2, 3}), ones({2, 3})); }, {"mm", "[2, 3]", "inner"});
  expect_error([] { bmm(ones({2, 3}), ones({2, 3, 4})); }, {"bmm", "3-D", "[2, 3]"});
  expect_error([] { bmm(ones({2, 3, 4}), ones({3, 4, 5})); }, {"bmm", "batch", "[2, 3, 4]", "[3, 4, 5]"});
  expect_error([] { bmm(ones({2, 3, 4}), ones({2, 5, 5})); }, {"bmm", "[2, 3, 4]", "[2, 5, 5]"});
  expect_error([] { linear(ones({2, 3}), ones({4, 5})); }, {"linear", "[2, 3]", "[4, 5]"});
  expect_error([] { linear(ones({2, 3}), ones({3})); }, {"linear", "2-D", "[3]"});
  expect_error([] { linear(ones({}), ones({4, 1})); }, {"linear", "0-d"});
  expect_error([] { linear(ones({2, 3}), ones({4, 3}), ones({3})); }, {"linear", "bias", "[3]"});
  CHECK(matmul(ones({2, 3}), ones({3, 4})).shape() == Shape{2, 4});
}

}  // namespace tpu::testing
