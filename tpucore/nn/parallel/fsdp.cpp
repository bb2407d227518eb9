// fully_shard: units, the gather before each forward (and before each backward), the
// reduce-scatter after it, and prefetching. Checkpoints are in fsdp_checkpoint.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>

#include "tpucore/autograd.h"
#include "tpucore/core/storage_memory.h"
#include "tpucore/nn/parallel/fsdp_internal.h"
#include "tpucore/nn/parallel/function.h"
#include "tpucore/ops.h"

namespace tpu::nn::parallel {
namespace detail {
namespace {

std::mutex g_mu;
std::map<const Module*, std::weak_ptr<Unit>>& registry() {
  static std::map<const Module*, std::weak_ptr<Unit>> r;
  return r;
}

// Freeing a gathered parameter while autograd still holds it (saved for backward): its storage
// gives its memory back and gets fresh memory (refilled by a gather) before backward reads it.
void release_memory(const Tensor& t) { free_memory(*t.storage()); }
void adopt_memory(const Tensor& t) { refill_memory(*t.storage(), t.nbytes()); }

Tensor flat_view(const Tensor& t) { return reshape(t, Shape{t.numel()}); }

}  // namespace

// Whether an instance's full parameters hold memory (unsharded) or were freed after the
// forward (resharded) until the gather before its backward.
enum class ParamState { unsharded, resharded };
// Its gradients: not tracked (no history), awaited from backward, or reduce-scattered.
enum class GradState { untracked, pending, reduced };

// One forward of a unit with history: its full parameters (aliases of the tensors the layer
// read, sharing their storage), freed after the forward and refilled before the backward.
struct Instance {
  std::shared_ptr<Unit> unit;
  size_t pos = 0;
  std::vector<Tensor> full;
  ParamState param_state = ParamState::unsharded;
  GradState grad_state = GradState::untracked;

