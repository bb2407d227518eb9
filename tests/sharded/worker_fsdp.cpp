// FSDP scenarios of the sharded-training worker: training against the one-process reference,
// checkpoints with resharding, and bad input.
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "model.h"
#include "tpucore/nn/parallel/fsdp.h"
#include "tpucore/safetensors.h"

namespace sharded_test {

namespace fs = std::filesystem;
using nn::parallel::FSDPOptions;
using nn::parallel::fully_shard;

std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind, std::vector<Tensor> params) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{0.2, 0.9});
  optim::AdamWOptions o;
  o.lr = 1e-2;
  return std::make_unique<optim::AdamW>(std::move(params), o);
}

// One process, the whole global batch, no sharding code. With mixed precision: a bf16 copy of
// the f32 master model computes; its gradients, in f32, update the master.
Reference train_reference(const Config& c, const std::string& opt_kind, bool mixed, int steps) {
  Reference ref;
  auto master = std::make_shared<TinyLM>(c);
  std::shared_ptr<TinyLM> low;
  if (mixed) {
    low = std::make_shared<TinyLM>(c);
    low->to(DType::bf16);
  }
  auto opt = make_opt(opt_kind, master->parameters());
  auto mp = master->named_parameters();
  for (int s = 0; s < steps; ++s) {
    Tensor tok = batch_tokens(s, kBatch, kSeq, c.vocab);
    Tensor ids = narrow(tok, 1, 0, kSeq).contiguous(), tgt = narrow(tok, 1, 1, kSeq).contiguous();
    if (mixed) {
      auto lp = low->named_parameters();
      {
        NoGradGuard ng;
        for (size_t i = 0; i < lp.size(); ++i) lp[i].second.copy_(mp[i].second);
      }
      low->zero_grad();
      Tensor loss = lm_loss(low->forward(ids), tgt);
      loss.backward();
      for (size_t i = 0; i < lp.size(); ++i) mp[i].second.set_grad(lp[i].second.grad().to(DType::f32));
      ref.losses.push_back(loss.item<double>());
    } else {
      Tensor loss = lm_loss(master->forward(ids), tgt);
      loss.backward();
      ref.losses.push_back(loss.item<double>());
    }
    if (s == 0)
      for (auto& [n, p] : mp) ref.grads0[n] = p.grad().clone();
    opt->step();
    opt->zero_grad();
  }
  ref.final_params = master->state_dict();
  return ref;
}

namespace {

struct Sharded {
  std::shared_ptr<TinyLM> model;
  std::shared_ptr<nn::parallel::FSDPModule> root;
};

Sharded make_sharded(const Config& c, const dist::DeviceMesh& mesh, const FSDPOptions& o, uint64_t seed = 7) {
  Sharded s;
  s.model = std::make_shared<TinyLM>(c, seed);
  for (auto& b : s.model->blocks) b = fully_shard(b, mesh, o);
  s.root = fully_shard(s.model, mesh, o);
  return s;
}

}  // namespace

int expect_error(const std::function<void()>& f, const char* must_contain, const std::string& what) {
  try {
    f();
  } catch (const tpu::Error& e) {
    const bool ok = std::strstr(e.what(), must_contain) != nullptr;
    check(ok, what + ": error '" + e.what() + "' should mention '" + must_contain + "'");
    return ok ? 0 : 1;
  }
  check(false, what + ": no tpu::Error");
  return 1;
}

