#include "sim/presets.h"

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sim/error.h"

namespace tpu::sim {
namespace {

// Sources for the published figures. DMA latency, engine count, pipeline fill/drain and the
// vector/transcendental/cross-lane costs are not published: they are modeling choices.
// "timing" (config.h, TimingConfig; sim/README.md "Timing models"): fitted on the in-tree TPU v4
// measurements (sim/calibration/tpu_v4) for v4 (`tpu-calib --fit`): launch 0.911 us (957 cycles),
// a row reduction 1.00 us more (1053 cycles), MXU 82.9% of peak sustained, HBM 30.7% of peak for
// kernels storing 16-bit vector results and 69.7% for the others, no overlap of compulsory
// traffic with compute. XLA's float16 matmul kernels (xla_matmul_cycles): float16 converted to
// bf16 at 310 elements per cycle (the prefetched operand once, a streamed A once per 128-column
// MXU panel of N), a streamed operand XLA re-feeds (xla_matmul_refeeds) transposed and converted
// at 192 elements per cycle per panel (fitted on matmul_large; sim/README.md "XLA's float16 matmul
// kernels"); off on the other presets.
// Other presets, by rule (no silicon measurement of theirs in the tree): the fixed costs as the
// same time in their own cycles; mxu_efficiency and memory_overlap as v4's (the same ratio to
// their own peaks). The HBM fractions from the published kernel figure: Ragged Paged Attention
// (Jiang et al., arXiv 2604.15464), Llama 3 8B on TPU7x: up to 86% of HBM bandwidth in decode.
// That kernel stores its bf16 output from the vector unit, so here it is a 16-bit-store kernel
// (about 2/3 of its written bytes; the rest is the KV cache update's copy): v7's hbm_efficiency
// and wide_hbm_efficiency are both 0.86 (one figure cannot separate them). v5e, v5p and v6e have
// no published kernel bandwidth figure of their own; the same kernel is vLLM's TPU attention
// backend on them, so they take v7's fraction of their own peak (rule "C7" in sim/README.md).
// v4's lower 16-bit-store fraction (0.307) is a fit of XLA's v4 kernels and stays v4's.
// megacore = 2 where two TensorCores act as one device (v4, v5p); v7's dies are separate devices.
const char* kTiny = R"JSON({
  "name": "tiny",
  "description": "A tiny chip for tests: 2 MXUs of 8x8, a 2x8 vector unit, small memories.",
  "sources": ["synthetic (no hardware): sized for fast tests"],
  "notes": ["published_peak_tflops is the model's own peak"],
  "clock_ghz": 1.0,
  "cores_per_chip": 1,
  "published_peak_tflops": 0.256,
  "mxu": {"count": 2, "rows": 8, "cols": 8, "fill_cycles": 8, "drain_cycles": 8,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 4, "int8_cycles_per_row": 0.5},
  "vpu": {"sublanes": 2, "lanes": 8, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 6},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 4},
  "scalar": {"issue_cycles": 1, "queue_depth": 8, "registers": 32, "semaphores": 16},
  "memory": {"vmem_bytes": 262144, "hbm_bytes": 4194304, "hbm_bandwidth_gbps": 16},
  "dma": {"engines": 2, "latency_cycles": 20, "engine_bytes_per_cycle": 16}
})JSON";