  ~Instance() {
    if (grad_state == GradState::pending) --unit->root->outstanding;  // the graph was dropped without backward
  }
  void release() {
    if (param_state == ParamState::resharded) return;
    for (const Tensor& t : full)
      if (!t.is_proxy()) release_memory(t);
    param_state = ParamState::resharded;
  }
  void pre_backward() {
    RootState& R = *unit->root;
    if (param_state == ParamState::resharded) {
      Tensor g = unit->finish_gather();
      for (const Tensor& t : full) adopt_memory(t);
      param_state = ParamState::unsharded;
      // The same values as before the release: autograd's saved-version check must not see a write.
      std::vector<uint64_t> versions;
      for (const Tensor& t : full) versions.push_back(t.storage()->version);
      unit->fill(g, full);
      for (size_t i = 0; i < full.size(); ++i) full[i].storage()->version = versions[i];
    }
    if (unit->opts.prefetch && !recording() && pos >= 1 && pos - 1 < R.now.size())
      if (auto prev = R.now[pos - 1].lock(); prev && prev->param_state == ParamState::resharded) prev->unit->start_gather();
  }
  void post_backward(std::span<const Tensor> grads) {
    Unit& u = *unit;
    {
      NoGradGuard ng;
      Tensor in = zeros(Shape{u.world * u.flat}, TensorOptions(u.reduce_dtype, u.device));
      for (size_t i = 0; i < u.params.size(); ++i) {
        const ShardedParam& p = u.params[i];
        Tensor g = flat_view(grads[i]);
        for (int r = 0; r < u.world; ++r)
          if (int64_t n = p.rows_of(r); n > 0) {
            Tensor dst = narrow(in, 0, r * u.flat + p.offset, n * p.row_numel);
            dst.copy_(narrow(g, 0, r * p.chunk * p.row_numel, n * p.row_numel));
          }
      }
      Tensor out = collective_buffer(Shape{u.flat}, TensorOptions(u.reduce_dtype, u.device));
      dist::Work w = u.pg->reduce_scatter_tensor_async(out, in, dist::ReduceOp::avg);
      u.root->pending.push_back(PendingReduce{unit, w, in, out});
    }
    release();
    if (grad_state == GradState::pending) {
      grad_state = GradState::reduced;
      --u.root->outstanding;
    }
    if (u.root->outstanding == 0) u.root->finalize();
  }
};

Tensor Unit::pack_shards(DType dtype) const {
  NoGradGuard ng;
  Tensor buf = zeros(Shape{flat}, TensorOptions(dtype, device));
  for (const ShardedParam& p : params)
    if (p.local_rows > 0) {
      Tensor dst = narrow(buf, 0, p.offset, p.local_rows * p.row_numel);
      dst.copy_(flat_view(p.shard.detach()));
    }
  return buf;
}

void Unit::start_gather() {
  if (gather == GatherState::in_flight) return;
  gather_in = pack_shards(compute_dtype);
  gather_out = collective_buffer(Shape{world * flat}, TensorOptions(compute_dtype, device));
  gather_work = pg->all_gather_into_tensor_async(gather_out, gather_in);
  gather = GatherState::in_flight;
}

Tensor Unit::finish_gather() {
  start_gather();
  gather = GatherState::none;
  gather_work.wait();
  Tensor out = std::move(gather_out);
  gather_in = gather_out = Tensor();
  return out;
}

void Unit::drop_gather() {
  if (gather == GatherState::in_flight) (void)finish_gather();
}

void Unit::fill(const Tensor& gathered, const std::vector<Tensor>& full) const {
  NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) {
    const ShardedParam& p = params[i];
    Tensor dst_all = flat_view(full[i]);
    for (int r = 0; r < world; ++r)
      if (int64_t n = p.rows_of(r); n > 0) {
        Tensor dst = narrow(dst_all, 0, r * p.chunk * p.row_numel, n * p.row_numel);
        dst.copy_(narrow(gathered, 0, r * flat + p.offset, n * p.row_numel));
      }
  }
}

std::vector<Tensor> Unit::gather_full(DType dtype) {
  NoGradGuard ng;
  Tensor in = pack_shards(dtype);
  Tensor out = empty(Shape{world * flat}, TensorOptions(dtype, device));
  pg->all_gather_into_tensor(out, in);
  std::vector<Tensor> full;
  for (const ShardedParam& p : params) full.push_back(empty(p.full_shape, TensorOptions(dtype, device)));
  fill(out, full);
  return full;
}

void Unit::pre_forward() {
  if (state == TrainingState::forward) {
    ++nested;
    return;
  }
  RootState& R = *root;
  if (is_root) {
    R.finalize();
    R.now.clear();
  }
  const size_t pos = R.now.size();
  auto inst = std::make_shared<Instance>();
  inst->unit = shared_from_this();
  inst->pos = pos;
  R.now.push_back(inst);
  const bool traced = recording();
  Tensor gathered = finish_gather();
  if (opts.prefetch && !traced && pos + 1 < R.order.size())
    if (auto next = R.order[pos + 1].lock(); next && next.get() != this) next->start_gather();
  std::vector<Tensor> full, shards;
  {
    NoGradGuard ng;
    for (const ShardedParam& p : params) {
      shards.push_back(p.shard);
      if (traced) {  // out of place: every rank's rows of the gathered buffer, concatenated
        std::vector<Tensor> rows;
        for (int r = 0; r < world; ++r)
          if (int64_t n = p.rows_of(r); n > 0) rows.push_back(narrow(gathered, 0, r * flat + p.offset, n * p.row_numel));
        full.push_back(reshape(rows.size() == 1 ? rows[0] : cat(rows), p.full_shape).contiguous());
      } else {
        full.push_back(empty(p.full_shape, TensorOptions(compute_dtype, device)));
      }
    }
    if (!traced) fill(gathered, full);
  }
  gathered = Tensor();
  for (const Tensor& t : full) inst->full.push_back(fresh_alias(t));
  attach_backward(
      "fsdp_unshard", shards, full, [inst](std::span<const Tensor> g, std::span<Tensor>) { inst->post_backward(g); },
      true);
  if (!full.empty() && full[0].requires_grad()) {
    inst->grad_state = GradState::pending;
    ++R.outstanding;
  }
  for (size_t i = 0; i < params.size(); ++i) *params[i].slot = full[i];
  current = inst;
  current_full = std::move(full);
  state = TrainingState::forward;
}

void Unit::post_forward(Tensor& y) {
  if (state != TrainingState::forward) return;  // a failed pre-forward: nothing to undo
  if (nested > 0) {
    --nested;
    return;
  }
  state = TrainingState::idle;
  for (ShardedParam& p : params) *p.slot = p.shard;
  current_full.clear();
  std::shared_ptr<Instance> inst = std::move(current);
  current.reset();
  if (!y.defined()) return;  // the forward failed
  RootState& R = *root;
  if (is_root) {
    R.order.clear();
    for (auto& w : R.now)
      if (auto i = w.lock()) R.order.push_back(i->unit);
  }
  if (inst->grad_state != GradState::pending || !y.requires_grad()) return;
  // Traced: the graph keeps the gathered values until their last backward reader (its buffer
  // planner frees them), so there is nothing to release and regather.
  if (!is_root && opts.reshard_after_forward && !recording()) inst->release();
  std::weak_ptr<Instance> weak = inst;
  Tensor out = fresh_alias(y);
  Tensor ins[1] = {y}, outs[1] = {out};
  attach_backward(
      "fsdp_pre_backward", ins, outs,
      [weak](std::span<const Tensor> g, std::span<Tensor> gin) {
        if (auto i = weak.lock()) i->pre_backward();
        gin[0] = g[0];
      },
      true);
  y = outs[0];
}

Tensor Unit::call(const std::function<Tensor()>& f) {
  pre_forward();
  Tensor y;
  try {
    y = f();
  } catch (...) {
    Tensor none;
    post_forward(none);
    throw;
  }
  post_forward(y);
  return y;
}

std::vector<std::shared_ptr<Unit>> RootState::live_units() const {
  std::vector<std::shared_ptr<Unit>> v;
  for (auto& w : units)
    if (auto u = w.lock()) v.push_back(u);
  return v;
}

void RootState::finalize() {
  std::vector<PendingReduce> todo = std::move(pending);
  pending.clear();
  for (PendingReduce& p : todo) {
    p.work.wait();
    NoGradGuard ng;
    for (ShardedParam& sp : p.unit->params) {
      Tensor g = narrow(p.out, 0, sp.offset, sp.local_rows * sp.row_numel).reshape(sp.shard.shape());
      if (g.dtype() != sp.shard.dtype()) g = g.to(sp.shard.dtype());
      Tensor have = sp.shard.grad();
      if (have.defined()) have.add_(g);
      else sp.shard.set_grad(g.clone());
    }
  }
  for (auto& u : live_units()) u->drop_gather();
}

}  // namespace detail

