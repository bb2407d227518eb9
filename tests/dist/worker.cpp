// The tpu::dist test worker: one process = one rank. The Catch2 tests (dist_test.cpp) and
// tpu-run start several with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (or
// TPU_DIST_INIT_METHOD) set; the scenario named by argv[1] runs and the exit status says
// whether every check passed (0) or not (1). Fault scenarios print "ERROR: <message>" for the
// tpu::Error they expect, so that the test can check its wording.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "worker_common.h"

namespace dist_test {
int scenario_collectives();
int scenario_ddp();
int scenario_compiled();  // worker_compile.cpp
int scenario_a2a();       // worker_a2a.cpp
int scenario_die_a2a();
}

using namespace dist_test;
using tpu::dist::ReduceOp;

namespace {

int scenario_async() {
  int rank = tpu::dist::get_rank(), n = tpu::dist::get_world_size();
  // Several collectives in flight at once; waited in reverse order.
  std::vector<Tensor> ts;
  std::vector<tpu::dist::Work> ws;
  for (int j = 0; j < 4; ++j) {
    ts.push_back(make(DType::f32, Shape{4, 9}, [&](int64_t i) { return value(rank, i, j, DType::f32); }, true));
    ws.push_back(tpu::dist::all_reduce_async(ts.back(), ReduceOp::sum));
  }
  for (int j = 3; j >= 0; --j) {
    ws[static_cast<size_t>(j)].wait(std::chrono::seconds(20));
    check(ws[static_cast<size_t>(j)].is_completed(), "is_completed after wait");
    expect(ts[static_cast<size_t>(j)], [&](int64_t i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += value(r, i, j, DType::f32);
      return s;
    }, "async all_reduce " + std::to_string(j));
  }
  // A wait with a timeout that expires: rank 0 enters the barrier late.
  if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto w = tpu::dist::world()->barrier_async();
  if (rank != 0) {
    bool timed_out = false;
    try {
      w.wait(std::chrono::milliseconds(50));
    } catch (const tpu::Error& e) {
      timed_out = std::strstr(e.what(), "did not complete within 50 ms") != nullptr;
    }
    check(timed_out, "wait(50 ms) on a barrier rank 0 joins after 600 ms times out");
  }
  w.wait();
  // Isend/irecv both ways before any wait cannot deadlock.
  int peer = rank ^ 1;
  if (peer < n) {
    Tensor a = make(DType::i32, Shape{5}, [&](int64_t i) { return rank * 10 + i; }, false);
    Tensor b = tpu::zeros(Shape{5}, tpu::TensorOptions(DType::i32));
    auto s = tpu::dist::world()->send_async(a, peer);
    auto r = tpu::dist::world()->recv_async(b, peer);
    r.wait();
    s.wait();
    expect(b, [&](int64_t i) { return peer * 10 + i; }, "isend/irecv exchange");
  }
  return 0;
}

int scenario_groups() {  // 4 ranks
  int rank = tpu::dist::get_rank();
  auto evens = tpu::dist::new_group({0, 2});
  auto odds = tpu::dist::new_group({3, 1});
  auto& mine = rank % 2 == 0 ? evens : odds;
  check(mine->is_member() && !(rank % 2 == 0 ? odds : evens)->is_member(), "group membership");
  Tensor t = make(DType::f32, Shape{3}, [&](int64_t i) { return rank + i; }, false);
  tpu::dist::all_reduce(t, ReduceOp::sum, mine);
  int a = rank % 2, b = a + 2;  // the two world ranks of my group
  expect(t, [&](int64_t i) { return a + b + 2 * i; }, "all_reduce on a sub-group");
  check(expect_error([&] { (rank % 2 == 0 ? odds : evens)->barrier(); }, "not a member") == 0, "non-member call");
  tpu::dist::DeviceMesh mesh({2, 2}, {"dp", "tp"});
  auto c = mesh.coordinate();
  check(c[0] == rank / 2 && c[1] == rank % 2, "mesh coordinate");
  Tensor x = tpu::full(Shape{2}, static_cast<double>(rank), tpu::TensorOptions(DType::f32));
  tpu::dist::all_reduce(x, ReduceOp::sum, mesh.group("tp"));  // ranks {2c0, 2c0+1}
  expect(x, [&](int64_t) { return 4 * c[0] + 1; }, "mesh tp all_reduce");
  Tensor y = tpu::full(Shape{2}, static_cast<double>(rank), tpu::TensorOptions(DType::f32));
  tpu::dist::all_reduce(y, ReduceOp::max, mesh.group("dp"));  // ranks {c1, c1+2}
  expect(y, [&](int64_t) { return c[1] + 2; }, "mesh dp all_reduce");
  check(expect_error([&] { (void)mesh.group("pp"); }, "no axis 'pp'") == 0, "unknown mesh axis");
  return 0;
}

int scenario_mismatch() {  // ranks pass different shapes, then dtypes; the group stays usable
  int rank = tpu::dist::get_rank();
  Tensor t = tpu::zeros(Shape{rank == 1 ? 5 : 4}, tpu::TensorOptions(DType::f32));
  int rc = expect_error([&] { tpu::dist::all_reduce(t); }, "rank 1: all_reduce f32[5] sum");
  Tensor u = tpu::zeros(Shape{4}, tpu::TensorOptions(rank == 0 ? DType::i32 : DType::f32));
  rc |= expect_error([&] { tpu::dist::all_reduce(u); }, "rank 0: all_reduce i32[4] sum");
  // Invalid arguments on one rank: the others fail at once instead of waiting.
  Tensor v = tpu::zeros(Shape{4}, tpu::TensorOptions(DType::i32));
  rc |= expect_error([&] { tpu::dist::all_reduce(v, rank == 0 ? ReduceOp::avg : ReduceOp::sum); },
                     rank == 0 ? "avg needs a floating dtype" : "rank(s) 0 passed invalid arguments");
  Tensor w = tpu::ones(Shape{4}, tpu::TensorOptions(DType::f32));
  tpu::dist::all_reduce(w);
  expect(w, [&](int64_t) { return tpu::dist::get_world_size(); }, "all_reduce after the errors");
  return rc;
}

// 4 ranks, the header check riding along with the collective: one rank in the middle of the
// ring disagrees (its neighbours' data never matches its own), then a broadcast with two roots,
// then a subgroup; each error must come at once (well inside the 20 s timeout) and the groups
// must stay usable.
int scenario_mismatch4() {
  int rank = tpu::dist::get_rank(), n = tpu::dist::get_world_size();
  using clock = std::chrono::steady_clock;
  auto fast = [&](const std::function<void()>& f, const char* must_contain) {
    auto t0 = clock::now();
    int rc = expect_error(f, must_contain);
    check(clock::now() - t0 < std::chrono::seconds(5), std::string("error came quickly: ") + must_contain);
    return rc;
  };
  Tensor t = tpu::zeros(Shape{rank == 2 ? 6000 : 4000}, tpu::TensorOptions(DType::f32));
  int rc = fast([&] { tpu::dist::all_reduce(t); }, "rank 2: all_reduce f32[6000] sum");
  Tensor b = tpu::full(Shape{3}, static_cast<double>(rank), tpu::TensorOptions(DType::f32));
  rc |= fast([&] { tpu::dist::broadcast(b, rank == 3 ? 1 : 0); }, "rank 3: broadcast f32[3] from rank 1");
  auto odd = tpu::dist::new_group({1, 3});
  if (odd->is_member()) {
    Tensor x = tpu::ones(Shape{5}, tpu::TensorOptions(rank == 1 ? DType::f32 : DType::i32));
    rc |= fast([&] { odd->all_reduce(x); }, "rank 1: all_reduce i32[5] sum");
    Tensor y = tpu::full(Shape{7}, static_cast<double>(rank), tpu::TensorOptions(DType::f32));
    odd->all_reduce(y);
    expect(y, [](int64_t) { return 4; }, "subgroup all_reduce after its error");
  }
  for (int64_t size : {int64_t{5}, int64_t{1} << 18}) {  // small, and large enough for Gloo's segments
    Tensor w = make(DType::f32, Shape{size}, [&](int64_t i) { return value(rank, i, 3, DType::f32); }, false);
    tpu::dist::all_reduce(w);
    expect(w, [&](int64_t i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += value(r, i, 3, DType::f32);
      return s;
    }, "all_reduce after the errors");
  }
  return rc;
}

int scenario_bad_args() {  // local argument errors (every rank makes the same mistake)
  int n = tpu::dist::get_world_size();
  Tensor a = tpu::zeros(Shape{4}, tpu::TensorOptions(DType::f32));
  Tensor s = tpu::zeros(Shape{4}, tpu::TensorOptions(DType::f32, tpu::Device("sim:0")));
  int rc = expect_error([&] { tpu::dist::all_gather_into_tensor(s.reshape(Shape{4}), a); }, "share a device");
  rc |= expect_error([&] { tpu::dist::all_gather_into_tensor(tpu::zeros(Shape{4}), a); }, "needs [");
  rc |= expect_error([&] { tpu::dist::broadcast(a, n); }, "not a rank of this group");
  rc |= expect_error([&] { tpu::dist::send(a, tpu::dist::get_rank()); }, "not another rank");
  rc |= expect_error([&] { tpu::dist::init_process_group(); }, "already initialized");
  rc |= expect_error([&] { tpu::dist::new_group({0, 0}); }, "repeats a rank");
  // A sim tensor is staged through the host: all_reduce on sim:0 works.
  Tensor x = make(DType::f32, Shape{3, 4}, [&](int64_t i) { return value(tpu::dist::get_rank(), i, 9, DType::f32); },
                  false, tpu::Device("sim:0"));
  tpu::dist::all_reduce(x);
  check(x.device() == tpu::Device("sim:0"), "result stays on sim:0");
  expect(x, [&](int64_t i) {
    double s2 = 0;
    for (int r = 0; r < n; ++r) s2 += value(r, i, 9, DType::f32);
    return s2;
  }, "all_reduce of a sim:0 tensor");
  return rc;
}

int scenario_die() {  // rank 1 dies before the collective; the others must fail, not hang
  tpu::dist::barrier();  // every rank is past the rendezvous
  if (tpu::dist::get_rank() == 1) _exit(7);
  Tensor t = tpu::ones(Shape{1 << 16}, tpu::TensorOptions(DType::f32));
  int rc = expect_error([&] {
    for (int i = 0; i < 100; ++i) tpu::dist::all_reduce(t);  // bounded
  }, "tpu::dist all_reduce");
  // Later calls fail at once, naming the first failure.
  rc |= expect_error([&] { tpu::dist::barrier(); }, "broken");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tpudist_worker <scenario>\n");
    return 64;
  }
  std::string s = argv[1];
  try {
    if (s == "init_error") {  // the init itself must fail (absent ranks, wrong world size, ...)
      return expect_error([] { tpu::dist::init_process_group(); }, argc > 2 ? argv[2] : "");
    }
    tpu::dist::init_process_group();
    int rc = 64;
    if (s == "collectives") rc = scenario_collectives();
    else if (s == "async") rc = scenario_async();
    else if (s == "groups") rc = scenario_groups();
    else if (s == "mismatch") rc = scenario_mismatch();
    else if (s == "bad_args") rc = scenario_bad_args();
    else if (s == "mismatch4") rc = scenario_mismatch4();
    else if (s == "ddp") rc = scenario_ddp();
    else if (s == "die") rc = scenario_die();
    else if (s == "compiled") rc = scenario_compiled();
    else if (s == "a2a") rc = scenario_a2a();
    else if (s == "die_a2a") rc = scenario_die_a2a();
    else if (s == "fail_rank") {  // for tpu-run: the named rank exits with status 5
      if (tpu::dist::get_rank() == (argc > 2 ? std::atoi(argv[2]) : 1)) return 5;
      std::this_thread::sleep_for(std::chrono::seconds(30));
      rc = 0;
    }
    if (s != "die" && s != "die_a2a") tpu::dist::destroy_process_group();
    std::printf("rank done: %s, %d failures in %d checks\n", s.c_str(), g_failures, g_checks);
    return rc != 0 ? rc : (g_failures ? 1 : 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uncaught: %s\n", e.what());
    return 10;
  }
}