// v4 figures and their sources (per chip unless "per core"; sim/README.md "Published chip figures"):
//   published_peak_tflops 275 (bf16): Cloud TPU docs, "TPU v4" system architecture page
//   fp8: none published (fp8_cycles_per_row 0)
//   HBM 32 GiB, 1200 GB/s per chip (16 GiB, 600 GB/s per core): Cloud TPU docs, "TPU v4" page
//   ICI 6 links, 45 GB/s per link and direction, 3-D torus of 4096 chips: the JAX scaling book,
//     "How to think about TPUs" (ICI table); Cloud TPU docs "TPU v4" (3-D torus, 4096 chips); sim/ici.cpp
//   VMEM 16 MiB per core: the JAX scaling book (TPU chapter) and the Pallas TPU docs
//   clock 1.05 GHz: Jouppi et al., ISCA 2023; equals 275e12 / (2 cores x 4 MXU x 128 x 128 x 2)
const char* kV4 = R"JSON({
  "name": "v4",
  "description": "TPU v4-like TensorCore: 4 MXUs 128x128 at 1.05 GHz; a v4 chip has 2 cores (275 bf16 TFLOP/s, 32 GiB HBM at 1200 GB/s), so one core gets half the HBM.",
  "sources": ["https://cloud.google.com/tpu/docs/v4",
              "Jouppi et al., TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning, ISCA 2023 (arXiv:2304.01433)",
              "https://jax-ml.github.io/scaling-book/tpus/",
              "https://docs.jax.dev/en/latest/pallas/tpu/details.html"],
  "notes": ["per core: HBM 16 GiB and 600 GB/s (half of the chip's)", "DMA latency and engine count are modeling choices"],
  "clock_ghz": 1.05,
  "cores_per_chip": 2,
  "published_peak_tflops": 275,
  "mxu": {"count": 4, "rows": 128, "cols": 128, "fill_cycles": 128, "drain_cycles": 128,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 6, "int8_cycles_per_row": 1, "fp8_cycles_per_row": 0},
  "vpu": {"sublanes": 8, "lanes": 128, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 16},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 16},
  "scalar": {"issue_cycles": 1, "queue_depth": 16, "registers": 32, "semaphores": 32},
  "memory": {"vmem_bytes": 16777216, "hbm_bytes": 17179869184, "hbm_bandwidth_gbps": 600},
  "dma": {"engines": 4, "latency_cycles": 500, "engine_bytes_per_cycle": 1024},
  "timing": {"model": "calibrated", "launch_cycles": 957, "megacore": 2, "mxu_efficiency": 0.829,
             "hbm_efficiency": 0.307, "wide_hbm_efficiency": 0.697, "reduce_cycles": 1053, "memory_overlap": 0,
             "convert_elems_per_cycle": 310, "restream_elems_per_cycle": 192}
})JSON";

// v5e figures and their sources:
//   published_peak_tflops 197 (bf16), int8 393 TOP/s: Cloud TPU docs, "TPU v5e" system architecture page
//   fp8: none published (fp8_cycles_per_row 0)
//   HBM 16 GiB, 819 GB/s: Cloud TPU docs, "TPU v5e" page
//   ICI 4 ports, 400 GB/s bidirectional per chip, 2-D torus of 256 chips: Cloud TPU docs, "TPU v5e";
//     per link and direction 45 GB/s: the JAX scaling book's ICI table (sim/ici.cpp)
//   VMEM 128 MiB: the JAX scaling book (TPU chapter); not on Google's pages
//   clock 1.5 GHz: not published; derived from the peak, 197e12 / (4 MXU x 128 x 128 x 2)
const char* kV5e = R"JSON({
  "name": "v5e",
  "description": "TPU v5e-like chip: 1 TensorCore, 4 MXUs 128x128 at 1.5 GHz (197 bf16 TFLOP/s), 16 GiB HBM at 819 GB/s, 128 MiB VMEM.",
  "sources": ["https://cloud.google.com/tpu/docs/v5e",
              "https://jax-ml.github.io/scaling-book/tpus/",
              "https://docs.jax.dev/en/latest/pallas/tpu/details.html"],
  "notes": ["int8 peak 394 TOP/s: int8 streams two rows per cycle", "DMA latency and engine count are modeling choices"],
  "clock_ghz": 1.5,
  "cores_per_chip": 1,
  "published_peak_tflops": 197,
  "mxu": {"count": 4, "rows": 128, "cols": 128, "fill_cycles": 128, "drain_cycles": 128,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 6, "int8_cycles_per_row": 0.5, "fp8_cycles_per_row": 0},
  "vpu": {"sublanes": 8, "lanes": 128, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 16},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 16},
  "scalar": {"issue_cycles": 1, "queue_depth": 16, "registers": 32, "semaphores": 32},
  "memory": {"vmem_bytes": 134217728, "hbm_bytes": 17179869184, "hbm_bandwidth_gbps": 819},
  "dma": {"engines": 4, "latency_cycles": 500, "engine_bytes_per_cycle": 1024},
  "timing": {"model": "calibrated", "launch_cycles": 1367, "megacore": 1, "mxu_efficiency": 0.829,
             "hbm_efficiency": 0.86, "wide_hbm_efficiency": 0.86, "reduce_cycles": 1504, "memory_overlap": 0}
})JSON";

