// Starting and reaping worker processes in multi-process tests (tpu::dist over gloo, sharded
// training): a free loopback port, a scratch folder, spawning a worker with its environment and
// its output in a file, and waiting for a set of workers until a deadline (killing the rest, so
// a hang fails the test instead of stalling it). Every loop is bounded by the deadline.
#pragma once

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
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace test_procs {

namespace fs = std::filesystem;

// A port on 127.0.0.1 that was free a moment ago.
inline int free_port() {
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

// A new empty folder under the temp directory, named after `prefix`, this process and a count.
inline fs::path scratch_dir(const std::string& prefix) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

struct Proc {
  pid_t pid = -1;
  int status = -1;  // raw wait status; -1 while running or when killed at the deadline
  bool timed_out = false;
  std::string out;
};

// Runs argv with `env` added to this process's environment (minus the rendezvous variables
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TPU_DIST_*, which only `env` sets); stdout and
// stderr go to `log`.
inline pid_t start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                   const fs::path& log) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string k = kv.substr(0, kv.find('='));
    if (!env.count(k) && k != "RANK" && k != "WORLD_SIZE" && k != "MASTER_ADDR" && k != "MASTER_PORT" &&
        k.rfind("TPU_DIST_", 0) != 0)
      envs.push_back(kv);
  }
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (auto& s : envs) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

// Waits for every process until the deadline, then kills the rest; reads each one's log.
inline void finish(std::vector<Proc>& ps, const std::vector<fs::path>& logs, std::chrono::seconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {  // bounded by the deadline
    bool running = false;
    for (auto& p : ps) {
      if (p.status != -1 || p.timed_out) continue;
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) p.status = st;
      else running = true;
    }
    if (!running) break;
    if (std::chrono::steady_clock::now() >= end) {
      for (auto& p : ps)
        if (p.status == -1) {
          ::kill(p.pid, SIGKILL);
          ::waitpid(p.pid, nullptr, 0);
          p.timed_out = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    std::ifstream f(logs[i]);
    std::stringstream ss;
    ss << f.rdbuf();
    ps[i].out = ss.str();
  }
}

inline int exit_code(const Proc& p) { return (!p.timed_out && WIFEXITED(p.status)) ? WEXITSTATUS(p.status) : -1; }

}  // namespace test_procs
