#include "sim/config.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/error.h"
#include "sim/json_text.h"

namespace tpu::sim {
namespace {

using nlohmann::json;

// Reads the members of one JSON object, remembering which keys were consumed so that
// unknown keys (typos) can be reported.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) throw SimError(fmt::format("chip config: '{}' must be a JSON object", path_));
  }
  std::string field(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  bool has(const std::string& k) const { return j_.contains(k); }
  const json& sub(const std::string& k) {
    seen_.insert(k);
    return j_.at(k);
  }
  template <class T>
  void num(const std::string& k, T& out) {
    if (!has(k)) return;
    seen_.insert(k);
    const json& v = j_.at(k);
    if (!v.is_number()) throw SimError(fmt::format("chip config: field '{}' must be a number", field(k)));
    if constexpr (std::is_integral_v<T>) {
      uint64_t u = 0;
      bool ok = true;
      if (v.is_number_unsigned()) {
        u = v.get<uint64_t>();
      } else if (v.is_number_integer()) {
        ok = v.get<int64_t>() >= 0;
        u = ok ? uint64_t(v.get<int64_t>()) : 0;
      } else {
        double d = v.get<double>();
        ok = std::isfinite(d) && d == std::floor(d) && d >= 0 && d < 1.8e19;
        u = ok ? uint64_t(d) : 0;
      }
      if (!ok || u > uint64_t(std::numeric_limits<T>::max()))
        throw SimError(fmt::format("chip config: field '{}' must be a non-negative integer in range, got {}",
                                   field(k), v.dump()));
      out = static_cast<T>(u);
    } else {
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::abs(d) > double(std::numeric_limits<T>::max()))
        throw SimError(fmt::format("chip config: field '{}' must be a finite number in range, got {}", field(k),
                                   v.dump()));
      out = static_cast<T>(d);
    }
  }
  void str(const std::string& k, std::string& out) {
    if (!has(k)) return;
    seen_.insert(k);
    if (!j_.at(k).is_string()) throw SimError(fmt::format("chip config: field '{}' must be a string", field(k)));
    out = j_.at(k).get<std::string>();
  }
  void strs(const std::string& k, std::vector<std::string>& out) {
    if (!has(k)) return;
    seen_.insert(k);
    const json& v = j_.at(k);
    if (!v.is_array()) throw SimError(fmt::format("chip config: field '{}' must be an array of strings", field(k)));
    out.clear();
    for (const auto& e : v) {
      if (!e.is_string()) throw SimError(fmt::format("chip config: field '{}' must be an array of strings", field(k)));
      out.push_back(e.get<std::string>());
    }
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) throw SimError(fmt::format("chip config: unknown field '{}'", field(it.key())));
  }

 private:
  const json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

void need(bool ok, const char* field, const std::string& why) {
  if (!ok) throw SimError(fmt::format("chip config: field '{}' {}", field, why));
}

}  // namespace