// v5p figures and their sources:
//   published_peak_tflops 459 (bf16), fp8 459 (the same rate): Cloud TPU docs, "TPU v5p" and "TPU7x"
//     pages (the TPU7x page's comparison table)
//   HBM 95 GiB, 2765 GB/s per chip: Cloud TPU docs, "TPU v5p" page
//   ICI 1200 GB/s bidirectional per chip, 3-D torus of 8960 chips: Cloud TPU docs, "TPU v5p";
//     6 links of 90 GB/s per direction: the JAX scaling book's ICI table (sim/ici.cpp)
//   VMEM: not published; 128 MiB assumed (v5e's)
//   clock 1.75 GHz: not published; derived from the peak, 459e12 / (2 cores x 4 MXU x 128 x 128 x 2)
const char* kV5p = R"JSON({
  "name": "v5p",
  "description": "TPU v5p-like TensorCore: 4 MXUs 128x128 at 1.75 GHz; a v5p chip has 2 cores (459 bf16 TFLOP/s, 95 GiB HBM at 2765 GB/s), so one core gets half the HBM.",
  "sources": ["https://cloud.google.com/tpu/docs/v5p",
              "https://jax-ml.github.io/scaling-book/tpus/"],
  "notes": ["per core: HBM 47.5 GiB and 1382.5 GB/s (half of the chip's)",
            "VMEM size is not published for v5p: 128 MiB assumed (as v5e)",
            "clock derived from the peak: 459e12 / (2 cores x 4 MXU x 128 x 128 x 2)"],
  "clock_ghz": 1.75,
  "cores_per_chip": 2,
  "published_peak_tflops": 459,
  "published_fp8_tflops": 459,
  "mxu": {"count": 4, "rows": 128, "cols": 128, "fill_cycles": 128, "drain_cycles": 128,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 6, "int8_cycles_per_row": 0.5, "fp8_cycles_per_row": 1},
  "vpu": {"sublanes": 8, "lanes": 128, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 16},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 16},
  "scalar": {"issue_cycles": 1, "queue_depth": 16, "registers": 32, "semaphores": 32},
  "memory": {"vmem_bytes": 134217728, "hbm_bytes": 51002736640, "hbm_bandwidth_gbps": 1382.5},
  "dma": {"engines": 4, "latency_cycles": 500, "engine_bytes_per_cycle": 1024},
  "timing": {"model": "calibrated", "launch_cycles": 1595, "megacore": 2, "mxu_efficiency": 0.829,
             "hbm_efficiency": 0.86, "wide_hbm_efficiency": 0.86, "reduce_cycles": 1755, "memory_overlap": 0}
})JSON";

