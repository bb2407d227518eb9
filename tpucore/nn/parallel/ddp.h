// Data-parallel training over tpu::dist (as torch.nn.parallel.DistributedDataParallel).
//
//   auto model = std::make_shared<tpu::nn::MLP>(...);        // same architecture on every rank
//   tpu::nn::parallel::DistributedDataParallel ddp(model);             // broadcasts rank 0's parameters
//   optim::AdamW opt(model->parameters(), {...});
//   for (auto& [x, y] : loader) {                             // each rank its own shard
//     opt.zero_grad();
//     tpu::nn::cross_entropy(ddp.forward(x), y).backward();   // .grad() is averaged over ranks
//     opt.step();
//   }
//
// Gradients are averaged in buckets while backward runs: every parameter gets a
// post-accumulate-grad hook (tpucore/autograd.h); when backward has finished a parameter, its
// gradient is copied into its bucket (parameters in reverse registration order, about the order
// backward produces them, buckets of up to bucket_cap_bytes of one dtype and device), and a full
// bucket starts an asynchronous all_reduce(avg) at once, so communication overlaps the rest of
// backward. Buckets start in the same order on every rank (a ready bucket waits for the ones
// before it). The last parameter's hook waits for every bucket and writes the averages back into
// the .grad() tensors, so backward() returns with synchronized gradients.
//
// no_sync(): within its scope backward only accumulates locally (gradient accumulation); the first
// synchronized backward after it averages the accumulated gradients.
// Parameters that a forward pass does not use: with find_unused_parameters, forward() walks the
// output's graph and hands their current gradient (zeros if none) to their buckets at once;
// without it, the next forward() is a tpu::Error naming the parameters that got no gradient.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tpucore/dist.h"
#include "tpucore/nn/module.h"

namespace tpu::nn::parallel {

struct DDPOptions {
  dist::ProcessGroupPtr group;             // null: the default group (the world)
  int64_t bucket_cap_bytes = 1 << 20;      // torch's default is 25 MB; small models here
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;           // buffers too, from rank 0 at construction
};

class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's forward; checks that the previous synchronized backward completed.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // For modules with other forward signatures: call before the forward (prepare) and after it
  // with the output (for find_unused_parameters).
  void prepare_forward();
  void finish_forward(const Tensor& output);

  Module& module() const { return *module_; }
  const std::shared_ptr<Module>& module_ptr() const { return module_; }
  const dist::ProcessGroupPtr& group() const { return group_; }

  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d) : d_(d), prev_(d.sync_) { d_.sync_ = false; }
    ~NoSync() { d_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
   private:
    DistributedDataParallel& d_;
    bool prev_;
  };
  // Within the returned guard's lifetime backward does not communicate.
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  struct Stats {
    int64_t buckets = 0;                  // bucket count
    int64_t synced_backwards = 0;         // backward passes whose gradients were averaged
    int64_t overlapped_buckets = 0;       // buckets (of the last sync) started while backward still ran
  };
  const Stats& stats() const { return stats_; }
  // Bucket b's parameter names (for tests and debugging).
  std::vector<std::string> bucket_parameters(int64_t b) const;

 private:
  struct Bucket;
  struct Param;
  void on_grad(size_t i, const Tensor& grad);
  void mark_ready(size_t i, const Tensor& grad);
  void launch_ready();
  void finish_sync();
  void reset_pass();

  std::shared_ptr<Module> module_;
  dist::ProcessGroupPtr group_;
  DDPOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  int64_t ready_params_ = 0;
  bool in_pass_ = false;  // some gradient of a synchronized pass has arrived
  bool sync_ = true;
  Stats stats_;
};

}  // namespace tpu::nn::parallel
