// tpu::dist's sim backend (tpucore/dist/sim_backend.cpp): one ProcessGroup per chip of a 2x2
// pod of tiny chips (TPU_SIM_POD=2x2, TPU_SIM_CHIP=tiny, as test_sim_pod.cpp), driven from one
// thread per rank or from one thread with async calls. Values are checked against naive loops
// over the ranks' host inputs (small integer values, so every dtype computes them exactly).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <thread>

#include "device/sim_driver.h"
#include "device/sim_pod.h"
#include "pod/pod_testing.h"
#include "tpucore/dist.h"
#include "tpucore/ops.h"

using namespace tpu;
using Catch::Matchers::Contains;
using dist::ReduceOp;

namespace {

using pod_testing::g_env;

using pod_testing::chip;

using pod_testing::expect;

using pod_testing::on_ranks;

// Rank r's input: small integers (0/1 for bool, 0..3 for u8, -3..3 otherwise) of n elements.
std::vector<float> values(DType t, int r, int64_t n, int salt = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int x = static_cast<int>((i * 7 + r * 5 + salt * 3 + i * r) % 7);  // 0..6
    if (t == DType::boolean) v[static_cast<size_t>(i)] = float((i + r + salt) % 3 == 0);
    else if (t == DType::u8) v[static_cast<size_t>(i)] = float(x % 4);
    else v[static_cast<size_t>(i)] = float(x - 3);
  }
  return v;
}

Tensor make(const std::vector<float>& v, const Shape& s, DType t, Device d) {
  return from_vector(v, s).to(t).to(d);
}

std::vector<float> host(const Tensor& t) { return t.to(Device()).to(DType::f32).contiguous().to_vector<float>(); }

float reduce(ReduceOp op, DType t, const std::vector<float>& xs) {
  float acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    const float x = xs[i];
    switch (op) {
      case ReduceOp::sum: case ReduceOp::avg: acc += x; break;
      case ReduceOp::max: acc = std::max(acc, x); break;
      case ReduceOp::min: acc = std::min(acc, x); break;
      case ReduceOp::product: acc *= x; break;
    }
  }
  if (t == DType::boolean) acc = acc != 0 ? 1.f : 0.f;  // sum = or, product = and
  if (op == ReduceOp::avg) acc /= float(xs.size());
  return acc;
}

const DType kPodTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8, DType::boolean};

}  // namespace

TEST_CASE("dist sim: all_reduce on 2 and 4 chips, every op and pod dtype, odd and zero sizes, vs a naive loop") {
  for (int n : {2, 4}) {
    auto g = dist::sim_pod_groups({n});
    REQUIRE(g.size() == size_t(n));
    CHECK(g[1]->rank() == 1);
    CHECK(g[1]->backend_name() == "sim");
    for (DType t : kPodTypes)
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::product, ReduceOp::avg}) {
        if (op == ReduceOp::avg && !is_floating(t)) continue;
        for (int64_t len : {0, 1, 7, 12}) {
          INFO("ranks " << n << " dtype " << dtype_name(t) << " op " << dist::reduce_op_name(op) << " len " << len);
          std::vector<std::vector<float>> out(static_cast<size_t>(n));
          on_ranks(n, [&](int r) {
            Tensor x = make(values(t, r, len), Shape{len}, t, chip(r));
            g[size_t(r)]->all_reduce(x, op);
            expect(x.device() == chip(r), "the result stays on the rank's chip");
            out[size_t(r)] = host(x);
          });
          for (int64_t i = 0; i < len; ++i) {
            std::vector<float> xs;
            for (int r = 0; r < n; ++r) xs.push_back(values(t, r, len)[size_t(i)]);
            for (int r = 0; r < n; ++r) CHECK(out[size_t(r)][size_t(i)] == reduce(op, t, xs));
          }
        }
      }
  }
}