// v6e (Trillium) figures and their sources:
//   published_peak_tflops 918 (bf16), fp8 918 (the same rate), int8 1836 TOP/s: Cloud TPU docs, "TPU v6e"
//     and "TPU7x" pages
//   HBM 32 GiB, 1640 GB/s: Cloud TPU docs, "TPU v6e" page (one revision lists 1638 GBps)
//   ICI 4 ports, 800 GB/s bidirectional per chip, 2-D torus of 256 chips: Cloud TPU docs, "TPU v6e";
//     per link and direction 90 GB/s: the JAX scaling book's ICI table (sim/ici.cpp)
//   VMEM 128 MiB: the JAX scaling book (TPU chapter); not on Google's pages
//   MXUs: the v6e page names two 256x256 MXUs per TensorCore, which at the published peak would need
//     a 3.5 GHz clock; the preset keeps the scaling book's four at 1.75 GHz (the same peak)
//   clock 1.75 GHz: not published; derived from the peak, 918e12 / (4 MXU x 256 x 256 x 2)
const char* kV6e = R"JSON({
  "name": "v6e",
  "description": "TPU v6e (Trillium)-like chip: 1 TensorCore, 4 MXUs 256x256 at 1.75 GHz (918 bf16 TFLOP/s), 32 GiB HBM at 1640 GB/s, 128 MiB VMEM.",
  "sources": ["https://cloud.google.com/tpu/docs/v6e",
              "https://jax-ml.github.io/scaling-book/tpus/"],
  "notes": ["clock derived from the peak: 918e12 / (4 MXU x 256 x 256 x 2)"],
  "clock_ghz": 1.75,
  "cores_per_chip": 1,
  "published_peak_tflops": 918,
  "published_fp8_tflops": 918,
  "mxu": {"count": 4, "rows": 256, "cols": 256, "fill_cycles": 256, "drain_cycles": 256,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 6, "int8_cycles_per_row": 0.5, "fp8_cycles_per_row": 1},
  "vpu": {"sublanes": 8, "lanes": 128, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 16},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 16},
  "scalar": {"issue_cycles": 1, "queue_depth": 16, "registers": 32, "semaphores": 32},
  "memory": {"vmem_bytes": 134217728, "hbm_bytes": 34359738368, "hbm_bandwidth_gbps": 1640},
  "dma": {"engines": 4, "latency_cycles": 500, "engine_bytes_per_cycle": 2048},
  "timing": {"model": "calibrated", "launch_cycles": 1595, "megacore": 1, "mxu_efficiency": 0.829,
             "hbm_efficiency": 0.86, "wide_hbm_efficiency": 0.86, "reduce_cycles": 1755, "memory_overlap": 0}
})JSON";

