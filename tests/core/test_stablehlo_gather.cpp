// StableHLO export of the indexing ops (graph/stablehlo_index.cpp): index_select and embedding
// as a slice gather, torch-style gather as a point gather, scatter_add as a point scatter. The
// modules run in libpjrt_tpucore_sim.so with the host fallback off (so the executables are what
// computed them) and are compared with naive loops and the cpu ops. Out-of-range ids: eager ops on
// pjrt raise the cpu kernels' error; a whole exported module follows StableHLO (gather clamps,
// scatter skips the update).
#include <dlfcn.h>

#include "testing.h"
#include "tpucore/compile.h"
#include "tpucore/export.h"
#include "tpucore/ops.h"
#include "tpucore/runtime/pjrt_client.h"
#include "tpucore/streams.h"

namespace tpu::testing {
namespace {

using Catch::Matchers::Contains;

std::string load_sim_pjrt() {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(static_cast<void (*)(tpu::Device)>(&tpu::synchronize)), &info));
  const std::string p = info.dli_fname;
  const std::string path = p.substr(0, p.rfind('/') + 1) + "libpjrt_tpucore_sim.so";
  load_pjrt_plugin(path);
  return path;
}

struct StrictPjrt {
  bool was = pjrt_host_fallback();
  StrictPjrt() { set_pjrt_host_fallback(false); }
  ~StrictPjrt() { set_pjrt_host_fallback(was); }
};

Tensor values(const Shape& s, DType t, uint64_t seed) {
  Generator g(seed);
  return t == DType::i32 ? randint(-50, 50, s, TensorOptions(DType::i32), &g) : randn(s, {}, &g).to(t);
}

Tensor ids(const std::vector<int64_t>& v, const Shape& s, DType t) { return from_vector(v, s).to(t); }

// Naive references on host f32 copies (index values read as int64).
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> c(size_t(s.ndim()));
  for (int k = s.ndim() - 1; k >= 0; --k) {
    c[size_t(k)] = i % s[k];
    i /= s[k];
  }
  return c;
}
int64_t ravel(const std::vector<int64_t>& c, const Shape& s) {
  int64_t i = 0;
  for (int k = 0; k < s.ndim(); ++k) i = i * s[k] + c[size_t(k)];
  return i;
}
std::vector<float> f32(const Tensor& t) { return t.to("cpu").to(DType::f32).contiguous().to_vector<float>(); }
std::vector<int64_t> i64(const Tensor& t) { return t.to("cpu").to(DType::i64).contiguous().to_vector<int64_t>(); }

std::vector<float> ref_index_select(const Tensor& x, int d, const Tensor& id) {
  const auto xv = f32(x);
  const auto iv = i64(id);
  Shape os = x.shape();
  os[d] = int64_t(iv.size());
  std::vector<float> r(size_t(os.numel()));
  for (int64_t i = 0; i < os.numel(); ++i) {
    auto c = unravel(i, os);
    c[size_t(d)] = iv[size_t(c[size_t(d)])];
    r[size_t(i)] = xv[size_t(ravel(c, x.shape()))];
  }
  return r;
}

std::vector<float> ref_gather(const Tensor& x, int d, const Tensor& id) {
  const auto xv = f32(x);
  const auto iv = i64(id);
  std::vector<float> r(iv.size());
  for (int64_t i = 0; i < int64_t(iv.size()); ++i) {
    auto c = unravel(i, id.shape());
    c[size_t(d)] = iv[size_t(i)];
    r[size_t(i)] = xv[size_t(ravel(c, x.shape()))];
  }
  return r;
}

std::vector<float> ref_scatter_add(const Tensor& x, int d, const Tensor& id, const Tensor& src) {
  auto r = f32(x);
  const auto iv = i64(id);
  const auto sv = f32(src);
  for (int64_t i = 0; i < int64_t(iv.size()); ++i) {
    auto c = unravel(i, id.shape());
    const float s = sv[size_t(ravel(c, src.shape()))];
    c[size_t(d)] = iv[size_t(i)];
    r[size_t(ravel(c, x.shape()))] += s;
  }
  return r;
}

