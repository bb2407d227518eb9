// The sim backend as a default group: init_process_group({backend "sim"}) in this process, then
// run_ranks(fn) runs fn(rank) on one thread per chip of the 2x2 pod of tiny chips, with the free
// functions, new_group and DeviceMesh working as with gloo. Results are checked against naive
// loops over every rank's host input (small integers, exact in every dtype used).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "pod/pod_testing.h"
#include "tpucore/dist.h"
#include "tpucore/nn.h"
#include "tpucore/nn/parallel/ddp.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"

using namespace tpu;
using Catch::Matchers::Contains;
using dist::ReduceOp;

namespace {

using pod_testing::g_env;

// Catch2's assertions are not thread-safe: on rank threads a failed expectation throws (and
// run_ranks reports it, naming the rank).
using pod_testing::expect;

double input(int rank, int64_t i, int salt) { return static_cast<double>((i * 5 + rank * 3 + salt + i * rank) % 7) - 3; }

Tensor make(int rank, int64_t n, int salt, DType t = DType::f32) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(input(rank, i, salt));
  return from_vector(v, Shape{n}).to(t).to(Device(DeviceType::sim, rank));
}

std::vector<float> host(const Tensor& t) { return t.to(Device()).to(DType::f32).contiguous().to_vector<float>(); }

struct SimWorld {  // init and destroy around one test
  explicit SimWorld(int n = -1, int timeout_ms = 20000) {
    dist::InitOptions o;
    o.backend = "sim";
    o.world_size = n;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    dist::init_process_group(o);
  }
  ~SimWorld() { dist::destroy_process_group(); }
};

}  // namespace

TEST_CASE("dist sim default group: free functions on rank threads against naive loops", "[dist][pod]") {
  SimWorld world;
  REQUIRE(dist::is_initialized());
  const int n = 4;
  const int64_t k = 37;  // odd size
  std::atomic<int> ran{0};
  dist::run_ranks([&](int r) {
    expect(dist::get_rank() == r && dist::get_world_size() == n, "rank and world size");
    expect(dist::world()->backend_name() == "sim", "backend name");
    // all_reduce sum and max, in place on this rank's chip
    Tensor s = make(r, k, 1), m = make(r, k, 2, DType::bf16);
    dist::all_reduce(s);
    dist::all_reduce(m, ReduceOp::max);
    auto hs = host(s), hm = host(m);
    for (int64_t i = 0; i < k; ++i) {
      double sum = 0, mx = -1e9;
      for (int q = 0; q < n; ++q) {
        sum += input(q, i, 1);
        mx = std::max(mx, input(q, i, 2));
      }
      expect(hs[static_cast<size_t>(i)] == sum, "all_reduce sum");
      expect(hm[static_cast<size_t>(i)] == mx, "all_reduce max (bf16)");
    }
    // all_gather_into_tensor, reduce_scatter_tensor, broadcast
    Tensor in = make(r, k, 3);
    Tensor out = empty(Shape{n * k}, TensorOptions(DType::f32, Device(DeviceType::sim, r)));
    dist::all_gather_into_tensor(out, in);
    auto ho = host(out);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < k; ++i) expect(ho[static_cast<size_t>(q * k + i)] == input(q, i, 3), "all_gather");
    Tensor big = make(r, n * 6, 4, DType::i32), part = empty(Shape{6}, TensorOptions(DType::i32, Device(DeviceType::sim, r)));
    dist::reduce_scatter_tensor(part, big);
    auto hp = host(part);
    for (int64_t i = 0; i < 6; ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += input(q, r * 6 + i, 4);
      expect(hp[static_cast<size_t>(i)] == sum, "reduce_scatter (i32)");
    }
    Tensor b = make(r, k, 5);
    dist::broadcast(b, 2);
    auto hb = host(b);
    for (int64_t i = 0; i < k; ++i) expect(hb[static_cast<size_t>(i)] == input(2, i, 5), "broadcast from rank 2");
    dist::barrier();
    ++ran;
  });
  CHECK(ran == n);
}