// v7 (TPU7x, Ironwood) figures and their sources:
//   published_peak_tflops 2307 (bf16), fp8 4614 (twice the bf16 rate): Cloud TPU docs, "TPU7x (Ironwood)"
//     page and "TPU7x performance optimizations" (fp8); Google's Ironwood announcement (4,614 TFLOPs)
//   HBM 192 GiB, 7370 GB/s per chip: Cloud TPU docs, "TPU7x"; the Ironwood announcement (7.37 TB/s)
//   ICI 1.2 TB/s bidirectional per chip, 3-D torus, 9216 chips per pod: the Ironwood announcement and
//     the TPU7x page; 6 links of 100 GB/s per direction = 1.2 TB/s / 6 / 2 (sim/ici.cpp)
//   VMEM 64 MiB per die: not on Google's pages; a modeling choice (half of v6e's, as the dies split)
//   clock 2.2 GHz: not published; derived from the peak, 2307e12 / (2 dies x 4 MXU x 256 x 256 x 2)
const char* kV7 = R"JSON({
  "name": "v7",
  "description": "TPU7x (Ironwood)-like TensorCore die: 4 MXUs 256x256 at 2.2 GHz; a chip has 2 TensorCore dies (2307 bf16 TFLOP/s, 192 GiB HBM at 7370 GB/s), modeled as two devices, so one die gets half the HBM.",
  "sources": ["https://cloud.google.com/tpu/docs/tpu7x",
              "https://blog.google/products/google-cloud/ironwood-tpu-age-of-inference/",
              "https://jax-ml.github.io/scaling-book/tpus/"],
  "notes": ["per die: HBM 96 GiB and 3685 GB/s (half of the chip's)",
            "clock derived from the peak: 2307e12 / (2 dies x 4 MXU x 256 x 256 x 2)",
            "VMEM 64 MiB per die"],
  "clock_ghz": 2.2,
  "cores_per_chip": 2,
  "published_peak_tflops": 2307,
  "published_fp8_tflops": 4614,
  "mxu": {"count": 4, "rows": 256, "cols": 256, "fill_cycles": 256, "drain_cycles": 256,
          "weight_load_cycles_per_row": 1, "bf16_cycles_per_row": 1,
          "f32_cycles_per_row": 6, "int8_cycles_per_row": 0.5, "fp8_cycles_per_row": 0.5},
  "vpu": {"sublanes": 8, "lanes": 128, "cycles_per_vreg": 1, "latency": 2},
  "eup": {"cycles_per_vreg": 4, "latency": 16},
  "xlu": {"reduce_cycles_per_vreg": 2, "transpose_cycles_per_vreg": 4, "latency": 16},
  "scalar": {"issue_cycles": 1, "queue_depth": 16, "registers": 32, "semaphores": 32},
  "memory": {"vmem_bytes": 67108864, "hbm_bytes": 103079215104, "hbm_bandwidth_gbps": 3685},
  "dma": {"engines": 4, "latency_cycles": 500, "engine_bytes_per_cycle": 4096},
  "timing": {"model": "calibrated", "launch_cycles": 2005, "megacore": 1, "mxu_efficiency": 0.829,
             "hbm_efficiency": 0.86, "wide_hbm_efficiency": 0.86, "reduce_cycles": 2206, "memory_overlap": 0}
})JSON";

const std::map<std::string, std::string>& table() {
  static const std::map<std::string, std::string> t = {
      {"tiny", kTiny}, {"v4", kV4}, {"v5e", kV5e}, {"v5p", kV5p}, {"v6e", kV6e}, {"v7", kV7}};
  return t;
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "v4", "v5e", "v5p", "v6e", "v7"}; }

namespace {
// "<preset>-ideal": the preset with the ideal timing model (what-if studies; tests of the
// event timeline). Its JSON is generated once and kept for the process.
bool ideal_variant(const std::string& name, std::string* base) {
  const std::string suffix = "-ideal";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  *base = name.substr(0, name.size() - suffix.size());
  return table().count(*base) > 0;
}
}  // namespace

const std::string& preset_json(const std::string& name) {
  std::string base;
  if (ideal_variant(name, &base)) {
    static std::mutex mu;
    static std::map<std::string, std::string> made;
    std::lock_guard<std::mutex> lock(mu);
    auto& text = made[name];
    if (text.empty()) {
      ChipConfig c = config_from_json_text(table().at(base));
      c.name = name;
      c.timing.model = "ideal";
      text = config_to_json(c).dump(2);
    }
    return text;
  }
  auto it = table().find(name);
  if (it == table().end()) {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw SimError(fmt::format("unknown chip preset '{}' (known: {}; '<name>-ideal' selects the ideal timing model)", name, known));
  }
  return it->second;
}

ChipConfig preset_config(const std::string& name) { return config_from_json_text(preset_json(name)); }

ChipConfig load_config(const std::string& s) {
  std::string base;
  if (table().count(s) || ideal_variant(s, &base)) return preset_config(s);
  size_t first = s.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && s[first] == '{') return config_from_json_text(s);
  std::ifstream in(s);
  if (!in) {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw SimError(fmt::format("chip '{}' is neither a preset ({}) nor a readable JSON file", s, known));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return config_from_json_text(ss.str());
  } catch (const SimError& e) {
    throw SimError(fmt::format("{}: {}", s, e.what()));
  }
}

}  // namespace tpu::sim
