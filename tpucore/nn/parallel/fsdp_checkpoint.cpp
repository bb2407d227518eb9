// fully_shard checkpoints: full state dicts, one safetensors file per rank (with the global
// shape and row range of every shard in the metadata), loading with resharding, and the
// consolidated single file.
#include <filesystem>
#include <regex>
#include <set>

#include "tpucore/autograd.h"
#include "tpucore/nn/parallel/fsdp_internal.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"
#include "tpucore/safetensors.h"

namespace tpu::nn::parallel {

using detail::ShardedParam;
using detail::Unit;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tpucore.fsdp.v1";

std::string shape_str(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.ndim(); ++i) d.push_back(s[i]);
  return fmt::format("{}", fmt::join(d, ","));
}

std::string shard_file(int rank, int world) { return fmt::format("shard-{:05}-of-{:05}.safetensors", rank, world); }

// One file of a checkpoint: for each tensor, its rows [first, first + count) of the global shape.
struct Source {
  std::string file;
  SafetensorsContents contents;
  std::map<std::string, std::pair<int64_t, int64_t>> rows;  // name -> (first, count)
  std::map<std::string, std::string> shapes;                // name -> global shape "d0,d1"
};

Source read_source(const std::string& file, bool consolidated) {
  Source s;
  s.file = file;
  s.contents = read_safetensors(file);
  for (auto& [name, t] : s.contents.tensors) {
    auto r = s.contents.metadata.find("rows:" + name);
    auto sh = s.contents.metadata.find("shape:" + name);
    if (consolidated && r == s.contents.metadata.end()) {  // a plain file of full tensors
      s.rows[name] = {0, t.dim() > 0 ? t.size(0) : 1};
      s.shapes[name] = shape_str(t.shape());
      continue;
    }
    TPU_CHECK(r != s.contents.metadata.end() && sh != s.contents.metadata.end(),
              "FSDP load: {}: tensor '{}' has no 'rows:'/'shape:' entry in the metadata (not a fully_shard checkpoint)",
              file, name);
    long long first = -1, count = -1;
    TPU_CHECK(std::sscanf(r->second.c_str(), "%lld,%lld", &first, &count) == 2 && first >= 0 && count >= 0,
              "FSDP load: {}: bad row range '{}' for '{}'", file, r->second, name);
    s.rows[name] = {first, count};
    s.shapes[name] = sh->second;
  }
  return s;
}