// argv: optimizer (adamw | sgd), mixed precision (0 | 1), prefetch (0 | 1).
int scenario_fsdp_train(const std::string& opt_kind, bool mixed, bool prefetch) {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  const int steps = 3;
  Reference ref = train_reference(c, opt_kind, mixed, steps);
  dist::DeviceMesh mesh({world}, {"dp"});
  FSDPOptions o;
  o.prefetch = prefetch;
  if (mixed) o.mixed_precision = nn::parallel::MixedPrecision{};
  Sharded s = make_sharded(c, mesh, o);
  // Parameters are shards: a block's q_proj weight [16, 16] keeps 16 / world rows here.
  auto* blk = dynamic_cast<Block*>(&dynamic_cast<nn::parallel::FSDPModule&>(*s.model->blocks[0]).module());
  check(blk && blk->attn->q_proj->weight.size(0) == 16 / world, "q_proj weight is sharded");
  auto opt = make_opt(opt_kind, s.root->parameters());
  const double loss_tol = mixed ? 3e-2 : 2e-5;
  for (int step = 0; step < steps; ++step) {
    Tensor tok = batch_tokens(step, kBatch, kSeq, c.vocab);
    Tensor mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
    Tensor ids = narrow(mine, 1, 0, kSeq).contiguous(), tgt = narrow(mine, 1, 1, kSeq).contiguous();
    Tensor logits = s.root->forward(ids);
    check(logits.dtype() == (mixed ? DType::bf16 : DType::f32), "forward computes in the param dtype");
    check(blk->attn->q_proj->weight.size(0) == 16 / world, "after forward the member is the shard again");
    // Only the root's own parameters (embedding, final norm, head) stay gathered until backward.
    const int64_t elem = mixed ? 2 : 4;
    const int64_t root_bytes = (c.vocab * c.hidden + c.hidden + c.hidden * c.vocab + c.vocab) * elem;
    check(s.root->memory_stats().gathered_bytes == root_bytes,
          fmt::format("after forward {} bytes gathered, want {}", s.root->memory_stats().gathered_bytes, root_bytes));
    Tensor loss = lm_loss(logits, tgt);
    loss.backward();
    check(s.root->memory_stats().gathered_bytes == 0, "after backward nothing is gathered");
    Tensor g = loss.detach().clone();
    dist::all_reduce(g, dist::ReduceOp::avg);
    const double got = g.item<double>(), want = ref.losses[static_cast<size_t>(step)];
    check(std::fabs(got - want) <= loss_tol * std::max(1.0, std::fabs(want)),
          fmt::format("step {} loss {} vs reference {}", step, got, want));
    if (step == 0) {
      for (auto& [n, p] : s.root->named_parameters()) {
        Tensor pg = p.grad();
        check(pg.defined(), "shard of " + n + " has a gradient after backward");
        if (!pg.defined()) continue;
        Tensor want_g = my_rows(ref.grads0.at(n), rank, world);
        const double tol = mixed ? 3e-2 * std::max(1e-3, max_abs(ref.grads0.at(n))) : 1e-5;
        const double d = max_abs_diff(pg, want_g);
        check(d <= tol, fmt::format("step 0 gradient of {}: max diff {} (tol {})", n, d, tol));
      }
      // The global gradient norm over the group (a bound too large to clip) is the reference's.
      double sq = 0;
      for (auto& [n, rg] : ref.grads0) {
        Tensor g32 = rg.to(DType::f32);
        sq += sum(mul(g32, g32)).item<double>();
      }
      const double norm = s.root->clip_grad_norm_(1e9), want_norm = std::sqrt(sq);
      check(std::fabs(norm - want_norm) <= (mixed ? 3e-2 : 1e-4) * want_norm,
            fmt::format("clip_grad_norm_ global norm {} vs reference {}", norm, want_norm));
    }
    opt->step();
    opt->zero_grad();
  }
  nn::StateDict full = s.root->full_state_dict();
  check(full.size() == ref.final_params.size(), "full_state_dict has every parameter");
  for (auto& [n, want] : ref.final_params) {
    auto it = full.find(n);
    check(it != full.end(), "full_state_dict has " + n);
    if (it == full.end()) continue;
    check(it->second.shape() == want.shape(), n + ": full shape");
    const double d = max_abs_diff(it->second, want);
    const double tol = mixed ? 3e-3 : 1e-4;
    check(d <= tol, fmt::format("final {}: max diff {} to the reference (tol {})", n, d, tol));
  }
  // Evaluation without grad: same logits as the reference model.
  {
    NoGradGuard ng;
    auto m = std::make_shared<TinyLM>(c);
    m->load_state_dict(full);
    Tensor tok = batch_tokens(9, kBatch, kSeq, c.vocab);
    Tensor ids = narrow(tok, 1, 0, kSeq).contiguous();
    Tensor a = s.root->forward(ids), b = m->forward(ids);
    const double d = max_abs_diff(a, b.to(a.dtype()));
    check(d <= (mixed ? 0.1 : 1e-4), fmt::format("no-grad forward matches: max diff {}", d));
  }
  return 0;
}