void ChipConfig::validate() const {
  auto pos = [](double v) { return std::isfinite(v) && v > 0; };
  auto nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  need(!name.empty(), "name", "must be a non-empty string");
  need(pos(clock_ghz), "clock_ghz", "must be > 0");
  need(cores_per_chip >= 1 && cores_per_chip <= 64, "cores_per_chip", "must be in [1, 64]");
  need(nonneg(published_peak_tflops), "published_peak_tflops", "must be >= 0");
  need(nonneg(published_fp8_tflops), "published_fp8_tflops", "must be >= 0");
  need(std::isfinite(mxu.fp8_cycles_per_row) && (mxu.fp8_cycles_per_row == 0 || mxu.fp8_cycles_per_row >= 0.5),
       "mxu.fp8_cycles_per_row", "must be 0 (no fp8 rate) or >= 0.5");
  need(mxu.count >= 1 && mxu.count <= 64, "mxu.count", "must be in [1, 64]");
  need(mxu.rows >= 1 && mxu.rows <= 4096, "mxu.rows", "must be in [1, 4096]");
  need(mxu.cols >= 1 && mxu.cols <= 4096, "mxu.cols", "must be in [1, 4096]");
  need(nonneg(mxu.fill_cycles), "mxu.fill_cycles", "must be >= 0");
  need(nonneg(mxu.drain_cycles), "mxu.drain_cycles", "must be >= 0");
  need(pos(mxu.weight_load_cycles_per_row), "mxu.weight_load_cycles_per_row", "must be > 0");
  // A systolic array takes at most one LHS row per cycle (one multiply-add per cell per
  // cycle); int8 may pack two rows per cycle (v5e: 394 int8 TOP/s = 2 x 197 bf16 TFLOP/s).
  // Faster rates would claim more than the array's peak (MFU above 100%).
  need(std::isfinite(mxu.bf16_cycles_per_row) && mxu.bf16_cycles_per_row >= 1, "mxu.bf16_cycles_per_row",
       "must be >= 1 (an array takes at most one bf16 row per cycle)");
  need(std::isfinite(mxu.f32_cycles_per_row) && mxu.f32_cycles_per_row >= 1, "mxu.f32_cycles_per_row",
       "must be >= 1 (f32 is at least one bf16 pass)");
  need(std::isfinite(mxu.int8_cycles_per_row) && mxu.int8_cycles_per_row >= 0.5, "mxu.int8_cycles_per_row",
       "must be >= 0.5 (at most two int8 rows per cycle)");
  need(vpu.sublanes >= 1 && vpu.sublanes <= 1024, "vpu.sublanes", "must be in [1, 1024]");
  need(vpu.lanes >= 1 && vpu.lanes <= 4096, "vpu.lanes", "must be in [1, 4096]");
  need(pos(vpu.cycles_per_vreg), "vpu.cycles_per_vreg", "must be > 0");
  need(nonneg(vpu.latency), "vpu.latency", "must be >= 0");
  need(pos(eup.cycles_per_vreg), "eup.cycles_per_vreg", "must be > 0");
  need(nonneg(eup.latency), "eup.latency", "must be >= 0");
  need(pos(xlu.reduce_cycles_per_vreg), "xlu.reduce_cycles_per_vreg", "must be > 0");
  need(pos(xlu.transpose_cycles_per_vreg), "xlu.transpose_cycles_per_vreg", "must be > 0");
  need(nonneg(xlu.latency), "xlu.latency", "must be >= 0");
  need(nonneg(scalar.issue_cycles), "scalar.issue_cycles", "must be >= 0");
  need(scalar.queue_depth >= 1 && scalar.queue_depth <= 4096, "scalar.queue_depth", "must be in [1, 4096]");
  need(scalar.registers >= 1 && scalar.registers <= 256, "scalar.registers", "must be in [1, 256]");
  need(scalar.semaphores >= 1 && scalar.semaphores <= 4096, "scalar.semaphores", "must be in [1, 4096]");
  need(memory.vmem_bytes >= 64 && memory.vmem_bytes <= (uint64_t(1) << 34), "memory.vmem_bytes",
       "must be in [64, 16 GiB]");
  need(memory.hbm_bytes >= 64 && memory.hbm_bytes <= (uint64_t(1) << 40), "memory.hbm_bytes",
       "must be in [64, 1 TiB]");
  need(pos(memory.hbm_bandwidth_gbps), "memory.hbm_bandwidth_gbps", "must be > 0");
  need(dma.engines >= 1 && dma.engines <= 64, "dma.engines", "must be in [1, 64]");
  need(nonneg(dma.latency_cycles), "dma.latency_cycles", "must be >= 0");
  need(pos(dma.engine_bytes_per_cycle), "dma.engine_bytes_per_cycle", "must be > 0");
  need(timing.model == "ideal" || timing.model == "calibrated", "timing.model", "must be \"ideal\" or \"calibrated\"");
  need(nonneg(timing.launch_cycles), "timing.launch_cycles", "must be >= 0");
  need(timing.megacore >= 1 && timing.megacore <= cores_per_chip, "timing.megacore",
       "must be in [1, cores_per_chip] (cores driven as one device)");
  need(pos(timing.mxu_efficiency) && timing.mxu_efficiency <= 1, "timing.mxu_efficiency", "must be in (0, 1]");
  need(pos(timing.hbm_efficiency) && timing.hbm_efficiency <= 1, "timing.hbm_efficiency", "must be in (0, 1]");
  need(nonneg(timing.memory_overlap) && timing.memory_overlap <= 1, "timing.memory_overlap", "must be in [0, 1]");
  need(nonneg(timing.wide_hbm_efficiency) && timing.wide_hbm_efficiency <= 1, "timing.wide_hbm_efficiency",
       "must be in [0, 1] (0: as hbm_efficiency)");
  need(nonneg(timing.reduce_cycles), "timing.reduce_cycles", "must be >= 0");
  need(nonneg(timing.dma_cycles), "timing.dma_cycles", "must be >= 0");
  need(nonneg(timing.weight_load_exposed) && timing.weight_load_exposed <= 1, "timing.weight_load_exposed", "must be in [0, 1]");
  need(nonneg(timing.convert_elems_per_cycle), "timing.convert_elems_per_cycle", "must be >= 0 (0: off)");
  need(nonneg(timing.restream_elems_per_cycle), "timing.restream_elems_per_cycle", "must be >= 0 (0: off)");
}