std::vector<Source> read_checkpoint(const std::string& path) {
  std::vector<Source> out;
  TPU_CHECK(fs::exists(path), "FSDP load: '{}' does not exist", path);
  if (fs::is_regular_file(path)) {
    out.push_back(read_source(path, true));
    return out;
  }
  static const std::regex pat(R"(shard-(\d{5})-of-(\d{5})\.safetensors)");
  std::map<int, std::string> files;
  int world = -1;
  for (auto& e : fs::directory_iterator(path)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, pat)) continue;
    int r = std::stoi(m[1].str()), w = std::stoi(m[2].str());
    TPU_CHECK(world == -1 || w == world,
              "FSDP load: {} mixes checkpoints of {} and {} ranks ({}); remove the stale files", path, world, w, name);
    world = w;
    files[r] = e.path().string();
  }
  TPU_CHECK(world > 0, "FSDP load: no shard-RRRRR-of-WWWWW.safetensors files in '{}'", path);
  for (int r = 0; r < world; ++r)
    TPU_CHECK(files.count(r), "FSDP load: {} is missing (the checkpoint was saved on {} ranks)",
              (fs::path(path) / shard_file(r, world)).string(), world);
  for (auto& [r, f] : files) {
    TPU_CHECK(r < world, "FSDP load: {}: rank {} beyond the world size {}", f, r, world);
    Source s = read_source(f, false);
    auto fmt_it = s.contents.metadata.find("format");
    TPU_CHECK(fmt_it != s.contents.metadata.end() && fmt_it->second == kFormat,
              "FSDP load: {} is not a fully_shard checkpoint (metadata 'format' is not '{}')", f, kFormat);
    auto rk = s.contents.metadata.find("rank"), ws = s.contents.metadata.find("world_size");
    TPU_CHECK(rk != s.contents.metadata.end() && ws != s.contents.metadata.end() && rk->second == std::to_string(r) &&
                  ws->second == std::to_string(world),
              "FSDP load: {} says rank {} of {} but its name says rank {} of {}", f,
              rk == s.contents.metadata.end() ? "?" : rk->second, ws == s.contents.metadata.end() ? "?" : ws->second, r,
              world);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

StateDict FSDPModule::full_state_dict() {
  wait_gradients();
  StateDict sd;
  for (auto& u : unit_->root->live_units()) {
    std::vector<Tensor> full = u->gather_full(u->master_dtype);
    for (size_t i = 0; i < u->params.size(); ++i) sd[u->params[i].name] = full[i];
  }
  return sd;
}

void FSDPModule::load_full_state_dict(const StateDict& sd) {
  std::set<std::string> known;
  for (auto& u : unit_->root->live_units())
    for (ShardedParam& p : u->params) {
      known.insert(p.name);
      auto it = sd.find(p.name);
      TPU_CHECK(it != sd.end(), "FSDP load_full_state_dict: '{}' is missing", p.name);
      TPU_CHECK(it->second.shape() == p.full_shape, "FSDP load_full_state_dict: '{}' is {} but the parameter is {}",
                p.name, it->second.shape().str(), p.full_shape.str());
    }
  for (auto& [n, t] : sd) TPU_CHECK(known.count(n), "FSDP load_full_state_dict: unexpected key '{}'", n);
  NoGradGuard ng;
  for (auto& u : unit_->root->live_units())
    for (ShardedParam& p : u->params) {
      const Tensor& full = sd.at(p.name);
      Shape rows_shape = full.dim() == 0 ? Shape{1} : full.shape();
      p.shard.copy_(narrow(reshape(full, rows_shape), 0, p.first_row, p.local_rows));
    }
}

namespace {

// The optimizer's per-parameter buffers ("exp_avg.3") by parameter name, and its other entries.
struct OptimParts {
  std::vector<std::pair<std::string, Tensor>> per_param;  // "optim.exp_avg.<param name>"
  std::vector<std::pair<std::string, Tensor>> scalars;    // "optim.step"
};

// Index of each shard in the optimizer's parameter list.
std::map<std::string, size_t> optim_index(const optim::Optimizer& opt, const std::vector<std::shared_ptr<Unit>>& units) {
  std::map<std::string, size_t> idx;
  const auto& ps = opt.params();
  for (auto& u : units)
    for (ShardedParam& p : u->params)
      for (size_t i = 0; i < ps.size(); ++i)
        if (ps[i].is_same(p.shard)) idx[p.name] = i;
  return idx;
}

OptimParts split_optim(const optim::Optimizer& opt, const std::vector<std::shared_ptr<Unit>>& units) {
  std::map<size_t, std::string> name_of;
  for (auto& [n, i] : optim_index(opt, units)) name_of[i] = n;
  OptimParts parts;
  for (auto& [key, t] : opt.state_dict()) {
    const size_t dot = key.rfind('.');
    if (dot != std::string::npos && key.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
      const size_t i = std::stoul(key.substr(dot + 1));
      TPU_CHECK(name_of.count(i), "FSDP save_sharded: optimizer entry '{}' belongs to a parameter that is not a shard of "
                "this model", key);
      parts.per_param.emplace_back("optim." + key.substr(0, dot) + "." + name_of[i], t);
    } else {
      parts.scalars.emplace_back("optim." + key, t);
    }
  }
  return parts;
}

// Copies rows [first_row, first_row + local_rows) of tensor `name` (global shape `full`) from
// the checkpoint's files into dst (the rank's rows, contiguous).
void gather_rows(std::vector<Source>& sources, const std::string& path, const std::string& name, const Shape& full,
                 const ShardedParam& p, const Tensor& dst) {
  int64_t covered = 0;
  for (Source& s : sources) {
    auto it = s.contents.tensors.find(name);
    TPU_CHECK(it != s.contents.tensors.end(), "FSDP load: {} has no tensor '{}'", s.file, name);
    TPU_CHECK(s.shapes[name] == shape_str(full), "FSDP load: {}: '{}' has global shape [{}] but the parameter is {}",
              s.file, name, s.shapes[name], full.str());
    auto [first, count] = s.rows[name];
    const Tensor& t = it->second;
    TPU_CHECK(first + count <= p.rows && t.numel() == count * p.row_numel,
              "FSDP load: {}: '{}' holds {} elements for rows [{}, {}) of {}", s.file, name, t.numel(), first,
              first + count, full.str());
    const int64_t lo = std::max(first, p.first_row), hi = std::min(first + count, p.first_row + p.local_rows);
    if (hi <= lo) continue;
    Tensor src = narrow(reshape(t, Shape{t.numel()}), 0, (lo - first) * p.row_numel, (hi - lo) * p.row_numel);
    Tensor d = narrow(reshape(dst, Shape{dst.numel()}), 0, (lo - p.first_row) * p.row_numel, (hi - lo) * p.row_numel);
    d.copy_(src);
    covered += hi - lo;
  }
  TPU_CHECK(covered == p.local_rows, "FSDP load: {}: the files cover {} of this rank's {} rows of '{}'", path, covered,
            p.local_rows, name);
}

}  // namespace

void FSDPModule::save_sharded(const std::string& dir, const optim::Optimizer* opt) {
  wait_gradients();
  const int rank = unit_->rank, world = unit_->world;
  auto units = unit_->root->live_units();
  std::error_code ec;
  fs::create_directories(dir, ec);
  TPU_CHECK(!ec, "FSDP save_sharded: cannot create '{}': {}", dir, ec.message());
  TensorList tensors;
  StringMap meta = {{"format", kFormat}, {"rank", std::to_string(rank)}, {"world_size", std::to_string(world)}};
  std::map<std::string, const ShardedParam*> by_name;
  for (auto& u : units)
    for (ShardedParam& p : u->params) {
      by_name[p.name] = &p;
      tensors.emplace_back(p.name, p.shard.detach());
      meta["shape:" + p.name] = shape_str(p.full_shape);
      meta["rows:" + p.name] = std::to_string(p.first_row) + "," + std::to_string(p.local_rows);
    }
  if (opt) {
    OptimParts parts = split_optim(*opt, units);
    for (auto& [key, t] : parts.per_param) {  // rows as the parameter's
      const ShardedParam& p = *by_name.at(key.substr(key.find('.', 6) + 1));
      tensors.emplace_back(key, t.detach());
      meta["shape:" + key] = shape_str(p.full_shape);
      meta["rows:" + key] = std::to_string(p.first_row) + "," + std::to_string(p.local_rows);
    }
    for (auto& [key, t] : parts.scalars) {  // the same on every rank; stored whole
      tensors.emplace_back(key, t.detach());
      meta["shape:" + key] = "scalar";
      meta["rows:" + key] = "0,1";
    }
  }
  save_safetensors((fs::path(dir) / shard_file(rank, world)).string(), tensors, meta);
  unit_->pg->barrier();
}

void FSDPModule::save_full(const std::string& path) {
  StateDict sd = full_state_dict();
  if (unit_->rank == 0) save_safetensors(path, sd, StringMap{{"format", "tpucore.fsdp.full"}});
  unit_->pg->barrier();
}

void FSDPModule::load(const std::string& path, optim::Optimizer* opt) {
  wait_gradients();
  std::vector<Source> sources = read_checkpoint(path);
  auto units = unit_->root->live_units();
  std::set<std::string> known;
  std::map<std::string, const ShardedParam*> by_name;
  NoGradGuard ng;
  for (auto& u : units)
    for (ShardedParam& p : u->params) {
      known.insert(p.name);
      by_name[p.name] = &p;
      gather_rows(sources, path, p.name, p.full_shape, p, p.shard.detach());
    }
  for (Source& s : sources)
    for (auto& [n, t] : s.contents.tensors)
      TPU_CHECK(known.count(n) || n.rfind("optim.", 0) == 0,
                "FSDP load: {} has tensor '{}', which is not a parameter of the model", s.file, n);
  if (!opt) return;
  std::map<std::string, size_t> index = optim_index(*opt, units);
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : sources[0].contents.tensors) {
    if (n.rfind("optim.", 0) != 0) continue;
    if (sources[0].shapes[n] == "scalar") {
      state[n.substr(6)] = t;
      continue;
    }
    const size_t dot = n.find('.', 6);
    const std::string buf = n.substr(6, dot - 6), pname = dot == std::string::npos ? "" : n.substr(dot + 1);
    TPU_CHECK(by_name.count(pname), "FSDP load: {}: optimizer entry '{}' names no parameter of the model",
              sources[0].file, n);
    TPU_CHECK(index.count(pname), "FSDP load: the optimizer does not hold the shard of '{}'", pname);
    const ShardedParam& p = *by_name.at(pname);
    Tensor dst = zeros(p.shard.shape(), TensorOptions(t.dtype(), p.shard.device()));
    gather_rows(sources, path, n, p.full_shape, p, dst);
    state[buf + "." + std::to_string(index.at(pname))] = dst;
  }
  TPU_CHECK(!state.empty(), "FSDP load: {} holds no optimizer state (saved without an optimizer)", path);
  opt->load_state_dict(state);
}

}  // namespace tpu::nn::parallel