TEST_CASE("dist sim default group: new_group and a 2x2 DeviceMesh on rank threads", "[dist][pod]") {
  SimWorld world;
  dist::run_ranks([&](int r) {
    dist::DeviceMesh mesh({2, 2}, {"dp", "tp"});
    auto c = mesh.coordinate();
    expect(c[0] == r / 2 && c[1] == r % 2, "row-major coordinate");
    Tensor x = make(r, 9, 6);
    dist::all_reduce(x, ReduceOp::sum, mesh.group("tp"));  // ranks {2*c0, 2*c0+1}
    auto hx = host(x);
    for (int64_t i = 0; i < 9; ++i)
      expect(hx[static_cast<size_t>(i)] == input(2 * c[0], i, 6) + input(2 * c[0] + 1, i, 6), "tp all_reduce");
    Tensor y = make(r, 9, 7);
    dist::all_reduce(y, ReduceOp::min, mesh.group("dp"));  // ranks {c1, c1+2}
    auto hy = host(y);
    for (int64_t i = 0; i < 9; ++i)
      expect(hy[static_cast<size_t>(i)] == std::min(input(c[1], i, 7), input(c[1] + 2, i, 7)), "dp all_reduce");
    auto odd = dist::new_group({1, 3});
    expect(odd->is_member() == (r % 2 == 1), "membership of {1, 3}");
    if (odd->is_member()) {
      Tensor z = make(r, 4, 8);
      odd->all_reduce(z);
      auto hz = host(z);
      for (int64_t i = 0; i < 4; ++i) expect(hz[static_cast<size_t>(i)] == input(1, i, 8) + input(3, i, 8), "group {1, 3}");
    }
  });
  // A second run makes its groups afresh (other ids), with two ranks in a smaller group.
  dist::run_ranks([&](int r) {
    auto first = dist::new_group({0, 2});
    if (first->is_member()) {
      Tensor z = make(r, 3, 9);
      first->all_reduce(z, ReduceOp::max);
      auto hz = host(z);
      for (int64_t i = 0; i < 3; ++i) expect(hz[static_cast<size_t>(i)] == std::max(input(0, i, 9), input(2, i, 9)), "group {0, 2}");
    }
  });
}