TEST_CASE("dist sim: gather, scatter, broadcast and all-to-all on 2 and 4 chips vs naive loops") {
  for (int n : {2, 4}) {
    auto g = dist::sim_pod_groups({n});
    for (DType t : {DType::f32, DType::bf16, DType::i8, DType::boolean}) {
      for (int64_t len : {1, 3}) {  // rows per rank (odd sizes); rows are 5 wide
        INFO("ranks " << n << " dtype " << dtype_name(t) << " len " << len);
        const int64_t k = len * 5;
        const size_t N = static_cast<size_t>(n);
        std::vector<std::vector<float>> in(N), ag(N), agl(N), rs(N), bc(N), a2a(N), a2al(N);
        for (int r = 0; r < n; ++r) in[size_t(r)] = values(t, r, k * n);
        on_ranks(n, [&](int r) {
          auto& pg = *g[size_t(r)];
          Device d = chip(r);
          Tensor mine = make(std::vector<float>(in[size_t(r)].begin(), in[size_t(r)].begin() + k), Shape{len, 5}, t, d);
          Tensor full = make(in[size_t(r)], Shape{len * n, 5}, t, d);
          Tensor o = empty(Shape{len * n, 5}, TensorOptions(t, d));
          pg.all_gather_into_tensor(o, mine);
          ag[size_t(r)] = host(o);
          std::vector<Tensor> outs;
          for (int j = 0; j < n; ++j) outs.push_back(empty(Shape{len, 5}, TensorOptions(t, d)));
          pg.all_gather(outs, mine);
          for (auto& x : outs)
            for (float f : host(x)) agl[size_t(r)].push_back(f);
          Tensor part = empty(Shape{len, 5}, TensorOptions(t, d));
          pg.reduce_scatter_tensor(part, full, ReduceOp::max);
          rs[size_t(r)] = host(part);
          Tensor b = mine.clone();
          pg.broadcast(b, n - 1);
          bc[size_t(r)] = host(b);
          Tensor a = empty(Shape{len * n, 5}, TensorOptions(t, d));
          pg.all_to_all_single(a, full);
          a2a[size_t(r)] = host(a);
          std::vector<Tensor> ins, os;
          for (int j = 0; j < n; ++j) {
            ins.push_back(full.narrow(0, j * len, len));
            os.push_back(empty(Shape{len, 5}, TensorOptions(t, d)));
          }
          pg.all_to_all(os, ins);
          for (auto& x : os)
            for (float f : host(x)) a2al[size_t(r)].push_back(f);
          pg.barrier();
        });
        for (int r = 0; r < n; ++r) {
          for (int j = 0; j < n; ++j)
            for (int64_t i = 0; i < k; ++i) {
              const size_t at = size_t(j * k + i);
              CHECK(ag[size_t(r)][at] == in[size_t(j)][size_t(i)]);       // rank j's first block
              CHECK(agl[size_t(r)][at] == in[size_t(j)][size_t(i)]);
              CHECK(a2a[size_t(r)][at] == in[size_t(j)][size_t(r * k + i)]);  // block r of rank j
              CHECK(a2al[size_t(r)][at] == in[size_t(j)][size_t(r * k + i)]);
            }
          for (int64_t i = 0; i < k; ++i) {
            std::vector<float> xs;
            for (int j = 0; j < n; ++j) xs.push_back(in[size_t(j)][size_t(r * k + i)]);
            CHECK(rs[size_t(r)][size_t(i)] == reduce(ReduceOp::max, t, xs));
            CHECK(bc[size_t(r)][size_t(i)] == in[size_t(n - 1)][size_t(i)]);
          }
        }
      }
    }
  }
}

TEST_CASE("dist sim: non-contiguous tensors and host tensors are staged, results written back") {
  auto g = dist::sim_pod_groups({4});
  std::vector<std::vector<float>> out(4), host_out(4);
  on_ranks(4, [&](int r) {
    Tensor base = make(values(DType::f32, r, 12), Shape{3, 4}, DType::f32, chip(r));
    Tensor view = base.t();  // [4, 3], strides (1, 4)
    expect(!view.is_contiguous(), "the view is not contiguous");
    g[size_t(r)]->all_reduce(view, ReduceOp::sum);
    out[size_t(r)] = host(base);
    Tensor h = from_vector(values(DType::f32, r, 6));  // cpu: staged onto the chip
    g[size_t(r)]->all_reduce(h);
    host_out[size_t(r)] = host(h);
  });
  for (size_t i = 0; i < 12; ++i) {
    float want = 0;
    for (int r = 0; r < 4; ++r) want += values(DType::f32, r, 12)[i];
    for (int r = 0; r < 4; ++r) CHECK(out[size_t(r)][i] == want);
  }
  for (size_t i = 0; i < 6; ++i) {
    float want = 0;
    for (int r = 0; r < 4; ++r) want += values(DType::f32, r, 6)[i];
    for (int r = 0; r < 4; ++r) CHECK(host_out[size_t(r)][i] == want);
  }
}