// Trains two steps on 4 ranks and saves: dir/sharded (one file per rank) and dir/full.safetensors.
int scenario_fsdp_ckpt_save(const std::string& dir) {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  Reference ref = train_reference(c, "adamw", false, 2);
  dist::DeviceMesh mesh({world}, {"dp"});
  Sharded s = make_sharded(c, mesh, {});
  auto opt = make_opt("adamw", s.root->parameters());
  for (int step = 0; step < 2; ++step) {
    Tensor tok = batch_tokens(step, kBatch, kSeq, c.vocab);
    Tensor mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
    lm_loss(s.root->forward(narrow(mine, 1, 0, kSeq).contiguous()), narrow(mine, 1, 1, kSeq).contiguous()).backward();
    opt->step();
    opt->zero_grad();
  }
  s.root->save_sharded(dir + "/sharded", opt.get());
  s.root->save_full(dir + "/full.safetensors");
  check(fs::exists(fs::path(dir) / "sharded" / fmt::format("shard-{:05}-of-{:05}.safetensors", rank, world)),
        "this rank's shard file exists");
  // The consolidated file, read back as a plain safetensors file, is the reference's weights.
  auto file = load_safetensors(dir + "/full.safetensors");
  check(file.size() == ref.final_params.size(), "full file has every parameter");
  for (auto& [n, want] : ref.final_params) {
    auto it = file.find(n);
    check(it != file.end() && max_abs_diff(it->second, want) <= 1e-4, "full file matches the reference: " + n);
  }
  return 0;
}

// Loads dir/<from> (saved on 4 ranks, or another count) and dir/full.safetensors on this world
// size; with `resave`, saves what it loaded (parameters and optimizer state) to dir/<resave>.
int scenario_fsdp_ckpt_load(const std::string& dir, const std::string& from, const std::string& resave) {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  dist::DeviceMesh mesh({world}, {"dp"});
  Sharded s = make_sharded(c, mesh, {}, /*seed=*/99);  // other initial weights
  auto file = load_safetensors(dir + "/full.safetensors");
  auto expect_file = [&](const std::string& what) {
    for (auto& [n, p] : s.root->named_parameters()) {
      auto it = file.find(n);
      check(it != file.end(), what + ": file has " + n);
      if (it == file.end()) continue;
      Tensor want = my_rows(it->second, rank, world);
      check(p.shape() == want.shape() && max_abs_diff(p, want) == 0, what + ": rows of " + n);
    }
  };
  s.root->load(dir + "/" + from);
  expect_file("resharded load");
  nn::StateDict full = s.root->full_state_dict();
  for (auto& [n, t] : file) check(full.count(n) && max_abs_diff(full.at(n), t) == 0, "full_state_dict after load: " + n);
  // The consolidated file loads too (after scrambling the shards).
  {
    NoGradGuard ng;
    for (Tensor& p : s.root->parameters()) p.fill_(0.5);
  }
  s.root->load(dir + "/full.safetensors");
  expect_file("consolidated load");
  // And the model trains on from there: one step, loss equal to the unsharded model's.
  auto plain = std::make_shared<TinyLM>(c, 5);
  plain->load_state_dict(file);
  Tensor tok = batch_tokens(3, kBatch, kSeq, c.vocab);
  Tensor want = lm_loss(plain->forward(narrow(tok, 1, 0, kSeq).contiguous()), narrow(tok, 1, 1, kSeq).contiguous());
  Tensor mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
  Tensor loss = lm_loss(s.root->forward(narrow(mine, 1, 0, kSeq).contiguous()), narrow(mine, 1, 1, kSeq).contiguous());
  loss.backward();
  Tensor g = loss.detach().clone();
  dist::all_reduce(g, dist::ReduceOp::avg);
  check(std::fabs(g.item<double>() - want.item<double>()) < 1e-5, "loss after load equals the unsharded model's");
  // Resuming: parameters and AdamW state saved on 4 ranks after 2 steps, one more step here
  // equals 3 steps of the one-process reference.
  for (Tensor& p : s.root->parameters()) p.set_grad(Tensor());
  auto opt = make_opt("adamw", s.root->parameters());
  s.root->load(dir + "/" + from, opt.get());
  check(dynamic_cast<optim::AdamW&>(*opt).steps() == 2, "AdamW step count restored");
  if (!resave.empty()) s.root->save_sharded(dir + "/" + resave, opt.get());
  tok = batch_tokens(2, kBatch, kSeq, c.vocab);
  mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
  lm_loss(s.root->forward(narrow(mine, 1, 0, kSeq).contiguous()), narrow(mine, 1, 1, kSeq).contiguous()).backward();
  opt->step();
  Reference ref = train_reference(c, "adamw", false, 3);
  nn::StateDict after = s.root->full_state_dict();
  for (auto& [n, w] : ref.final_params)
    check(after.count(n) && max_abs_diff(after.at(n), w) <= 1e-4, "resumed training matches the reference: " + n);
  expect_error([&] { s.root->load(dir + "/full.safetensors", opt.get()); }, "holds no optimizer state",
               "optimizer state from a file without any");
  return 0;
}