TEST_CASE("dist sim default group: a world of 2 chips, and errors", "[dist][pod]") {
  SECTION("two chips of the pod") {
    SimWorld world(2);
    dist::run_ranks([&](int r) {
      Tensor t = make(r, 5, 1);
      dist::all_reduce(t, ReduceOp::avg);
      auto h = host(t);
      for (int64_t i = 0; i < 5; ++i) expect(h[static_cast<size_t>(i)] == (input(0, i, 1) + input(1, i, 1)) / 2, "avg");
    });
  }
  SECTION("misuse is a clear error") {
    CHECK_THROWS_WITH(dist::run_ranks([](int) {}), Contains("no sim world"));
    dist::InitOptions bad;
    bad.backend = "sim";
    bad.world_size = 5;
    CHECK_THROWS_WITH(dist::init_process_group(bad), Contains("5 chips asked for but the pod 2x2 has 4"));
    bad.world_size = -1;
    bad.rank = 0;
    CHECK_THROWS_WITH(dist::init_process_group(bad), Contains("leave rank at -1"));
    CHECK_FALSE(dist::is_initialized());
    SimWorld world;
    CHECK_THROWS_WITH(dist::world(), Contains("inside tpu::dist::run_ranks"));
    CHECK_THROWS_WITH(dist::new_group({0, 1}), Contains("rank threads of run_ranks"));
    CHECK_THROWS_WITH(dist::init_process_group(), Contains("already initialized (sim backend, world size 4)"));
    // A tensor on another rank's chip, and nesting: errors on the rank threads, reported by rank.
    CHECK_THROWS_WITH(dist::run_ranks([](int r) {
                        Tensor t = make(r == 1 ? 0 : r, 4, 1);  // rank 1's is on sim:0
                        dist::all_reduce(t);
                      }),
                      Contains("4 of 4 ranks failed: rank 0: ") && Contains("rank(s) 1 passed invalid arguments") &&
                          Contains("rank 1: ") && Contains("is on sim:0 but rank 1"));
    CHECK_THROWS_WITH(dist::run_ranks([](int r) {
                        if (r == 0) dist::run_ranks([](int) {});
                      }),
                      Contains("rank 0: ") && Contains("does not nest"));
  }
  SECTION("a rank that fails before a collective makes the others fail within the timeout") {
    SimWorld world(-1, 1500);
    auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(dist::run_ranks([](int r) {
                        if (r == 3) throw std::runtime_error("rank 3 gave up");
                        Tensor t = make(r, 4, 1);
                        dist::all_reduce(t);
                      }),
                      Contains("4 of 4 ranks failed") && Contains("rank 3: rank 3 gave up"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
  }
  CHECK_FALSE(dist::is_initialized());
  // The runtime stays usable: a fresh sim world works after the failures.
  SimWorld again(2);
  dist::run_ranks([](int r) {
    Tensor t = make(r, 2, 1);
    dist::all_reduce(t);
    expect(host(t)[0] == input(0, 0, 1) + input(1, 0, 1), "all_reduce in a fresh world");
  });
}

// DistributedDataParallel on the simulated pod: each rank thread wraps its own model (host
// parameters; the gradient buckets are staged onto the rank's chip and averaged over the ICI),
// against one single-threaded model trained on the whole batch.
TEST_CASE("dist sim default group: DistributedDataParallel equals single-device training", "[dist][pod]") {
  const int n = 4;
  const int64_t per = 3, global = per * n;
  auto data = [&](int64_t step) {
    std::vector<float> x(static_cast<size_t>(global * 5));
    std::vector<int64_t> y(static_cast<size_t>(global));
    for (int64_t i = 0; i < global * 5; ++i) x[static_cast<size_t>(i)] = static_cast<float>(std::cos(0.37 * double(i) + double(step)));
    for (int64_t i = 0; i < global; ++i) y[static_cast<size_t>(i)] = (i + step) % 3;
    return std::pair{from_vector(x, Shape{global, 5}), from_vector(y, Shape{global})};
  };
  const optim::SGDOptions sgd{.lr = 0.3, .momentum = 0.5};
  Generator g0(11);
  auto ref = std::make_shared<nn::MLP>(std::vector<int64_t>{5, 12, 3}, "relu", 0.0, &g0);
  optim::SGD ref_opt(ref->parameters(), sgd);
  std::vector<double> ref_loss;
  for (int64_t step = 0; step < 3; ++step) {
    auto [x, y] = data(step);
    ref_opt.zero_grad();
    Tensor loss = nn::cross_entropy(ref->forward(x), y);
    loss.backward();
    ref_opt.step();
    ref_loss.push_back(loss.item<double>());
  }
  SimWorld world;
  std::vector<std::vector<float>> final_params(n);
  dist::run_ranks([&](int r) {
    Generator g(11 + static_cast<uint64_t>(r));  // only rank 0's start survives the broadcast
    auto model = std::make_shared<nn::MLP>(std::vector<int64_t>{5, 12, 3}, "relu", 0.0, &g);
    nn::parallel::DDPOptions o;
    o.bucket_cap_bytes = 64;
    nn::parallel::DistributedDataParallel ddp(model, o);
    optim::SGD opt(model->parameters(), sgd);
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = data(step);
      opt.zero_grad();
      Tensor loss = nn::cross_entropy(ddp.forward(x.narrow(0, r * per, per).contiguous()), y.narrow(0, r * per, per).contiguous());
      loss.backward();
      opt.step();
      Tensor mean = loss.detach().reshape(Shape{1}).to(Device(DeviceType::sim, r));
      dist::all_reduce(mean, ReduceOp::avg);
      expect(std::fabs(host(mean)[0] - ref_loss[static_cast<size_t>(step)]) < 1e-5, "loss of step " + std::to_string(step));
    }
    for (auto& p : model->parameters())
      for (float v : p.to_vector<float>()) final_params[static_cast<size_t>(r)].push_back(v);
    expect(ddp.stats().overlapped_buckets > 0, "buckets started during backward");
  });
  std::vector<float> want;
  for (auto& p : ref->parameters())
    for (float v : p.to_vector<float>()) want.push_back(v);
  for (int r = 0; r < n; ++r) {
    REQUIRE(final_params[static_cast<size_t>(r)].size() == want.size());
    double d = 0;
    for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::fabs(double(final_params[static_cast<size_t>(r)][i]) - want[i]));
    CHECK(d < 2e-5);
  }
}
