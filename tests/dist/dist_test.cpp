// Multi-process tests of tpu::dist over gloo: each test starts 2-4 tpudist_worker processes on
// 127.0.0.1 (or through tpu-run), waits for them with a deadline (killing them past it) and
// checks their exit status and messages. The checks against the naive reference run inside
// the workers (worker_collectives.cpp).
#include "common/procs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

using test_procs::exit_code;
using test_procs::finish;
using test_procs::free_port;
using test_procs::Proc;
using test_procs::start;
fs::path scratch_dir() { return test_procs::scratch_dir("tpudist_test"); }

struct Job {
  Job(int ranks, std::string what, std::string arg = "", int timeout = 10000)
      : n(ranks), scenario(std::move(what)), extra_arg(std::move(arg)), timeout_ms(timeout) {}
  int n = 2;
  std::string scenario;
  std::string extra_arg;
  bool file_store = false;
  int timeout_ms = 10000;
  std::map<int, std::map<std::string, std::string>> env_per_rank;  // overrides
  std::vector<int> only_ranks;                                     // start only these ranks
};

std::vector<Proc> run(const Job& j, std::chrono::seconds deadline = std::chrono::seconds(120)) {
  fs::path dir = scratch_dir();
  int port = free_port();
  std::vector<Proc> ps;
  std::vector<fs::path> logs;
  for (int r = 0; r < j.n; ++r) {
    if (!j.only_ranks.empty() && std::find(j.only_ranks.begin(), j.only_ranks.end(), r) == j.only_ranks.end()) continue;
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(j.n)},
                                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                                              {"TPU_DIST_TIMEOUT_MS", std::to_string(j.timeout_ms)}};
    if (j.file_store) env["TPU_DIST_INIT_METHOD"] = "file://" + (dir / "store").string();
    if (j.env_per_rank.count(r))
      for (auto& [k, v] : j.env_per_rank.at(r)) env[k] = v;
    std::vector<std::string> argv = {TPU_DIST_WORKER, j.scenario};
    if (!j.extra_arg.empty()) argv.push_back(j.extra_arg);
    logs.push_back(dir / ("rank" + std::to_string(r) + ".log"));
    Proc p;
    p.pid = start(argv, env, logs.back());
    ps.push_back(p);
  }
  finish(ps, logs, deadline);
  return ps;
}

void require_all_ok(const std::vector<Proc>& ps) {
  for (size_t i = 0; i < ps.size(); ++i) {
    INFO("process " << i << " output:\n" << ps[i].out);
    CHECK(!ps[i].timed_out);
    CHECK(exit_code(ps[i]) == 0);
  }
}

}  // namespace

TEST_CASE("dist gloo: every collective, dtype and size on 2 ranks (TCP store)", "[dist]") {
  require_all_ok(run(Job(2, "collectives")));
}

TEST_CASE("dist gloo: every collective, dtype and size on 4 ranks (file store)", "[dist]") {
  require_all_ok(run([] { Job j(4, "collectives"); j.file_store = true; return j; }()));
}

TEST_CASE("dist gloo: collectives inside tpu::compile equal eager and a naive reference, 2 and 4 ranks", "[dist]") {
  require_all_ok(run(Job(2, "compiled")));
  require_all_ok(run(Job(4, "compiled")));
}

TEST_CASE("dist gloo: async work handles, wait timeouts and isend/irecv", "[dist]") {
  require_all_ok(run(Job(2, "async")));
}

TEST_CASE("dist gloo: new_group and a 2x2 DeviceMesh on 4 ranks", "[dist]") {
  require_all_ok(run(Job(4, "groups")));
}

TEST_CASE("dist gloo: mismatched shapes and dtypes name the ranks, the group stays usable", "[dist]") {
  auto ps = run(Job(2, "mismatch"));
  require_all_ok(ps);
  CHECK(ps[0].out.find("rank 0: all_reduce f32[4] sum; rank 1: all_reduce f32[5] sum") != std::string::npos);
}

TEST_CASE("dist gloo: on 4 ranks a disagreement fails at once on every rank, groups stay usable", "[dist]") {
  auto ps = run(Job(4, "mismatch4", "", 20000), std::chrono::seconds(90));
  require_all_ok(ps);
  CHECK(ps[0].out.find("rank 0: all_reduce f32[4000] sum; rank 1: all_reduce f32[4000] sum; rank 2: all_reduce "
                       "f32[6000] sum; rank 3: all_reduce f32[4000] sum") != std::string::npos);
}

TEST_CASE("ddp gloo: DistributedDataParallel on 2 and 4 ranks equals single-process training", "[dist]") {
  require_all_ok(run(Job(2, "ddp")));
  require_all_ok(run(Job(4, "ddp")));
}

TEST_CASE("dist gloo: bad arguments and sim tensors staged through the host", "[dist]") {
  require_all_ok(run(Job(2, "bad_args")));
}