using detail::ShardedParam;
using detail::Unit;

FSDPModule::FSDPModule(std::shared_ptr<Module> module, std::shared_ptr<Unit> unit)
    : module_(std::move(module)), unit_(std::move(unit)) {
  // The wrapped module's members under their own names, so names and parameters() are unchanged.
  for (auto& [name, slot] : module_->parameter_slots(false)) register_parameter(name, *slot);
  for (auto& [name, child] : module_->named_children()) register_module(name, child);
}

FSDPModule::~FSDPModule() = default;

// The module's hooks gather, cast and release: calling it through them is its sharded forward.
Tensor FSDPModule::forward(const Tensor& x) { return (*module_)(x); }

Tensor FSDPModule::run(const std::function<Tensor()>& f) { return unit_->call(f); }

std::string FSDPModule::type_name() const { return "FSDP(" + module_->type_name() + ")"; }
Module& FSDPModule::module() const { return *module_; }
const dist::ProcessGroupPtr& FSDPModule::group() const { return unit_->pg; }

FSDPModule::MemoryStats FSDPModule::memory_stats() const {
  MemoryStats m;
  for (auto& w : unit_->root->now)
    if (auto i = w.lock(); i && i->param_state == detail::ParamState::unsharded)
      for (const Tensor& t : i->full) m.gathered_bytes += static_cast<int64_t>(t.nbytes());
  for (auto& u : unit_->root->live_units()) {
    for (const ShardedParam& p : u->params) m.shard_bytes += static_cast<int64_t>(p.shard.nbytes());
    if (u->gather == detail::GatherState::in_flight) m.gathered_bytes += static_cast<int64_t>(u->gather_out.nbytes());
  }
  return m;
}

