// DistributedDataParallel: bucketed gradient averaging driven by post-accumulate-grad hooks.
#include "tpucore/nn/parallel/ddp.h"

#include <fmt/ranges.h>

#include "tpucore/autograd.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel {

struct DistributedDataParallel::Param {
  std::string name;
  Tensor t;
  int hook = 0;
  size_t bucket = 0;
  int64_t offset = 0;
  bool ready = false;
  Tensor grad;  // the .grad() tensor handed to the hook in this pass
};

struct DistributedDataParallel::Bucket {
  Tensor flat;                 // the bucket's gradients, back to back
  std::vector<size_t> params;  // indices into params_
  int64_t pending = 0;         // parameters not ready yet in this pass
  dist::Work work;
  bool launched = false;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module, DDPOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  if (!module_) fail("DistributedDataParallel: the module is null");
  if (options_.bucket_cap_bytes < 1)
    fail("DistributedDataParallel: bucket_cap_bytes {} must be positive", options_.bucket_cap_bytes);
  group_ = options_.group ? options_.group : dist::world();
  if (!group_->is_member()) fail("DistributedDataParallel: this rank is not a member of the group");
  // Every rank starts from rank 0's parameters and buffers.
  for (auto& [name, p] : module_->named_parameters()) {
    group_->broadcast(p.detach(), 0);
    if (!p.requires_grad()) continue;
    Param q;
    q.name = name;
    q.t = p;
    params_.push_back(std::move(q));
  }
  if (options_.broadcast_buffers)
    for (auto& [name, b] : module_->named_buffers()) group_->broadcast(b, 0);
  if (params_.empty()) fail("DistributedDataParallel: the module has no parameter that requires grad");
  // Buckets over the parameters in reverse order (about the order backward finishes them).
  for (size_t k = params_.size(); k-- > 0;) {
    Param& p = params_[k];
    if (!is_floating(p.t.dtype()))
      fail("DistributedDataParallel: parameter '{}' is {}; gradients are averaged, so they must be floating", p.name,
           dtype_name(p.t.dtype()));
    const int64_t bytes = p.t.numel() * static_cast<int64_t>(dtype_size(p.t.dtype()));
    bool fresh = buckets_.empty();
    if (!fresh) {
      const Param& last = params_[buckets_.back().params.back()];
      int64_t have = 0;
      for (size_t i : buckets_.back().params) have += params_[i].t.numel() * static_cast<int64_t>(dtype_size(params_[i].t.dtype()));
      fresh = last.t.dtype() != p.t.dtype() || last.t.device() != p.t.device() || have + bytes > options_.bucket_cap_bytes;
    }
    if (fresh) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    p.bucket = buckets_.size() - 1;
    p.offset = 0;
    for (size_t i : b.params) p.offset += params_[i].t.numel();
    b.params.push_back(k);
  }
  for (Bucket& b : buckets_) {
    int64_t n = 0;
    for (size_t i : b.params) n += params_[i].t.numel();
    const Tensor& first = params_[b.params[0]].t;
    b.flat = zeros(Shape{n}, TensorOptions(first.dtype(), first.device()));
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  reset_pass();
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].hook = autograd::register_post_accumulate_grad_hook(params_[i].t, [this, i](const Tensor& g) { on_grad(i, g); });
}

DistributedDataParallel::~DistributedDataParallel() {
  for (Param& p : params_) autograd::remove_post_accumulate_grad_hook(p.t, p.hook);
  for (Bucket& b : buckets_) {
    if (!b.launched) continue;
    try {
      b.work.wait();  // keep the ranks' collectives in step and the buffer alive until done
    } catch (const std::exception&) {
    }
  }
}

void DistributedDataParallel::reset_pass() {
  for (Param& p : params_) {
    p.ready = false;
    p.grad = Tensor();
  }
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.launched = false;
    b.work = dist::Work();
  }
  next_launch_ = 0;
  ready_params_ = 0;
  in_pass_ = false;
}

void DistributedDataParallel::on_grad(size_t i, const Tensor& grad) {
  if (!sync_) return;  // no_sync: the gradient only accumulates locally
  mark_ready(i, grad);
}

void DistributedDataParallel::mark_ready(size_t i, const Tensor& grad) {
  Param& p = params_[i];
  if (p.ready)
    fail("DistributedDataParallel: parameter '{}' got a second gradient in one synchronized pass (two backward "
         "passes without a forward through the wrapper in between?); accumulate under no_sync()", p.name);
  in_pass_ = true;
  NoGradGuard ng;
  Bucket& b = buckets_[p.bucket];
  b.flat.narrow(0, p.offset, p.t.numel()).copy_(grad.reshape(Shape{p.t.numel()}));
  p.grad = grad;
  p.ready = true;
  ++ready_params_;
  --b.pending;
  launch_ready();
  if (ready_params_ == static_cast<int64_t>(params_.size())) finish_sync();
}

void DistributedDataParallel::launch_ready() {
  // In bucket order on every rank, so the ranks' collectives match one for one.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    b.work = group_->all_reduce_async(b.flat, dist::ReduceOp::avg);
    b.launched = true;
    if (ready_params_ < static_cast<int64_t>(params_.size())) ++stats_.overlapped_buckets;
  }
}

void DistributedDataParallel::finish_sync() {
  NoGradGuard ng;
  for (Bucket& b : buckets_) b.work.wait();
  for (Param& p : params_) {
    const Bucket& b = buckets_[p.bucket];
    Tensor g = p.grad;
    g.copy_(b.flat.narrow(0, p.offset, p.t.numel()).reshape(p.t.shape()));
  }
  ++stats_.synced_backwards;
  reset_pass();
}

void DistributedDataParallel::prepare_forward() {
  if (!in_pass_) return;
  std::vector<std::string> missing;
  for (const Param& p : params_)
    if (!p.ready) missing.push_back(p.name);
  for (Bucket& b : buckets_) {  // keep the launched collectives in step before giving up
    if (!b.launched) continue;
    try {
      b.work.wait();
    } catch (const std::exception&) {
    }
  }
  reset_pass();
  fail("DistributedDataParallel (rank {}): the previous backward gave no gradient to parameter(s) {}, so their "
       "buckets were never averaged; if the forward does not use every parameter, pass "
       "find_unused_parameters = true",
       group_->rank(), fmt::join(missing, ", "));
}

void DistributedDataParallel::finish_forward(const Tensor& output) {
  if (!sync_ || !options_.find_unused_parameters || !is_grad_enabled()) return;
  std::vector<Tensor> ts;
  for (const Param& p : params_) ts.push_back(p.t);
  std::vector<bool> used = autograd::reachable_leaves(output, ts);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (used[i]) continue;
    Tensor t = params_[i].t;
    if (!t.grad().defined()) t.set_grad(zeros_like(t));
    mark_ready(i, t.grad());  // its gradient of this pass is what it has now
  }
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  prepare_forward();
  Tensor y = module_->forward(x);
  finish_forward(y);
  return y;
}

std::vector<std::string> DistributedDataParallel::bucket_parameters(int64_t b) const {
  if (b < 0 || b >= static_cast<int64_t>(buckets_.size()))
    fail("DistributedDataParallel: bucket {} does not exist ({} buckets)", b, buckets_.size());
  std::vector<std::string> names;
  for (size_t i : buckets_[static_cast<size_t>(b)].params) names.push_back(params_[i].name);
  return names;
}

}  // namespace tpu::nn::parallel
