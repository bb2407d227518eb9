// fully_shard checkpoints: full state dicts, one safetensors file per rank (with the global
// shape and row range of every shard in the metadata), loading with resharding, and the
// consolidated single file.
#include <filesystem>
#include <regex>
#include <set>

#include "tpucore/autograd.h"
#include "tpucore/nn/sharded/fsdp_internal.h"
#include "tpucore/ops.h"
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

void FSDPModule::save_sharded(const std::string& dir) {
  wait_gradients();
  const int rank = unit_->rank, world = unit_->world;
  std::error_code ec;
  fs::create_directories(dir, ec);
  TPU_CHECK(!ec, "FSDP save_sharded: cannot create '{}': {}", dir, ec.message());
  TensorList tensors;
  StringMap meta = {{"format", kFormat}, {"rank", std::to_string(rank)}, {"world_size", std::to_string(world)}};
  for (auto& u : unit_->root->live_units())
    for (ShardedParam& p : u->params) {
      tensors.emplace_back(p.name, p.shard.detach());
      meta["shape:" + p.name] = shape_str(p.full_shape);
      meta["rows:" + p.name] = std::to_string(p.first_row) + "," + std::to_string(p.local_rows);
    }
  save_safetensors((fs::path(dir) / shard_file(rank, world)).string(), tensors, meta);
  unit_->pg->barrier();
}

void FSDPModule::save_full(const std::string& path) {
  StateDict sd = full_state_dict();
  if (unit_->rank == 0) save_safetensors(path, sd, StringMap{{"format", "tpucore.fsdp.full"}});
  unit_->pg->barrier();
}

void FSDPModule::load(const std::string& path) {
  wait_gradients();
  std::vector<Source> sources = read_checkpoint(path);
  std::set<std::string> known;
  NoGradGuard ng;
  for (auto& u : unit_->root->live_units())
    for (ShardedParam& p : u->params) {
      known.insert(p.name);
      int64_t covered = 0;
      for (Source& s : sources) {
        auto it = s.contents.tensors.find(p.name);
        TPU_CHECK(it != s.contents.tensors.end(), "FSDP load: {} has no tensor '{}'", s.file, p.name);
        TPU_CHECK(s.shapes[p.name] == shape_str(p.full_shape),
                  "FSDP load: {}: '{}' has global shape [{}] but the parameter is {}", s.file, p.name,
                  s.shapes[p.name], p.full_shape.str());
        auto [first, count] = s.rows[p.name];
        const Tensor& t = it->second;
        TPU_CHECK(first + count <= p.rows && t.numel() == count * p.row_numel,
                  "FSDP load: {}: '{}' holds {} elements for rows [{}, {}) of {}", s.file, p.name, t.numel(), first,
                  first + count, p.full_shape.str());
        const int64_t lo = std::max(first, p.first_row), hi = std::min(first + count, p.first_row + p.local_rows);
        if (hi <= lo) continue;
        Tensor src = narrow(reshape(t, Shape{t.numel()}), 0, (lo - first) * p.row_numel, (hi - lo) * p.row_numel);
        Tensor dst = narrow(reshape(p.shard.detach(), Shape{p.shard.numel()}), 0, (lo - p.first_row) * p.row_numel,
                            (hi - lo) * p.row_numel);
        dst.copy_(src);
        covered += hi - lo;
      }
      TPU_CHECK(covered == p.local_rows, "FSDP load: {}: the files cover {} of this rank's {} rows of '{}'", path,
                covered, p.local_rows, p.name);
    }
  for (Source& s : sources)
    for (auto& [n, t] : s.contents.tensors)
      TPU_CHECK(known.count(n), "FSDP load: {} has tensor '{}', which is not a parameter of the model", s.file, n);
}

}  // namespace tpu::nn::parallel