TEST_CASE("dist sim: one thread drives 4 chips with async calls, which complete once every rank called in") {
  auto g = dist::sim_pod_groups({4});
  std::vector<Tensor> xs;
  for (int r = 0; r < 4; ++r) xs.push_back(make(values(DType::f32, r, 9), Shape{9}, DType::f32, chip(r)));
  std::vector<dist::Work> ws;
  for (int r = 0; r < 3; ++r) ws.push_back(g[size_t(r)]->all_reduce_async(xs[size_t(r)], ReduceOp::avg));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(ws[0].is_completed());  // rank 3 has not called in yet
  ws.push_back(g[3]->all_reduce_async(xs[3], ReduceOp::avg));
  for (auto& w : ws) w.wait(std::chrono::seconds(20));
  // Several calls in flight per rank, in call order.
  std::vector<Tensor> ys;
  std::vector<dist::Work> w2;
  for (int r = 0; r < 4; ++r) {
    ys.push_back(make(values(DType::i32, r, 4), Shape{4}, DType::i32, chip(r)));
    w2.push_back(g[size_t(r)]->all_reduce_async(ys[size_t(r)], ReduceOp::max));
    w2.push_back(g[size_t(r)]->broadcast_async(xs[size_t(r)], 2));
  }
  for (auto& w : w2) w.wait(std::chrono::seconds(20));
  for (int r = 0; r < 4; ++r) {
    auto v = host(xs[size_t(r)]), y = host(ys[size_t(r)]);
    for (size_t i = 0; i < 9; ++i) {
      std::vector<float> in;
      for (int j = 0; j < 4; ++j) in.push_back(values(DType::f32, j, 9)[i]);
      CHECK(v[i] == reduce(ReduceOp::avg, DType::f32, in));
    }
    for (size_t i = 0; i < 4; ++i) {
      std::vector<float> in;
      for (int j = 0; j < 4; ++j) in.push_back(values(DType::i32, j, 4)[i]);
      CHECK(y[i] == reduce(ReduceOp::max, DType::i32, in));
    }
  }
}

TEST_CASE("dist sim: a collective advances the chips' streams by the pod's ICI cost") {
  auto g = dist::sim_pod_groups({4});
  const int64_t n = 64 * 1024;  // f32: 256 KiB per chip
  std::vector<Tensor> xs;
  for (int r = 0; r < 4; ++r) xs.push_back(full(Shape{n}, 1.0, TensorOptions(DType::f32, chip(r))));
  double before = 0;
  for (int r = 0; r < 4; ++r) {
    device::sim_device(r).queue().synchronize();
    before = std::max(before, device::sim_device(r).queue().stream_time(device::kDefaultStream));
  }
  std::vector<dist::Work> ws;
  for (int r = 0; r < 4; ++r) ws.push_back(g[size_t(r)]->all_reduce_async(xs[size_t(r)]));
  for (auto& w : ws) w.wait(std::chrono::seconds(20));
  std::vector<double> after;
  for (int r = 0; r < 4; ++r) {
    device::sim_device(r).queue().synchronize();
    after.push_back(device::sim_device(r).queue().stream_time(device::kDefaultStream));
  }
  // The same collective costed directly by the pod (timing only), as the reference.
  device::SimCollectiveArgs a;
  a.count = uint64_t(n);
  for (int r = 0; r < 4; ++r) a.src.push_back({r, 0, 0});
  a.dst = a.src;
  a.timing_only = true;
  const double cost = device::sim_collective(a).seconds;
  REQUIRE(cost > 0);
  for (int r = 0; r < 4; ++r) {
    CHECK(after[size_t(r)] == Approx(before + cost));
    CHECK(host(xs[size_t(r)])[size_t(n - 1)] == 4.f);
  }
}

