// Eager ops on sim run as generated chip programs: each lowered op runs on the chip (codegen
// runs and simulated cycles advance, no host fallback), programs are cached per shape, large
// shapes tile to fit the tiny chip's VMEM, values match the host.
#include "codegen_testing.h"

namespace tpu::testing {
namespace {


void check_on_chip(const Tensor& got, const Tensor& expect_cpu, Tol tol, const std::string& what) {
  check_close(got, ref_of(expect_cpu), tol, what);
}

}  // namespace

TEST_CASE("codegen: a lowered op runs on the chip, not through the host fallback", "[codegen]") {
  TinySim tiny;
  Generator g(7);
  Tensor a = rnd(g, {5, 12}), b = rnd(g, {5, 12});
  Tensor da = a.to(tiny.dev()), db = b.to(tiny.dev());
  ChipRunProbe probe;
  Tensor c = da + db;
  CHECK(c.device() == tiny.dev());
  CHECK(probe.new_runs() == 1);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_cycles() > 0);
  check_on_chip(c, a + b, default_tol(DType::f32), "add");
  CHECK(codegen::stats().runs_by_kernel.count("add") == 1);
}

TEST_CASE("codegen: programs are cached per op, shapes and dtypes", "[codegen]") {
  TinySim tiny;
  Generator g(8);
  Tensor a = rnd(g, {7, 9}).to(tiny.dev()), b = rnd(g, {7, 9}).to(tiny.dev());
  (void)tpu::mul(a, b);
  const codegen::CodegenStats s0 = codegen::stats();
  for (int i = 0; i < 3; ++i) (void)tpu::mul(a, b);
  const codegen::CodegenStats s1 = codegen::stats();
  CHECK(s1.programs_built == s0.programs_built);
  CHECK(s1.cache_hits >= s0.cache_hits + 3);
  Tensor c = rnd(g, {7, 10}).to(tiny.dev());
  (void)tpu::mul(c, c);
  CHECK(codegen::stats().programs_built == s1.programs_built + 1);
}

TEST_CASE("codegen testing: each TinySim starts on a new device, and a tensor left on sim:1 is an error", "[codegen]") {
  // One process, three tests' worth of TinySim: the first leaves a chip tensor alive (as a
  // global of a test file would), so sim:1 cannot be rebuilt: the next TinySim must refuse it,
  // naming the live allocation, rather than run on the old device and its cached programs.
  Tensor kept;
  {
    TinySim tiny;
    kept = tpu::mul(full({5, 3}, 2.0, TensorOptions(DType::f32, tiny.dev())), 3.0);
    CHECK(codegen::cached_programs(tiny.dev()) >= 1);
  }
  CHECK_THROWS_WITH(TinySim(), Catch::Contains("allocation(s)") && Catch::Contains("live on it"));
  kept = Tensor();
  TinySim tiny;
  CHECK(codegen::cached_programs(tiny.dev()) == 0);  // no program of the earlier device
  codegen::reset_stats();
  const Tensor y = tpu::mul(full({5, 3}, 2.0, TensorOptions(DType::f32, tiny.dev())), 3.0);
  CHECK(codegen::stats().programs_built >= 1);
  CHECK(y.to(Device()).to_vector<float>() == std::vector<float>(15, 6.0f));
}

TEST_CASE("codegen: a sim device rebuilt at an index drops the programs of the one it replaced", "[codegen]") {
  // Each TinySim is a new device at sim:1; the programs of the earlier ones must not stay in the
  // cache (they can never run again), so the count over all devices does not grow per device.
  size_t after_first = 0;
  for (int round = 0; round < 3; ++round) {
    TinySim tiny;
    const Tensor y = tpu::mul(full({4, 6}, 2.0, TensorOptions(DType::f32, tiny.dev())), 5.0);
    CHECK(y.to(Device()).to_vector<float>() == std::vector<float>(24, 10.0f));
    const size_t mine = codegen::cached_programs(tiny.dev());
    CHECK(mine >= 1);
    if (round == 0) after_first = codegen::cached_programs_all_devices();
    else CHECK(codegen::cached_programs_all_devices() == after_first);
  }
}