// Bad input on 2 ranks; dir holds a 4-rank checkpoint (dir/sharded, dir/full.safetensors).
int scenario_fsdp_bad(const std::string& dir) {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  dist::DeviceMesh mesh2({world, 1}, {"dp", "tp"});
  expect_error([&] { fully_shard(std::make_shared<TinyLM>(c), mesh2); }, "name the one to shard over",
               "2-D mesh without an axis");
  expect_error([&] {
    FSDPOptions o;
    o.mesh_axis = "fsdp";
    fully_shard(std::make_shared<TinyLM>(c), mesh2, o);
  }, "fsdp", "unknown mesh axis");
  {  // a unit sharded over another axis than its root
    auto m = std::make_shared<TinyLM>(c);
    FSDPOptions o;
    o.mesh_axis = "dp";
    m->blocks[0] = fully_shard(m->blocks[0], mesh2, o);
    o.mesh_axis = "tp";
    expect_error([&] { fully_shard(m, mesh2, o); }, "one mesh axis for all units", "mismatched mesh axes");
  }
  dist::DeviceMesh mesh({world}, {"dp"});
  auto s = make_sharded(c, mesh, {});
  expect_error([&] { fully_shard(s.model, mesh); }, "already sharded", "sharding twice");
  // Checkpoints: a missing rank file, a file of another model, a plain file with a foreign tensor.
  fs::path bad = fs::path(dir) / ("bad" + std::to_string(rank));
  fs::remove_all(bad);
  fs::create_directories(bad);
  fs::copy(fs::path(dir) / "sharded", bad / "missing");
  fs::remove(bad / "missing" / "shard-00002-of-00004.safetensors");
  expect_error([&] { s.root->load((bad / "missing").string()); }, "shard-00002-of-00004.safetensors is missing",
               "missing shard file");
  Config other = c;
  other.hidden = 8;
  other.inter = 12;
  auto o = make_sharded(other, mesh, {});
  o.root->save_sharded(dir + "/other");
  expect_error([&] { s.root->load(dir + "/other"); }, "global shape", "checkpoint of another model");
  auto file = load_safetensors(dir + "/full.safetensors");
  file["extra.weight"] = zeros(Shape{3});
  save_safetensors((bad / "extra.safetensors").string(), file);
  expect_error([&] { s.root->load((bad / "extra.safetensors").string()); }, "'extra.weight', which is not a parameter",
               "unexpected tensor");
  fs::copy(fs::path(dir) / "sharded" / "shard-00001-of-00004.safetensors", bad / "missing" / "shard-00000-of-00002.safetensors");
  expect_error([&] { s.root->load((bad / "missing").string()); }, "mixes checkpoints", "files of two world sizes");
  expect_error([&] { s.root->load((bad / "nowhere").string()); }, "does not exist", "no such path");
  // After all that the model still trains.
  Tensor tok = batch_tokens(0, kBatch, kSeq, c.vocab);
  Tensor mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
  lm_loss(s.root->forward(narrow(mine, 1, 0, kSeq).contiguous()), narrow(mine, 1, 1, kSeq).contiguous()).backward();
  for (auto& [n, p] : s.root->named_parameters()) check(p.grad().defined(), "gradient after the errors: " + n);
  return 0;
}

// Rank 1 dies after its first forward; rank 0's backward (its collectives) must fail with a
// tpu::Error instead of hanging, and the process must stay usable.
int scenario_fsdp_die() {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Config c;
  dist::DeviceMesh mesh({world}, {"dp"});
  Sharded s = make_sharded(c, mesh, {});
  Tensor tok = batch_tokens(0, kBatch, kSeq, c.vocab);
  Tensor mine = narrow(tok, 0, rank * (kBatch / world), kBatch / world);
  Tensor loss = lm_loss(s.root->forward(narrow(mine, 1, 0, kSeq).contiguous()), narrow(mine, 1, 1, kSeq).contiguous());
  if (rank == 1) std::_Exit(7);
  const int rc = expect_error([&] { loss.backward(); }, "tpu::dist", "backward after a peer died");
  Tensor t = ones(Shape{3});
  check(sum(t).item<double>() == 3, "the runtime still computes");
  std::printf("rank 0 caught the error\n");
  return rc;
}

}  // namespace sharded_test
