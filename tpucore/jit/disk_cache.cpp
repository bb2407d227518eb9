// Persistent cache of optimized graphs in TPU_CACHE_DIR: one file per key (a hash of the
// traced graph and the compiler version), holding the key, the compiler version, a checksum
// of the payload and the optimized graph as JSON. A file that fails any check (unreadable,
// wrong key or version, bad checksum, graph that does not verify or does not match the traced
// inputs and outputs) is logged, ignored and rewritten.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "graph/printer.h"
#include "tpucore/jit/internal.h"
#include "tpucore/core/log.h"

namespace tpu::jit::detail {
namespace {

uint64_t checksum(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::filesystem::path entry_path(uint64_t key) {
  const char* dir = std::getenv("TPU_CACHE_DIR");
  return std::filesystem::path(dir ? dir : "") / fmt::format("graph-{:016x}.json", key);
}

bool has_random(const graph::Graph& g) {
  for (const graph::Node& n : g.nodes)
    if (n.op->has(ops::kRandom) && n.attrs.has("generator") && n.attrs.get_int("generator") != 0) return true;
  return false;
}

}  // namespace

bool disk_cache_enabled() {
  const char* dir = std::getenv("TPU_CACHE_DIR");
  return dir && *dir;
}

std::optional<graph::Graph> disk_cache_load(uint64_t key, const graph::Graph& traced) {
  const auto path = entry_path(key);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str());
    TPU_CHECK(j.at("key").get<std::string>() == fmt::format("{:016x}", key), "the key does not match");
    TPU_CHECK(j.at("compiler").get<std::string>() == kCompilerVersion, "made by compiler '{}', this is '{}'",
              j.at("compiler").get<std::string>(), kCompilerVersion);
    const std::string payload = j.at("graph").get<std::string>();
    TPU_CHECK(j.at("checksum").get<std::string>() == fmt::format("{:016x}", checksum(payload)), "checksum mismatch");
    graph::Graph g = graph::from_json(payload);
    TPU_CHECK(g.inputs.size() == traced.inputs.size() && g.outputs.size() == traced.outputs.size(),
              "inputs/outputs do not match the traced graph");
    for (size_t i = 0; i < g.inputs.size(); ++i)
      TPU_CHECK(g.meta(g.inputs[i]) == traced.meta(traced.inputs[i]), "input {} is {} but the trace has {}", i,
                graph::meta_str(g.meta(g.inputs[i])), graph::meta_str(traced.meta(traced.inputs[i])));
    for (size_t i = 0; i < g.outputs.size(); ++i)
      TPU_CHECK(g.meta(g.outputs[i]).shape == traced.meta(traced.outputs[i]).shape &&
                    g.meta(g.outputs[i]).dtype == traced.meta(traced.outputs[i]).dtype,
                "output {} does not match the traced graph", i);
    log().debug("compile: loaded optimized graph from {}", path.filename().string());
    return g;
  } catch (const std::exception& e) {
    log().warn("compile: disk cache entry {} is corrupt or stale ({}); rebuilding it", path.filename().string(), e.what());
    return std::nullopt;
  }
}

void disk_cache_store(uint64_t key, const graph::Graph& optimized) {
  if (has_random(optimized)) return;  // holds a generator address: meaningless in another process
  try {
    const auto path = entry_path(key);
    std::filesystem::create_directories(path.parent_path());
    const std::string payload = graph::to_json(optimized);
    nlohmann::json j{{"key", fmt::format("{:016x}", key)},
                     {"compiler", kCompilerVersion},
                     {"checksum", fmt::format("{:016x}", checksum(payload))},
                     {"graph", payload}};
    const auto tmp = path.string() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << j.dump();
      TPU_CHECK(f.good(), "write failed");
    }
    std::filesystem::rename(tmp, path);
  } catch (const std::exception& e) {
    log().warn("compile: could not write the disk cache entry: {}", e.what());
  }
}

}  // namespace tpu::jit::detail