TEST_CASE("codegen: the program cache keeps its capacity, least recently used out first", "[codegen]") {
  TinySim tiny;
  Generator g(9);
  const size_t prev = codegen::program_cache_capacity();
  struct Restore {
    size_t cap;
    ~Restore() { codegen::set_program_cache_capacity(cap); }
  } restore{prev};
  CHECK_THROWS_AS(codegen::set_program_cache_capacity(0), Error);
  CHECK(codegen::program_cache_capacity() == prev);

  codegen::set_program_cache_capacity(3);
  // Five shapes: five programs, two of them evicted (the first two, least recently used).
  std::vector<Tensor> host, dev;
  for (int64_t n = 3; n < 8; ++n) {
    host.push_back(rnd(g, {n, 5}));
    dev.push_back(host.back().to(tiny.dev()));
  }
  const codegen::CodegenStats s0 = codegen::stats();
  for (const Tensor& d : dev) (void)tpu::exp(d);
  ChipRunProbe::sync_all();
  const codegen::CodegenStats s1 = codegen::stats();
  CHECK(s1.programs_built == s0.programs_built + 5);
  CHECK(s1.programs_evicted >= s0.programs_evicted + 2);
  CHECK(codegen::cached_programs(1) == 3);
  // The newest three hit; the first, evicted, is built again (and evicts the oldest left).
  for (size_t i = 2; i < 5; ++i) check_on_chip(tpu::exp(dev[i]), tpu::exp(host[i]), default_tol(DType::f32), "exp");
  const codegen::CodegenStats s2 = codegen::stats();
  CHECK(s2.programs_built == s1.programs_built);
  check_on_chip(tpu::exp(dev[0]), tpu::exp(host[0]), default_tol(DType::f32), "exp after eviction");
  const codegen::CodegenStats s3 = codegen::stats();
  CHECK(s3.programs_built == s2.programs_built + 1);
  CHECK(s3.programs_evicted == s2.programs_evicted + 1);
  CHECK(codegen::cached_programs(1) == 3);
}

TEST_CASE("codegen: elementwise ops with broadcasting, views, casts on the tiny chip", "[codegen]") {
  TinySim tiny;
  Generator g(9);
  const Device d = tiny.dev();
  Tensor x = rnd(g, {6, 10}), row = rnd(g, {10}), col = rnd(g, {6, 1}), xt = rnd(g, {10, 6});
  ChipRunProbe probe;
  check_on_chip(x.to(d) * row.to(d), x * row, default_tol(DType::f32), "row broadcast");
  check_on_chip(x.to(d) - col.to(d), x - col, default_tol(DType::f32), "column broadcast");
  check_on_chip(x.to(d) + 2.5, x + 2.5, default_tol(DType::f32), "scalar");
  check_on_chip(x.to(d) + xt.to(d).t(), x + xt.t(), default_tol(DType::f32), "transposed view");
  check_on_chip(tpu::gelu(x.to(d)), tpu::gelu(x), {1e-5, 1e-5}, "gelu");
  check_on_chip(tpu::silu(x.to(d)), tpu::silu(x), {1e-5, 1e-5}, "silu");
  check_on_chip(tpu::where(tpu::gt(x.to(d), 0.0), x.to(d), col.to(d)), tpu::where(tpu::gt(x, 0.0), x, col), default_tol(DType::f32),
                "where");
  check_on_chip(tpu::clamp(x.to(d), -0.5, 0.5), tpu::clamp(x, -0.5, 0.5), default_tol(DType::f32), "clamp");
  check_on_chip(x.to(d).to(DType::bf16), x.to(DType::bf16), {0, 0}, "cast to bf16 rounds like the host");
  check_on_chip(tpu::exp(x.to(DType::bf16).to(d)), tpu::exp(x.to(DType::bf16)), default_tol(DType::bf16), "bf16 exp");
  CHECK(probe.new_fallbacks() == 0);
}

TEST_CASE("codegen: large elementwise and reductions tile to fit the tiny chip's VMEM", "[codegen]") {
  TinySim tiny;
  Generator g(10);
  const Device d = tiny.dev();
  // 3 inputs of 96K f32 (384 KiB each) > 256 KiB of VMEM.
  Tensor a = rnd(g, {300, 321}), b = rnd(g, {300, 321});
  ChipRunProbe probe;
  check_on_chip(tpu::relu(a.to(d)) * b.to(d), tpu::relu(a) * b, default_tol(DType::f32), "tiled elementwise");
  check_on_chip(a.to(d).sum({-1}), a.sum({-1}), {1e-4, 1e-5}, "row sums");
  check_on_chip(a.to(d).sum({0}), a.sum({0}), {1e-4, 1e-5}, "column sums (transposed first)");
  check_on_chip(tpu::amax(a.to(d), {-1}), tpu::amax(a, {-1}), {0, 0}, "row max");
  check_on_chip(tpu::softmax(a.to(d), -1), tpu::softmax(a, -1), {1e-6, 1e-4}, "softmax");
  check_on_chip(tpu::softmax(a.to(d), 0), tpu::softmax(a, 0), {1e-6, 1e-4}, "softmax over dim 0");
  // A row longer than VMEM holds: two-stage reduction.
  Tensor big = rnd(g, {1, 256 * 1024 / 4 * 2});
  check_on_chip(big.to(d).sum({-1}), big.sum({-1}), {1e-2, 1e-4}, "two-stage sum");
  CHECK(probe.new_fallbacks() == 0);
}