void FSDPModule::wait_gradients() { unit_->root->finalize(); }

double FSDPModule::clip_grad_norm_(double max_norm) {
  TPU_CHECK(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  wait_gradients();
  NoGradGuard ng;
  Tensor sq = zeros(Shape{1}, TensorOptions(DType::f32, unit_->device));
  std::vector<Tensor> grads;
  for (auto& u : unit_->root->live_units())
    for (ShardedParam& p : u->params)
      if (Tensor g = p.shard.grad(); g.defined() && g.numel() > 0) {
        grads.push_back(g);
        Tensor g32 = g.to(DType::f32);
        sq.add_(sum(mul(g32, g32)).reshape(Shape{1}));
      }
  unit_->pg->all_reduce(sq, dist::ReduceOp::sum);
  const double norm = std::sqrt(sq.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (Tensor& g : grads) g.mul_(coef);
  return norm;
}

namespace {

void collect_units(const std::shared_ptr<Module>& m, std::vector<std::shared_ptr<Unit>>& out, bool top) {
  if (!top) {
    std::lock_guard<std::mutex> lock(detail::g_mu);
    auto it = detail::registry().find(m.get());
    if (it != detail::registry().end())
      if (auto u = it->second.lock()) {
        out.push_back(u);
        return;  // its own units below were claimed by it
      }
  }
  for (auto& [n, c] : m->named_children()) collect_units(c, out, false);
}

}  // namespace

std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<Module> module, const dist::DeviceMesh& mesh,
                                        const FSDPOptions& options) {
  std::string axis = options.mesh_axis;
  if (axis.empty()) {
    TPU_CHECK(mesh.axis_names().size() == 1,
              "fully_shard: the mesh has {} axes ({}); name the one to shard over in FSDPOptions::mesh_axis",
              mesh.axis_names().size(), fmt::join(mesh.axis_names(), ", "));
    axis = mesh.axis_names()[0];
  }
  return fully_shard(std::move(module), mesh.group(axis), options);
}

std::shared_ptr<FSDPModule> fully_shard(std::shared_ptr<Module> module, dist::ProcessGroupPtr group,
                                        const FSDPOptions& options) {
  TPU_CHECK(module != nullptr, "fully_shard: the module is null");
  TPU_CHECK(group != nullptr && group->is_member(), "fully_shard: this rank is not a member of the process group");
  {
    std::lock_guard<std::mutex> lock(detail::g_mu);
    auto it = detail::registry().find(module.get());
    TPU_CHECK(it == detail::registry().end() || it->second.expired(), "fully_shard: the module ({}) is already sharded",
              module->type_name());
  }
  if (const auto& mp = options.mixed_precision)
    TPU_CHECK(is_floating(mp->param_dtype) && is_floating(mp->reduce_dtype),
              "fully_shard: mixed precision dtypes must be floating point, got param {} and reduce {}",
              dtype_name(mp->param_dtype), dtype_name(mp->reduce_dtype));
  auto u = std::make_shared<Unit>();
  u->module = module.get();
  u->pg = group;
  u->rank = group->rank();
  u->world = group->size();
  u->opts = options;
  std::vector<std::shared_ptr<Unit>> below;
  collect_units(module, below, true);
  std::set<const Tensor*> taken;
  for (auto& c : below) {
    TPU_CHECK(c->pg->global_ranks() == group->global_ranks(),
              "fully_shard: {} is sharded over ranks [{}] but its parent {} over ranks [{}]; one mesh axis for all units",
              c->module->type_name(), fmt::join(c->pg->global_ranks(), ", "), module->type_name(),
              fmt::join(group->global_ranks(), ", "));
    for (auto& cu : c->root->live_units())
      for (ShardedParam& p : cu->params) taken.insert(p.slot);
  }
  auto slots = module->parameter_slots(true);
  bool first = true;
  for (auto& [name, slot] : slots) {
    if (taken.count(slot)) continue;
    const Tensor& t = *slot;
    TPU_CHECK(is_floating(t.dtype()) && t.requires_grad(),
              "fully_shard: parameter '{}' ({} {}) must be floating point and require grad", name, dtype_name(t.dtype()),
              t.shape().str());
    if (first) {
      u->device = t.device();
      u->master_dtype = t.dtype();
      first = false;
    }
    TPU_CHECK(t.device() == u->device && t.dtype() == u->master_dtype,
              "fully_shard: parameter '{}' is {} on {} but the unit's others are {} on {}", name, dtype_name(t.dtype()),
              t.device().str(), dtype_name(u->master_dtype), u->device.str());
    ShardedParam p;
    p.name = name;
    p.slot = slot;
    p.full_shape = t.shape();
    p.rows = t.dim() > 0 ? t.size(0) : 1;
    p.row_numel = 1;
    for (int d = 1; d < t.dim(); ++d) p.row_numel *= t.size(d);
    p.chunk = (p.rows + u->world - 1) / u->world;
    p.first_row = std::min(p.rows, u->rank * p.chunk);
    p.local_rows = p.rows_of(u->rank);
    p.offset = u->flat;
    u->flat += p.chunk * p.row_numel;
    NoGradGuard ng;
    if (options.sync_module_states) group->broadcast(t, 0);
    Shape rows_shape = t.shape();
    if (t.dim() == 0) rows_shape = Shape{1};
    Tensor local = narrow(reshape(t.detach(), rows_shape), 0, p.first_row, p.local_rows).clone();
    local.requires_grad_(true);
    p.shard = local;
    *slot = local;
    u->params.push_back(std::move(p));
  }
  if (first && !below.empty()) {
    u->device = below[0]->device;
    u->master_dtype = below[0]->master_dtype;
  }
  u->compute_dtype = options.mixed_precision ? options.mixed_precision->param_dtype : u->master_dtype;
  u->reduce_dtype = options.mixed_precision ? options.mixed_precision->reduce_dtype : u->master_dtype;
  // This unit is the root of itself and of the units below it (until a parent claims it).
  u->root = std::make_shared<detail::RootState>();
  u->root->units.push_back(u);
  std::map<const Tensor*, std::string> names;
  for (auto& [name, slot] : slots) names[slot] = name;
  for (auto& c : below)
    for (auto& cu : c->root->live_units()) {
      cu->is_root = false;
      cu->root = u->root;
      u->root->units.push_back(cu);
      for (ShardedParam& p : cu->params) p.name = names.at(p.slot);
    }
  {
    std::lock_guard<std::mutex> lock(detail::g_mu);
    detail::registry()[module.get()] = u;
  }
  // The module's forward hooks own the unit: it lives as long as the module, called through
  // its hooks (operator(), Module::call) or through the handle.
  module->register_forward_pre_hook([u](Module&, std::vector<Tensor>& inputs) {
    const auto& mp = u->opts.mixed_precision;
    if (mp && mp->cast_forward_inputs && u->state == detail::TrainingState::idle)
      for (Tensor& in : inputs)
        if (in.defined() && is_floating(in.dtype()) && in.dtype() != mp->param_dtype) in = in.to(mp->param_dtype);
    u->pre_forward();
  });
  module->register_forward_hook([u](Module&, std::span<const Tensor>, Tensor& out) { u->post_forward(out); }, true);
  return std::make_shared<FSDPModule>(module, u);
}

}  // namespace tpu::nn::parallel
