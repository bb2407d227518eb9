// The sharded-training test worker: one process = one rank, started by sharded_test.cpp with
// RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. argv[1] names the scenario; the exit status
// says whether every check passed (0) or not (1). Each rank checks its results against the
// one-process reference it computes itself.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model.h"

namespace sharded_test {
int scenario_fsdp_train(const std::string& opt_kind, bool mixed, bool prefetch);
int scenario_fsdp_ckpt_save(const std::string& dir);
int scenario_fsdp_ckpt_load(const std::string& dir, const std::string& from, const std::string& resave);
int scenario_fsdp_bad(const std::string& dir);
int scenario_fsdp_die();
int scenario_fsdp_compile();  // worker_fsdp_compile.cpp
int scenario_tp_train(int tp);
int scenario_tp_bad();
int scenario_tp_quant();  // worker_tp_quant.cpp
int scenario_tp_hub(int tp, bool sequence, bool tied, bool mla);  // worker_tp_hub.cpp
int scenario_hooks();                                   // worker_hooks.cpp
int scenario_ep_train(int ep, bool plan, bool compiled);  // worker_ep.cpp
int scenario_ep_tp_train(int ep);                       // worker_ep.cpp
}  // namespace sharded_test

using namespace sharded_test;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tpusharded_worker <scenario> [args]\n");
    return 64;
  }
  const std::string s = argv[1];
  auto arg = [&](int i, const char* dflt) { return std::string(argc > i ? argv[i] : dflt); };
  try {
    tpu::dist::init_process_group();
    int rc = 64;
    if (s == "fsdp_train") rc = scenario_fsdp_train(arg(2, "adamw"), arg(3, "0") == "1", arg(4, "1") == "1");
    else if (s == "fsdp_ckpt_save") rc = scenario_fsdp_ckpt_save(arg(2, "."));
    else if (s == "fsdp_ckpt_load") rc = scenario_fsdp_ckpt_load(arg(2, "."), arg(3, "sharded"), arg(4, ""));
    else if (s == "fsdp_bad") rc = scenario_fsdp_bad(arg(2, "."));
    else if (s == "fsdp_die") rc = scenario_fsdp_die();
    else if (s == "fsdp_compile") rc = scenario_fsdp_compile();
    else if (s == "tp_train") rc = scenario_tp_train(std::atoi(arg(2, "2").c_str()));
    else if (s == "tp_bad") rc = scenario_tp_bad();
    else if (s == "tp_quant") rc = scenario_tp_quant();
    else if (s == "tp_hub") rc = scenario_tp_hub(std::atoi(arg(2, "2").c_str()), arg(3, "0") == "1", arg(4, "0") == "1",
                                                 arg(5, "0") == "1");
    else if (s == "hooks") rc = scenario_hooks();
    else if (s == "ep_tp_train") rc = scenario_ep_tp_train(std::atoi(arg(2, "2").c_str()));
    else if (s == "ep_train") rc = scenario_ep_train(std::atoi(arg(2, "2").c_str()), arg(3, "0") == "1", arg(4, "0") == "1");
    tpu::dist::destroy_process_group();
    std::printf("rank done: %s, %d failures in %d checks\n", s.c_str(), g_failures, g_checks);
    return rc != 0 ? rc : (g_failures ? 1 : 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uncaught: %s\n", e.what());
    return 10;
  }
}