TEST_CASE("codegen: layer_norm and rms_norm on the chip", "[codegen]") {
  TinySim tiny;
  Generator g(11);
  const Device d = tiny.dev();
  Tensor x = rnd(g, {4, 5, 24}), w = rnd(g, {24}), b = rnd(g, {24});
  ChipRunProbe probe;
  check_on_chip(tpu::layer_norm(x.to(d), {24}, w.to(d), b.to(d)), tpu::layer_norm(x, {24}, w, b), {1e-5, 1e-4},
                "layer_norm");
  check_on_chip(tpu::rms_norm(x.to(d), {24}, w.to(d)), tpu::rms_norm(x, {24}, w), {1e-5, 1e-4}, "rms_norm");
  CHECK(probe.new_runs() >= 2);
  CHECK(probe.new_fallbacks() == 0);
}

}  // namespace tpu::testing

namespace tpu::testing {

TEST_CASE("codegen: out of HBM in a lowered op is a tpu::Error and the device keeps working", "[codegen]") {
  TinySim tiny;  // 4 MiB of HBM
  const Device d = tiny.dev();
  Generator g(12);
  Tensor x = rnd(g, {700, 700}).to(d);  // 1.96 MB
  Tensor y = x + x;                      // 3.92 MB in use
  CHECK_THROWS_WITH(tpu::matmul(y, x), Catch::Matchers::Contains("out of device memory") &&
                                           Catch::Matchers::Contains("sim:1"));
  y = Tensor();
  Tensor small = rnd(g, {3, 4});
  ChipRunProbe probe;
  check_on_chip(tpu::exp(small.to(d)), tpu::exp(small), {1e-6, 1e-6}, "after the error");
  CHECK(probe.new_runs() == 1);
}

TEST_CASE("codegen: expm1 on the chip is accurate near 0 and at the ends (against std::expm1 in double)", "[codegen]") {
  TinySim tiny;
  std::vector<float> xs{0.0f, -0.0f, 1e-30f, -1e-30f, 1e-10f, -1e-10f, 1e-7f, -3e-7f, 1e-4f, -1e-4f, 0.01f, -0.01f,
                        0.3f,  -0.3f, 0.4999f, -0.4999f, 0.5f,  -0.5f,  0.75f, -2.0f, 10.0f, -10.0f, 80.0f, 88.0f,
                        100.0f, -100.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 200; ++i) xs.push_back(-1.0f + 0.01f * static_cast<float>(i));  // through the 0.5 switch
  const int64_t n = static_cast<int64_t>(xs.size());
  ChipRunProbe probe;
  const std::vector<float> got = tpu::expm1(from_vector(xs, Shape{n}).to(tiny.dev())).to(Device()).to_vector<float>();
  CHECK(probe.new_fallbacks() == 0);
  CHECK(probe.new_runs() == 1);
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::expm1(static_cast<double>(xs[static_cast<size_t>(i)]));
    INFO("x = " << xs[static_cast<size_t>(i)] << ": chip " << got[static_cast<size_t>(i)] << ", std::expm1 " << want);
    if (std::isinf(static_cast<float>(want))) {  // past f32's range
      CHECK(got[static_cast<size_t>(i)] == static_cast<float>(want));
    } else {
      CHECK(std::fabs(got[static_cast<size_t>(i)] - want) <= 4e-7 * std::fabs(want) + 1e-45);
      CHECK(std::signbit(got[static_cast<size_t>(i)]) == std::signbit(static_cast<float>(want)));
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(tpu::expm1(from_vector(std::vector<float>{nan}, Shape{1}).to(tiny.dev())).to(Device()).to_vector<float>()[0]));
}

TEST_CASE("codegen: ops a lowering does not cover run through the counted host fallback", "[codegen]") {
  TinySim tiny;
  const Device d = tiny.dev();
  Generator g(13);
  Tensor x = rnd(g, {4, 5});
  ChipRunProbe probe;
  check_on_chip(tpu::sin(x.to(d)), tpu::sin(x), {1e-6, 1e-6}, "sin (no EUP op)");
  CHECK(probe.new_fallbacks() == 1);
  CHECK(probe.new_runs() == 0);
  Tensor i = tpu::randint(0, 10, {6}, {DType::i32}, &g);
  check_on_chip(i.to(d) + i.to(d), i + i, {0, 0}, "integer add (f32 vector math is not integer math)");
  CHECK(probe.new_fallbacks() == 2);
}

}  // namespace tpu::testing