void check_close(const Tensor& got, const std::vector<float>& want, float tol) {
  const auto g = f32(got);
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) CHECK(std::abs(g[i] - want[i]) <= tol * (1 + std::abs(want[i])));
}

}  // namespace

TEST_CASE("stablehlo gather: the dimension numbers of each indexing op", "[stablehlo][stablehlo-gather]") {
  const Tensor x = values({4, 5}, DType::f32, 1);
  const std::string m = export_stablehlo(
      [](const std::vector<Tensor>& a) {
        return std::vector<Tensor>{index_select(a[0], 1, a[1]), embedding(a[0], a[2])};
      },
      {x, ids({4, 0, 2}, {3}, DType::i64), ids({1, 3, 0, 0, 2, 1}, {2, 3}, DType::i32)});
  CHECK_THAT(m, Contains("#stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [1], start_index_map = [1], "
                         "index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 4, 1>"));
  CHECK_THAT(m, Contains("#stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], "
                         "index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 5>"));
  const std::string g = export_stablehlo(
      [](const std::vector<Tensor>& a) { return std::vector<Tensor>{gather(a[0], 0, a[1]), scatter_add(a[0], 0, a[1], a[0])}; },
      {x, ids({3, 0, 1, 1}, {2, 2}, DType::i32)});
  CHECK_THAT(g, Contains("#stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 2>"));
  CHECK_THAT(g, Contains("\"stablehlo.scatter\"") &&
                    Contains("#stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], "
                             "index_vector_dim = 2>"));
  CHECK_THAT(g, Contains("\"stablehlo.slice\""));  // src's index-shaped corner
}

TEST_CASE("stablehlo gather: eager indexing ops on pjrt:0 run as executables and match naive loops",
          "[pjrt][stablehlo-gather]") {
  load_sim_pjrt();
  StrictPjrt strict;
  reset_pjrt_stats();
  const Device p("pjrt:0");
  uint64_t seed = 10;
  for (DType t : {DType::f32, DType::bf16, DType::i32}) {
    for (DType it : {DType::i32, DType::i64}) {
      INFO(dtype_name(t) << " values, " << dtype_name(it) << " ids");
      const float tol = t == DType::bf16 ? 1e-2f : 1e-6f;
      for (const Shape& s : {Shape{6}, Shape{4, 5}, Shape{2, 3, 4}}) {
        INFO("x shape " << s.str());
        const Tensor x = values(s, t, seed++);
        for (int d = 0; d < s.ndim(); ++d) {
          const Tensor id = ids({s[d] - 1, 0, s[d] / 2, s[d] - 1}, {4}, it);
          const Tensor got = index_select(x.to(p), d, id.to(p));
          CHECK(got.device() == p);
          check_close(got, ref_index_select(x, d, id), 0);
          CHECK(equal(got.to("cpu"), index_select(x, d, id)));
          // gather / scatter_add with an index smaller than x outside dim, src larger than index.
          Shape is = s;
          for (int k = 0; k < s.ndim(); ++k) is[k] = k == d ? 3 : std::max<int64_t>(1, s[k] - 1);
          Generator g(seed++);
          const Tensor gi = randint(0, s[d], is, TensorOptions(DType::i64), &g).to(it);
          check_close(gather(x.to(p), d, gi.to(p)), ref_gather(x, d, gi), 0);
          Shape ss = is;
          ss[d] += 1;
          const Tensor src = values(ss, t, seed++);
          const Tensor sa = scatter_add(x.to(p), d, gi.to(p), src.to(p));
          check_close(sa, ref_scatter_add(x, d, gi, src), tol);
          CHECK(allclose(sa.to("cpu").to(DType::f32), scatter_add(x, d, gi, src).to(DType::f32), 0, 0));
        }
      }
      if (t == DType::i32) continue;  // embedding weights are floating
      const Tensor w = values({7, 3}, t, seed++);
      for (const Shape& is : {Shape{}, Shape{5}, Shape{2, 3}}) {
        Generator g(seed++);
        const Tensor id = randint(0, 7, is, TensorOptions(DType::i64), &g).to(it);
        const Tensor got = embedding(w.to(p), id.to(p));
        CHECK(got.shape() == embedding(w, id).shape());
        check_close(got, ref_index_select(w, 0, id.reshape({id.numel()})), 0);
      }
    }
  }
  CHECK(pjrt_stats().host_fallbacks == 0);
  CHECK(pjrt_stats().executions > 0);
}

