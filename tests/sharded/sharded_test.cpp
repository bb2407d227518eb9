// Multi-process tests of fully_shard and tensor parallelism over gloo: each test starts 1-4
// tpusharded_worker processes on 127.0.0.1, waits for them with a deadline (killing them past
// it) and checks their exit status. The comparisons with the one-process reference run inside
// the workers (worker_fsdp.cpp, worker_tp.cpp).
#include "common/procs.h"

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

using Rank = test_procs::Proc;

// Starts `world` workers with the scenario's arguments, waits until all exit or the deadline
// passes (then kills the rest), and returns them with their output.
std::vector<Rank> run(int world, const std::vector<std::string>& args, std::chrono::seconds deadline = std::chrono::seconds(150)) {
  fs::path logs = test_procs::scratch_dir("tpusharded_test");
  const int port = test_procs::free_port();
  std::vector<Rank> ranks(static_cast<size_t>(world));
  std::vector<fs::path> files;
  std::vector<std::string> argv = {TPU_SHARDED_WORKER};
  argv.insert(argv.end(), args.begin(), args.end());
  for (int r = 0; r < world; ++r) {
    files.push_back(logs / ("rank" + std::to_string(r) + ".log"));
    ranks[static_cast<size_t>(r)].pid = test_procs::start(
        argv,
        {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)}, {"MASTER_ADDR", "127.0.0.1"},
         {"MASTER_PORT", std::to_string(port)}, {"TPU_DIST_TIMEOUT_MS", "20000"}},
        files.back());
  }
  test_procs::finish(ranks, files, deadline);
  fs::remove_all(logs);
  return ranks;
}

void require_ok(const std::vector<Rank>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r << " output:\n" << ranks[r].out);
    CHECK(!ranks[r].timed_out);
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

TEST_CASE("fsdp inside tpu::compile: a compiled AdamW step on 2 ranks equals eager FSDP and one-process training", "[sharded]") {
  require_ok(run(2, {"fsdp_compile"}));
}

TEST_CASE("fsdp: checkpoint saved on 4 ranks loads on 2 and on 1 (and 2 -> 4), consolidated file, bad files", "[sharded]") {
  fs::path dir = test_procs::scratch_dir("tpusharded_test");
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

TEST_CASE("tp: int8, int4 and fp8 QuantizedLinear split column- and row-wise on 2 ranks equal the unsharded layers", "[sharded]") {
  require_ok(run(2, {"tp_quant"}));
}

TEST_CASE("tp: a plan applied to a Qwen3-shaped CausalLM on 2 ranks equals one-process training", "[sharded]") {
  require_ok(run(2, {"tp_hub", "2", "0", "0"}));
}

TEST_CASE("tp: the plan splits a DeepSeek-V3-shaped CausalLM's latent attention over heads on 2 ranks", "[sharded]") {
  require_ok(run(2, {"tp_hub", "2", "0", "0", "1"}));
}

TEST_CASE("tp: sequence parallelism on a Qwen3-shaped CausalLM with tied embeddings, 2 ranks", "[sharded]") {
  require_ok(run(2, {"tp_hub", "2", "1", "1"}));
}

TEST_CASE("tp: FSDP over dp x a tensor-parallel plan over tp on a Qwen3-shaped CausalLM, 2x2 mesh", "[sharded]") {
  require_ok(run(4, {"tp_hub", "2", "1", "0"}));
}

TEST_CASE("hooks: module forward hooks, fully_shard through them, plan errors (1 rank)", "[sharded]") {
  require_ok(run(1, {"hooks"}));
}

TEST_CASE("expert parallelism x fsdp: a qwen3_moe model on a 2x2 mesh trains as in one process", "[sharded]") {
  require_ok(run(4, {"ep_train", "2"}));
}

TEST_CASE("expert parallelism alone (the ExpertParallel style of a plan): a qwen3_moe model on 2 ranks trains as in one process", "[sharded]") {
  require_ok(run(2, {"ep_train", "2", "1"}));
}

TEST_CASE("expert parallelism inside tpu::compile: the whole AdamW step on 2 ranks trains as in one process, one compile", "[sharded]") {
  require_ok(run(2, {"ep_train", "2", "0", "1"}));
}

TEST_CASE("expert parallelism x tensor parallelism: experts over ep, attention and dense MLP over tp, 2x2 mesh", "[sharded]") {
  require_ok(run(4, {"ep_tp_train", "2"}));
}
