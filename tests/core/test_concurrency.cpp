// Concurrency: several threads at once run eager ops and compiled functions (one
// shared by every thread, one private to each) on cpu, sim:0 and sim:1; every result is
// checked against a naive double-precision reference computed by the thread itself. Catch2's
// assertions are not thread-safe, so threads record mismatches and the main thread checks them.
// scripts/test_tsan.sh runs this file under ThreadSanitizer.
#include <atomic>
#include <mutex>
#include <thread>

#include "codegen_testing.h"
#include "jit_testing.h"

namespace tpu::testing {
namespace {

struct Failures {
  std::mutex mu;
  std::vector<std::string> what;
  void add(std::string s) {
    std::lock_guard<std::mutex> lk(mu);
    what.push_back(std::move(s));
  }
};

// y = relu(x @ w^T + b) * 0.5, the reference for every path, in double.
std::vector<double> mlp_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                            int m, int n, int k) {
  std::vector<double> y(size_t(m * n));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = b[size_t(j)];
      for (int p = 0; p < k; ++p) acc += double(x[size_t(i * k + p)]) * w[size_t(j * k + p)];
      y[size_t(i * n + j)] = std::max(acc, 0.0) * 0.5;
    }
  return y;
}

Tensor mlp(const Tensor& x, const Tensor& w, const Tensor& b) { return tpu::relu(tpu::linear(x, w, b)) * 0.5; }

void compare(Failures& f, const std::string& what, const Tensor& got, const std::vector<double>& ref, double tol) {
  const std::vector<float> g = got.to("cpu").to_vector<float>();
  if (g.size() != ref.size()) return f.add(what + ": wrong size");
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - ref[i]) <= tol * (1 + std::fabs(ref[i]))))
      return f.add(fmt::format("{}: element {}: got {}, want {}", what, i, g[i], ref[i]));
}

}  // namespace

TEST_CASE("concurrency: eager and compiled work on cpu, sim:0 and sim:1 from several threads", "[concurrency]") {
  TinySim tiny;  // sim:1 on the tiny chip; sim:0 keeps its chip
  constexpr int m = 6, n = 16, k = 24, kIters = 3;
  const Device devices[3] = {Device("cpu"), Device("sim:0"), Device("sim:1")};
  auto shared = tpu::compile(mlp, {.name = "concurrency_shared"});
  Failures fails;
  std::atomic<int> done{0};
  auto worker = [&](int t) {
    try {
      Generator g(1000 + uint64_t(t));  // the thread's own generator: reproducible
      auto priv = tpu::compile(mlp, {.name = fmt::format("concurrency_private_{}", t)});
      const Device dev = devices[t % 3];
      for (int it = 0; it < kIters; ++it) {
        const Tensor x = tpu::randn({m, k}, {}, &g), w = tpu::randn({n, k}, {}, &g), b = tpu::randn({n}, {}, &g);
        const auto ref = mlp_ref(x.to_vector<float>(), w.to_vector<float>(), b.to_vector<float>(), m, n, k);
        const Tensor xd = x.to(dev), wd = w.to(dev), bd = b.to(dev);
        const std::string where = fmt::format("thread {} on {} iteration {}", t, dev.str(), it);
        compare(fails, where + " eager", mlp(xd, wd, bd), ref, 1e-4);
        compare(fails, where + " shared compiled", shared(xd, wd, bd), ref, 1e-4);
        compare(fails, where + " private compiled", priv(xd, wd, bd), ref, 1e-4);
        // A reduction and an in-place update on the same device.
        Tensor acc = tpu::zeros({n}, TensorOptions(DType::f32, dev));
        acc.add_(bd);
        acc.add_(bd);
        std::vector<double> twice(static_cast<size_t>(n));
        const std::vector<float> bv = b.to_vector<float>();
        for (int j = 0; j < n; ++j) twice[size_t(j)] = 2.0 * bv[size_t(j)];
        compare(fails, where + " in-place", acc, twice, 1e-6);
        double s = 0;
        for (float v : bv) s += v;
        compare(fails, where + " sum", tpu::sum(bd).reshape({1}), {s}, 1e-5);
      }
    } catch (const std::exception& e) {
      fails.add(fmt::format("thread {}: exception: {}", t, e.what()));
    }
    done.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  CHECK(done.load() == 6);
  for (const std::string& s : fails.what) FAIL_CHECK(s);
  CHECK(fails.what.empty());
}

}  // namespace tpu::testing

namespace tpu::testing {

TEST_CASE("concurrency: large host kernels (thread-pool jobs) from several threads at once", "[concurrency]") {
  // Shapes past the parallel grain, so every op is a job of the shared host thread pool.
  constexpr int kThreads = 4, kIters = 20;
  constexpr int64_t kN = 1 << 16;
  Failures fails;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        Generator g(77 + uint64_t(t));
        for (int it = 0; it < kIters; ++it) {
          const Tensor x = tpu::rand({kN}, {}, &g);
          const std::vector<float> xv = x.to_vector<float>();
          double want = 0;
          for (float v : xv) want += 2.0 * v + 1.0;
          compare(fails, fmt::format("thread {} iteration {}", t, it), tpu::sum(x * 2.0 + 1.0).reshape({1}), {want},
                  1e-4);
        }
      } catch (const std::exception& e) {
        fails.add(fmt::format("thread {}: exception: {}", t, e.what()));
      }
    });
  for (auto& th : threads) th.join();
  for (const std::string& s : fails.what) FAIL_CHECK(s);
  CHECK(fails.what.empty());
}

}  // namespace tpu::testing
