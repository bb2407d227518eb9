// fully_shard on the sim backend of tpu::dist: four ranks = the four chips of a 2x2 pod of tiny
// chips (TPU_SIM_POD=2x2, TPU_SIM_CHIP=tiny as the other pod tests), one thread per rank, the
// model's shards in each chip's HBM. Compared with the same model trained on the host in one
// process on the whole batch.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <thread>

#include "sharded/model.h"
#include "pod/pod_testing.h"
#include "tpucore/devices.h"
#include "tpucore/nn/parallel/fsdp.h"

using namespace sharded_test;

namespace {

const bool g_env = [] {
  setenv("TPU_SIM_CHIP", "tiny", 0);
  setenv("TPU_SIM_POD", "2x2", 0);
  return true;
}();

}  // namespace

TEST_CASE("fsdp on a simulated 4-chip pod equals one-device training", "[pod][sharded]") {
  (void)g_env;
  // The reference trains in f32 on the host: the chips' f32 matmuls take f32-accurate products
  // here (the default, one bf16 pass, differs from it by ~2e-4 in the loss).
  pod_testing::HighestF32Precision precision;
  Config c;
  c.layers = 1;
  const int world = 4, steps = 2;
  // The reference: one model on the host, the whole batch, SGD.
  std::vector<double> ref_loss;
  auto ref = std::make_shared<TinyLM>(c);
  {
    optim::SGD opt(ref->parameters(), optim::SGDOptions{0.2, 0.9});
    for (int s = 0; s < steps; ++s) {
      Tensor tok = batch_tokens(s, kBatch, kSeq, c.vocab);
      Tensor loss = lm_loss(ref->forward(narrow(tok, 1, 0, kSeq).contiguous()), narrow(tok, 1, 1, kSeq).contiguous());
      loss.backward();
      ref_loss.push_back(loss.item<double>());
      opt.step();
      opt.zero_grad();
    }
  }
  auto pg = dist::sim_pod_groups({world});
  std::vector<std::vector<double>> losses(world);
  std::vector<nn::StateDict> finals(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        const Device chip(DeviceType::sim, r);
        auto model = std::make_shared<TinyLM>(c);
        model->to(chip);
        for (auto& b : model->blocks) b = nn::parallel::fully_shard(b, pg[static_cast<size_t>(r)]);
        auto root = nn::parallel::fully_shard(model, pg[static_cast<size_t>(r)]);
        optim::SGD opt(root->parameters(), optim::SGDOptions{0.2, 0.9});
        for (int s = 0; s < steps; ++s) {
          Tensor tok = narrow(batch_tokens(s, kBatch, kSeq, c.vocab), 0, r, 1);
          Tensor loss = lm_loss(root->forward(narrow(tok, 1, 0, kSeq).contiguous().to(chip)),
                                narrow(tok, 1, 1, kSeq).contiguous().to(chip));
          loss.backward();
          losses[static_cast<size_t>(r)].push_back(loss.to(Device()).item<double>());
          opt.step();
          opt.zero_grad();
        }
        finals[static_cast<size_t>(r)] = root->full_state_dict();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<size_t>(r)].empty());
  }
  for (int s = 0; s < steps; ++s) {
    double avg = 0;
    for (int r = 0; r < world; ++r) avg += losses[static_cast<size_t>(r)][static_cast<size_t>(s)] / world;
    INFO("step " << s);
    CHECK(std::fabs(avg - ref_loss[static_cast<size_t>(s)]) < 1e-4);
  }
  for (auto& [n, p] : ref->named_parameters()) {
    INFO(n);
    for (int r = 0; r < world; ++r) {
      REQUIRE(finals[static_cast<size_t>(r)].count(n));
      CHECK(max_abs_diff(finals[static_cast<size_t>(r)].at(n).to(Device()), p) < 1e-4);
    }
  }
}