TEST_CASE("dist sim: bad input is a tpu::Error naming ranks, chips and shapes, and a missing rank times out") {
  auto g = dist::sim_pod_groups({2});
  // A tensor on another rank's chip.
  Tensor wrong = zeros(Shape{3}, TensorOptions(DType::f32, chip(1)));
  CHECK_THROWS_WITH(g[0]->all_reduce_async(wrong), Contains("is on sim:1 but rank 0 of the sim backend is chip sim:0"));
  // (rank 0 joined the header exchange marked bad: rank 1 fails at once naming it)
  Tensor ok1 = zeros(Shape{3}, TensorOptions(DType::f32, chip(1)));
  CHECK_THROWS_WITH(g[1]->all_reduce_async(ok1).wait(std::chrono::seconds(10)), Contains("rank(s) 0 passed invalid"));
  // Mismatched shapes and dtypes, with the header check and without it (the backend's check).
  for (bool check : {true, false}) {
    INFO("check " << check);
    auto h = dist::sim_pod_groups({2, std::chrono::milliseconds(0), check});
    std::vector<std::string> msg(2);
    on_ranks(2, [&](int r) {
      Tensor x = r == 0 ? zeros(Shape{2, 3}, TensorOptions(DType::f32, chip(0)))
                        : zeros(Shape{5}, TensorOptions(DType::bf16, chip(1)));
      try {
        h[size_t(r)]->all_reduce(x);
      } catch (const Error& e) {
        msg[size_t(r)] = e.what();
      }
    });
    for (const auto& m : msg) {
      CHECK_THAT(m, Contains("rank 0: ") && Contains("rank 1: ") && Contains("[2, 3]") && Contains("[5]"));
      CHECK_THAT(m, Contains("bf16"));
    }
    // The group stays usable after a disagreement.
    on_ranks(2, [&](int r) {
      Tensor x = full(Shape{2}, double(r + 1), TensorOptions(DType::f32, chip(r)));
      h[size_t(r)]->all_reduce(x);
      expect(host(x)[1] == 3.f, "1 + 2 after a disagreement");
    });
  }
  // A dtype the pod does not carry.
  std::vector<std::string> i64(2);
  on_ranks(2, [&](int r) {
    Tensor x = zeros(Shape{2}, TensorOptions(DType::i64, chip(r)));
    try {
      g[size_t(r)]->all_reduce(x);
    } catch (const Error& e) {
      i64[size_t(r)] = e.what();
    }
  });
  for (const auto& m : i64) CHECK_THAT(m, Contains("not i64"));
  // A rank that never calls in: the other fails within the timeout, and the group is broken.
  auto s = dist::sim_pod_groups({4, std::chrono::milliseconds(300)});
  std::vector<dist::Work> ws;
  std::vector<Tensor> xs;
  for (int r = 0; r < 3; ++r) {
    xs.push_back(zeros(Shape{4}, TensorOptions(DType::f32, chip(r))));
    ws.push_back(s[size_t(r)]->all_reduce_async(xs.back()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : ws) CHECK_THROWS_WITH(w.wait(std::chrono::seconds(20)), Contains("rank(s) 3 (chip(s) sim:3) did not call"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  Tensor late = zeros(Shape{4}, TensorOptions(DType::f32, chip(3)));
  CHECK_THROWS_WITH(s[3]->all_reduce_async(late).wait(std::chrono::seconds(5)), Contains("did not call"));
  // Work::wait's own timeout, and the blocking form on a thread that drives every rank.
  auto u = dist::sim_pod_groups({2, std::chrono::milliseconds(2000)});
  Tensor y = zeros(Shape{4}, TensorOptions(DType::f32, chip(0)));
  auto w = u[0]->all_reduce_async(y);
  CHECK_THROWS_WITH(w.wait(std::chrono::milliseconds(100)), Contains("did not complete within 100 ms"));
  Tensor y1 = zeros(Shape{4}, TensorOptions(DType::f32, chip(1)));
  u[1]->all_reduce(y1);  // rank 1 arrives: both finish
  w.wait(std::chrono::seconds(5));
  // The runtime stays usable: a fresh world works.
  auto fresh = dist::sim_pod_groups({2});
  on_ranks(2, [&](int r) {
    Tensor x = full(Shape{3}, 2.0, TensorOptions(DType::f32, chip(r)));
    fresh[size_t(r)]->all_reduce(x, ReduceOp::product);
    expect(host(x)[0] == 4.f, "2 * 2 on a fresh world");
  });
  CHECK_THROWS_WITH(dist::sim_pod_groups({5}), Contains("5 chips asked for but the pod 2x2 has 4"));
}

TEST_CASE("dist sim: send and recv between chips over the ICI, from one thread, any order") {
  auto g = dist::sim_pod_groups({4, std::chrono::milliseconds(2000)});
  for (DType t : {DType::f32, DType::bf16, DType::u8}) {
    INFO("dtype " << dtype_name(t));
    // 0 -> 3 (recv posted first), 2 -> 1 with a non-contiguous source and a host destination.
    Tensor a = make(values(t, 0, 7), Shape{7}, t, chip(0));
    Tensor a_in = empty(Shape{7}, TensorOptions(t, chip(3)));
    auto r1 = g[3]->recv_async(a_in, 0, 5);
    auto s1 = g[0]->send_async(a, 3, 5);
    Tensor b = make(values(t, 2, 12), Shape{3, 4}, t, chip(2)).t();
    Tensor b_in = empty(Shape{4, 3}, TensorOptions(t, Device()));
    auto s2 = g[2]->send_async(b, 1);
    auto r2 = g[1]->recv_async(b_in, 2);
    for (auto* w : {&r1, &s1, &s2, &r2}) w->wait(std::chrono::seconds(10));
    CHECK(host(a_in) == values(t, 0, 7));
    CHECK(host(b_in) == host(b));
  }
  // The transfer is charged on the ICI: the receiver's stream moves.
  Tensor big = full(Shape{64 * 1024}, 1.0, TensorOptions(DType::f32, chip(0)));
  Tensor into = empty(Shape{64 * 1024}, TensorOptions(DType::f32, chip(1)));
  device::sim_device(1).queue().synchronize();
  const double t0 = device::sim_device(1).queue().stream_time(device::kDefaultStream);
  auto s = g[0]->send_async(big, 1);
  g[1]->recv_async(into, 0).wait(std::chrono::seconds(10));
  s.wait(std::chrono::seconds(10));
  device::sim_device(1).queue().synchronize();
  CHECK(device::sim_device(1).queue().stream_time(device::kDefaultStream) > t0);
  CHECK(host(into)[100] == 1.f);
  // A receiver expecting another shape fails naming both; a recv nobody sends to times out.
  Tensor x = zeros(Shape{3}, TensorOptions(DType::f32, chip(0)));
  Tensor y = zeros(Shape{4}, TensorOptions(DType::f32, chip(1)));
  auto sx = g[0]->send_async(x, 1, 9);
  CHECK_THROWS_WITH(g[1]->recv_async(y, 0, 9).wait(std::chrono::seconds(10)), Contains("rank 0 sent") && Contains("[3]") && Contains("[4]"));
  sx.wait(std::chrono::seconds(10));
  Tensor z = zeros(Shape{3}, TensorOptions(DType::f32, chip(3)));
  CHECK_THROWS_WITH(g[3]->recv_async(z, 2, 1).wait(std::chrono::milliseconds(200)), Contains("not matched within 200 ms"));
}

TEST_CASE("dist sim: sim_new_group makes groups of some chips") {
  auto g = dist::sim_pod_groups({4, std::chrono::milliseconds(1000)});
  auto odd = dist::sim_new_group(g, {3, 1});
  REQUIRE(odd.size() == 2);
  CHECK(odd[0]->rank() == 0);
  CHECK(odd[1]->size() == 2);
  std::vector<float> got(2);
  on_ranks(2, [&](int i) {
    const int r = i == 0 ? 1 : 3;
    Tensor x = full(Shape{2}, double(r), TensorOptions(DType::f32, chip(r)));
    odd[size_t(i)]->all_reduce(x);
    got[size_t(i)] = host(x)[0];
  });
  CHECK(got[0] == 4.f);
  CHECK(got[1] == 4.f);
  // A group member's tensor must be on its own chip (world rank 3 = sim:3).
  CHECK_THROWS_WITH(odd[1]->all_reduce_async(zeros(Shape{1}, TensorOptions(DType::f32, chip(0)))),
                    Contains("chip sim:3"));
}