TEST_CASE("dist gloo: a rank that dies makes the others fail within the timeout", "[dist]") {
  auto t0 = std::chrono::steady_clock::now();
  auto ps = run(Job(3, "die", "", 3000), std::chrono::seconds(60));
  CHECK(exit_code(ps[1]) == 7);
  for (int r : {0, 2}) {
    INFO("rank " << r << " output:\n" << ps[static_cast<size_t>(r)].out);
    CHECK(exit_code(ps[static_cast<size_t>(r)]) == 0);  // it caught the expected tpu::Error
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("dist gloo: all_to_all with uneven and empty splits equals a naive exchange on 2, 3, 4 and 8 ranks", "[dist]") {
  for (int n : {2, 3, 4, 8}) require_all_ok(run(Job(n, "a2a")));
}

TEST_CASE("dist gloo: a rank that dies before an uneven all_to_all makes the others fail within the timeout", "[dist]") {
  auto t0 = std::chrono::steady_clock::now();
  auto ps = run(Job(3, "die_a2a", "", 3000), std::chrono::seconds(60));
  CHECK(exit_code(ps[1]) == 7);
  for (int r : {0, 2}) {
    INFO("rank " << r << " output:\n" << ps[static_cast<size_t>(r)].out);
    CHECK(exit_code(ps[static_cast<size_t>(r)]) == 0);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("dist gloo: init errors are clear and bounded", "[dist]") {
  SECTION("a rank that never arrives") {
    Job j(2, "init_error", "ranks 1 of 2 never arrived", 1000);
    j.only_ranks = {0};
    auto ps = run(j, std::chrono::seconds(30));
    INFO(ps[0].out);
    CHECK(exit_code(ps[0]) == 0);
  }
  SECTION("ranks disagree on the world size") {
    Job j(2, "init_error", "wrong world size", 5000);
    j.env_per_rank[1] = {{"WORLD_SIZE", "3"}};
    require_all_ok(run(j, std::chrono::seconds(30)));
  }
  SECTION("the master port is in use") {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    ::listen(fd, 1);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    Job j(2, "init_error", "is in use", 1000);
    j.only_ranks = {0};
    j.env_per_rank[0] = {{"MASTER_PORT", std::to_string(ntohs(a.sin_port))}};
    auto ps = run(j, std::chrono::seconds(30));
    ::close(fd);
    INFO(ps[0].out);
    CHECK(exit_code(ps[0]) == 0);
  }
  SECTION("an unreachable master") {
    // A port held by a socket that is bound but not listening: connecting is refused, and no
    // other process (a concurrent test's ranks) can take the port while the rank tries it.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    Job j(2, "init_error", "could not reach the rendezvous store", 1000);
    j.only_ranks = {1};
    j.env_per_rank[1] = {{"MASTER_PORT", std::to_string(ntohs(a.sin_port))}};
    auto ps = run(j, std::chrono::seconds(30));
    ::close(fd);
    INFO(ps[0].out);
    CHECK(exit_code(ps[0]) == 0);
  }
  SECTION("a rank outside the world, and no RANK at all") {
    Job j(2, "init_error", "outside 0..1");
    j.only_ranks = {0};
    j.env_per_rank[0] = {{"RANK", "2"}};
    require_all_ok(run(j, std::chrono::seconds(30)));
    Job k(1, "init_error", "$RANK is not set");
    k.env_per_rank[0] = {{"RANK", ""}};
    require_all_ok(run(k, std::chrono::seconds(30)));
  }
}

TEST_CASE("tpu-run: starts the ranks, prefixes their output, and stops the job when a rank fails", "[dist]") {
  fs::path dir = scratch_dir();
  std::vector<fs::path> logs{dir / "ok.log"};
  std::vector<Proc> ok{{start({TPU_RUN_EXE, "-n", "2", "--hosts", "127.0.0.1,localhost", TPU_DIST_WORKER, "async"},
                              {}, logs[0]), -1, false, ""}};
  finish(ok, logs, std::chrono::seconds(60));
  INFO(ok[0].out);
  CHECK(exit_code(ok[0]) == 0);
  CHECK(ok[0].out.find("[0] rank done: async, 0 failures in ") != std::string::npos);
  CHECK(ok[0].out.find("[1] rank done: async, 0 failures in ") != std::string::npos);

  auto t0 = std::chrono::steady_clock::now();
  logs = {dir / "fail.log"};
  std::vector<Proc> bad{{start({TPU_RUN_EXE, "-n", "3", "--grace", "1", TPU_DIST_WORKER, "fail_rank", "1"}, {}, logs[0]),
                         -1, false, ""}};
  finish(bad, logs, std::chrono::seconds(60));
  INFO(bad[0].out);
  CHECK(exit_code(bad[0]) == 1);
  CHECK(bad[0].out.find("tpu-run: rank 1 exited with status 5; stopped the other ranks") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // the others sleep 30 s

  // SIGINT to tpu-run reaches every rank (which sleep 30 s otherwise).
  t0 = std::chrono::steady_clock::now();
  logs = {dir / "sigint.log"};
  std::vector<Proc> intr{{start({TPU_RUN_EXE, "-n", "2", TPU_DIST_WORKER, "fail_rank", "99"}, {}, logs[0]), -1, false, ""}};
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::kill(intr[0].pid, SIGINT);
  finish(intr, logs, std::chrono::seconds(30));
  INFO(intr[0].out);
  CHECK(exit_code(intr[0]) == 128 + SIGINT);
  CHECK(intr[0].out.find("tpu-run: stopped by signal") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}