static ChipConfig config_from_json_checked(const json& j);

ChipConfig config_from_json(const json& j) {
  try {
    return config_from_json_checked(j);
  } catch (const json::exception& e) {  // a backstop: the Reader's checks should leave none
    throw SimError(fmt::format("chip config: malformed value: {}", e.what()));
  }
}

static ChipConfig config_from_json_checked(const json& j) {
  ChipConfig c;
  Reader r(j, "");
  r.str("name", c.name);
  r.str("description", c.description);
  r.strs("sources", c.sources);
  r.strs("notes", c.notes);
  r.num("clock_ghz", c.clock_ghz);
  r.num("cores_per_chip", c.cores_per_chip);
  r.num("published_peak_tflops", c.published_peak_tflops);
  r.num("published_fp8_tflops", c.published_fp8_tflops);
  if (r.has("mxu")) {
    Reader m(r.sub("mxu"), "mxu");
    m.num("count", c.mxu.count);
    m.num("rows", c.mxu.rows);
    m.num("cols", c.mxu.cols);
    c.mxu.fill_cycles = c.mxu.rows;
    c.mxu.drain_cycles = c.mxu.cols;
    m.num("fill_cycles", c.mxu.fill_cycles);
    m.num("drain_cycles", c.mxu.drain_cycles);
    m.num("weight_load_cycles_per_row", c.mxu.weight_load_cycles_per_row);
    m.num("bf16_cycles_per_row", c.mxu.bf16_cycles_per_row);
    m.num("f32_cycles_per_row", c.mxu.f32_cycles_per_row);
    m.num("int8_cycles_per_row", c.mxu.int8_cycles_per_row);
    m.num("fp8_cycles_per_row", c.mxu.fp8_cycles_per_row);
    m.finish();
  }
  if (r.has("vpu")) {
    Reader v(r.sub("vpu"), "vpu");
    v.num("sublanes", c.vpu.sublanes);
    v.num("lanes", c.vpu.lanes);
    v.num("cycles_per_vreg", c.vpu.cycles_per_vreg);
    v.num("latency", c.vpu.latency);
    v.finish();
  }
  if (r.has("eup")) {
    Reader v(r.sub("eup"), "eup");
    v.num("cycles_per_vreg", c.eup.cycles_per_vreg);
    v.num("latency", c.eup.latency);
    v.finish();
  }
  if (r.has("xlu")) {
    Reader v(r.sub("xlu"), "xlu");
    v.num("reduce_cycles_per_vreg", c.xlu.reduce_cycles_per_vreg);
    v.num("transpose_cycles_per_vreg", c.xlu.transpose_cycles_per_vreg);
    v.num("latency", c.xlu.latency);
    v.finish();
  }
  if (r.has("scalar")) {
    Reader v(r.sub("scalar"), "scalar");
    v.num("issue_cycles", c.scalar.issue_cycles);
    v.num("queue_depth", c.scalar.queue_depth);
    v.num("registers", c.scalar.registers);
    v.num("semaphores", c.scalar.semaphores);
    v.finish();
  }
  if (!r.has("memory")) throw SimError("chip config: missing field 'memory'");
  {
    Reader v(r.sub("memory"), "memory");
    v.num("vmem_bytes", c.memory.vmem_bytes);
    v.num("hbm_bytes", c.memory.hbm_bytes);
    v.num("hbm_bandwidth_gbps", c.memory.hbm_bandwidth_gbps);
    v.finish();
  }
  if (r.has("dma")) {
    Reader v(r.sub("dma"), "dma");
    v.num("engines", c.dma.engines);
    v.num("latency_cycles", c.dma.latency_cycles);
    v.num("engine_bytes_per_cycle", c.dma.engine_bytes_per_cycle);
    v.finish();
  }
  if (r.has("timing")) {
    Reader t(r.sub("timing"), "timing");
    t.str("model", c.timing.model);
    t.num("launch_cycles", c.timing.launch_cycles);
    t.num("megacore", c.timing.megacore);
    t.num("mxu_efficiency", c.timing.mxu_efficiency);
    t.num("hbm_efficiency", c.timing.hbm_efficiency);
    t.num("memory_overlap", c.timing.memory_overlap);
    t.num("wide_hbm_efficiency", c.timing.wide_hbm_efficiency);
    t.num("reduce_cycles", c.timing.reduce_cycles);
    t.num("dma_cycles", c.timing.dma_cycles);
    t.num("weight_load_exposed", c.timing.weight_load_exposed);
    t.num("convert_elems_per_cycle", c.timing.convert_elems_per_cycle);
    t.num("restream_elems_per_cycle", c.timing.restream_elems_per_cycle);
    t.finish();
  }
  r.finish();
  c.validate();
  return c;
}