TEST_CASE("stablehlo gather: a compiled function with indexing ops is one executable on pjrt:0",
          "[pjrt][stablehlo-gather][jit]") {
  load_sim_pjrt();
  StrictPjrt strict;
  auto f = tpu::compile([](const Tensor& w, const Tensor& id, const Tensor& gi) {
    Tensor e = embedding(w, id);                        // [2, 3, 4]
    Tensor s = index_select(e, 1, gi.select(0, 0));     // [2, 2, 4]
    return scatter_add(e, 2, gather(gi.unsqueeze(-1).expand({2, 2, 4}), 1, gi.unsqueeze(-1).expand({2, 2, 4})), s) * 2.0f;
  });
  const Tensor w = values({6, 4}, DType::f32, 40);
  const Tensor id = ids({5, 0, 2, 2, 1, 3}, {2, 3}, DType::i64), gi = ids({1, 0, 0, 1}, {2, 2}, DType::i32);
  const Tensor want = f(w, id, gi);
  reset_pjrt_stats();
  const Tensor got = f(w.to("pjrt:0"), id.to("pjrt:0"), gi.to("pjrt:0"));
  CHECK(pjrt_stats().graph_compiles == 1);
  CHECK(pjrt_stats().host_fallbacks == 0);
  CHECK(allclose(got.to("cpu"), want, 1e-6, 1e-6));
}

TEST_CASE("stablehlo gather: out-of-range ids", "[pjrt][stablehlo-gather]") {
  const std::string path = load_sim_pjrt();
  StrictPjrt strict;
  const Device p("pjrt:0");
  const Tensor x = values({4, 3}, DType::f32, 50);
  // Eager ops on pjrt check the ids on the host first: the cpu kernels' error, before any export.
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0, 4}, std::vector<int64_t>{-1, 0}}) {
    const Tensor id = ids(bad, {2}, DType::i64);
    CHECK_THROWS_WITH(index_select(x.to(p), 0, id.to(p)), Contains("index_select") && Contains("out of range"));
    CHECK_THROWS_WITH(embedding(x.to(p), id.to(p)), Contains("embedding") && Contains("out of range"));
    const Tensor g = ids({bad[0], bad[1], 0, 0, 0, 0}, {2, 3}, DType::i32);
    CHECK_THROWS_WITH(gather(x.to(p), 0, g.to(p)), Contains("gather") && Contains("out of range"));
    CHECK_THROWS_WITH(scatter_add(x.to(p), 0, g.to(p), x.to(p)), Contains("scatter_add") && Contains("out of range"));
  }
  CHECK(equal(index_select(x.to(p), 0, ids({3, 1}, {2}, DType::i32).to(p)).to("cpu"), index_select(x, 0, ids({3, 1}, {2}, DType::i32))));
  // An exported module run by the plugin follows StableHLO: gather clamps each start index into
  // the operand, scatter skips an out-of-range update.
  const std::string m = export_stablehlo(
      [](const std::vector<Tensor>& a) {
        return std::vector<Tensor>{index_select(a[0], 0, a[1]), scatter_add(a[0], 0, a[2], a[0])};
      },
      {x, ids({0, 1, 2}, {3}, DType::i32), ids({0, 0, 0}, {1, 3}, DType::i32)});
  auto client = pjrt::Client::load(path);
  auto exe = client->compile(m);
  const auto out = exe->execute({x, ids({7, -2, 1}, {3}, DType::i32), ids({4, 1, -1}, {1, 3}, DType::i32)});
  REQUIRE(out.size() == 2);
  check_close(out[0], ref_index_select(x, 0, ids({3, 0, 1}, {3}, DType::i64)), 0);
  auto want = f32(x);
  want[size_t(1 * 3 + 1)] += want[1];  // only the in-range update (row 1, column 1) is added
  check_close(out[1], want, 1e-6f);
}

}  // namespace tpu::testing
