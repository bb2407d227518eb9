// Multi-process tests of fully_shard and tensor parallelism over gloo: each test starts 1-4
// tpusharded_worker processes on 127.0.0.1, waits for them with a deadline (killing them past
// it) and checks their exit status. The comparisons with the one-process reference run inside
// the workers (worker_fsdp.cpp, worker_tp.cpp).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

fs::path scratch_dir() {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / ("tpusharded_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

struct Rank {
  pid_t pid = -1;
  int status = -1;
  bool killed = false;
  std::string out;
};

// Starts `world` workers with the scenario's arguments, waits until all exit or the deadline
// passes (then kills the rest), and returns them with their output.
std::vector<Rank> run(int world, const std::vector<std::string>& args, std::chrono::seconds deadline = std::chrono::seconds(150)) {
  fs::path logs = scratch_dir();
  const int port = free_port();
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e, k = kv.substr(0, kv.find('='));
      if (k != "RANK" && k != "WORLD_SIZE" && k != "MASTER_ADDR" && k != "MASTER_PORT" && k.rfind("TPU_DIST_", 0) != 0)
        env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("TPU_DIST_TIMEOUT_MS=20000");
    std::vector<std::string> argv = {TPU_SHARDED_WORKER};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
    e.push_back(nullptr);
    const std::string log = (logs / ("rank" + std::to_string(r) + ".log")).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&ranks[static_cast<size_t>(r)].pid, a[0], &fa, nullptr, a.data(), e.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
  }
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {  // bounded by the deadline
    bool running = false;
    for (auto& p : ranks) {
      if (p.status != -1 || p.killed) continue;
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) p.status = st;
      else running = true;
    }
    if (!running) break;
    if (std::chrono::steady_clock::now() >= end) {
      for (auto& p : ranks)
        if (p.status == -1 && !p.killed) {
          ::kill(p.pid, SIGKILL);
          ::waitpid(p.pid, nullptr, 0);
          p.killed = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(logs / ("rank" + std::to_string(r) + ".log"));
    std::stringstream ss;
    ss << f.rdbuf();
    ranks[static_cast<size_t>(r)].out = ss.str();
  }
  fs::remove_all(logs);
  return ranks;
}

void require_ok(const std::vector<Rank>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r << " output:\n" << ranks[r].out);
    CHECK(!ranks[r].killed);
    CHECK(WIFEXITED(ranks[r].status));
    CHECK(WEXITSTATUS(ranks[r].status) == 0);
    CHECK(ranks[r].out.find("0 failures") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("fsdp: AdamW training on 2 ranks equals one-process training (loss, grads, weights)", "[sharded]") {
  require_ok(run(2, {"fsdp_train", "adamw", "0", "1"}));
}

TEST_CASE("fsdp: SGD training on 4 ranks equals one-process training, without prefetch", "[sharded]") {
  require_ok(run(4, {"fsdp_train", "sgd", "0", "0"}));
}

TEST_CASE("fsdp: mixed precision (bf16 compute, f32 master and reduction) on 2 ranks", "[sharded]") {
  require_ok(run(2, {"fsdp_train", "sgd", "1", "1"}));
}

TEST_CASE("fsdp: checkpoint saved on 4 ranks loads on 2 and on 1 (and 2 -> 4), consolidated file, bad files", "[sharded]") {
  fs::path dir = scratch_dir();
  require_ok(run(4, {"fsdp_ckpt_save", dir.string()}));
  require_ok(run(2, {"fsdp_ckpt_load", dir.string(), "sharded", "sharded2"}));
  require_ok(run(1, {"fsdp_ckpt_load", dir.string()}));
  require_ok(run(4, {"fsdp_ckpt_load", dir.string(), "sharded2"}));
  require_ok(run(2, {"fsdp_bad", dir.string()}));
  fs::remove_all(dir);
}

TEST_CASE("fsdp: a rank dying mid-step makes the other fail with a tpu::Error, not hang", "[sharded]") {
  const auto t0 = std::chrono::steady_clock::now();
  auto ranks = run(2, {"fsdp_die"}, std::chrono::seconds(90));
  INFO("rank 0 output:\n" << ranks[0].out);
  CHECK(WIFEXITED(ranks[1].status));
  CHECK(WEXITSTATUS(ranks[1].status) == 7);
  CHECK(WIFEXITED(ranks[0].status));
  CHECK(WEXITSTATUS(ranks[0].status) == 0);
  CHECK(ranks[0].out.find("rank 0 caught the error") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
}

TEST_CASE("tp: tensor-parallel transformer on 2 ranks equals one-process training", "[sharded]") {
  require_ok(run(2, {"tp_train", "2"}));
}

TEST_CASE("tp: 2-D mesh, FSDP over dp x tensor parallel over tp on 4 ranks", "[sharded]") {
  require_ok(run(4, {"tp_train", "2"}));
}

TEST_CASE("tp: bad shapes and targets are errors, the layers stay usable", "[sharded]") {
  require_ok(run(2, {"tp_bad"}));
}