ChipConfig config_from_json_text(const std::string& text) {
  return config_from_json(detail::parse_json_text(text, "chip config"));
}

json config_to_json(const ChipConfig& c) {
  json j;
  j["name"] = c.name;
  j["description"] = c.description;
  j["sources"] = c.sources;
  j["notes"] = c.notes;
  j["clock_ghz"] = c.clock_ghz;
  j["cores_per_chip"] = c.cores_per_chip;
  j["published_peak_tflops"] = c.published_peak_tflops;
  j["published_fp8_tflops"] = c.published_fp8_tflops;
  j["mxu"] = {{"count", c.mxu.count},
              {"rows", c.mxu.rows},
              {"cols", c.mxu.cols},
              {"fill_cycles", c.mxu.fill_cycles},
              {"drain_cycles", c.mxu.drain_cycles},
              {"weight_load_cycles_per_row", c.mxu.weight_load_cycles_per_row},
              {"bf16_cycles_per_row", c.mxu.bf16_cycles_per_row},
              {"f32_cycles_per_row", c.mxu.f32_cycles_per_row},
              {"int8_cycles_per_row", c.mxu.int8_cycles_per_row},
              {"fp8_cycles_per_row", c.mxu.fp8_cycles_per_row}};
  j["vpu"] = {{"sublanes", c.vpu.sublanes},
              {"lanes", c.vpu.lanes},
              {"cycles_per_vreg", c.vpu.cycles_per_vreg},
              {"latency", c.vpu.latency}};
  j["eup"] = {{"cycles_per_vreg", c.eup.cycles_per_vreg}, {"latency", c.eup.latency}};
  j["xlu"] = {{"reduce_cycles_per_vreg", c.xlu.reduce_cycles_per_vreg},
              {"transpose_cycles_per_vreg", c.xlu.transpose_cycles_per_vreg},
              {"latency", c.xlu.latency}};
  j["scalar"] = {{"issue_cycles", c.scalar.issue_cycles},
                 {"queue_depth", c.scalar.queue_depth},
                 {"registers", c.scalar.registers},
                 {"semaphores", c.scalar.semaphores}};
  j["memory"] = {{"vmem_bytes", c.memory.vmem_bytes},
                 {"hbm_bytes", c.memory.hbm_bytes},
                 {"hbm_bandwidth_gbps", c.memory.hbm_bandwidth_gbps}};
  j["timing"] = {{"model", c.timing.model},
                 {"launch_cycles", c.timing.launch_cycles},
                 {"megacore", c.timing.megacore},
                 {"mxu_efficiency", c.timing.mxu_efficiency},
                 {"hbm_efficiency", c.timing.hbm_efficiency},
                 {"memory_overlap", c.timing.memory_overlap},
                 {"wide_hbm_efficiency", c.timing.wide_hbm_efficiency},
                 {"reduce_cycles", c.timing.reduce_cycles},
                 {"dma_cycles", c.timing.dma_cycles},
                 {"weight_load_exposed", c.timing.weight_load_exposed},
                 {"convert_elems_per_cycle", c.timing.convert_elems_per_cycle},
                 {"restream_elems_per_cycle", c.timing.restream_elems_per_cycle}};
  j["dma"] = {{"engines", c.dma.engines},
              {"latency_cycles", c.dma.latency_cycles},
              {"engine_bytes_per_cycle", c.dma.engine_bytes_per_cycle}};
  return j;
}

}  // namespace tpu::sim
