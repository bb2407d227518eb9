// Serving a Llama-3.1-8B-shaped model on the simulated chip, timing-only, with the serving
// engine's step: one ragged batch of decode tokens and prefill chunks per step, the layer's
// projections and MLP over the flattened token row (no padding rows), attention and the cache
// update by the chip's ragged paged attention program (codegen/paged_attention.h), the final
// norm and the lm_head only on the rows that sample (none: no lm_head). The layer's dense parts
// run as two compiled functions (tpu::compile: norm + q/k/v projections + RoPE before the
// attention program; o_proj + residual + norm + SwiGLU MLP + residual after it), as vLLM's TPU
// backend runs compiled graphs; TPU_SERVE_SIM_EAGER=1 runs them op by op as the engine's eager
// step does, TPU_SERVE_SIM_BREAKDOWN=1 prints the cycles per kernel of each costed step. sim:0 is the v6e preset on its calibrated timing model,
// sim:1 the same preset on the ideal model (TPU_SERVE_SIM_CHIP=<preset> changes the preset).
// bf16 weights and KV cache, block size 16. All 32 layers are alike: one layer is costed and
// counted 32 times; the embedding lookup is left out.
//
// The workload is vLLM's published one for one v6e chip: 1,000 requests of 1,800 random prompt
// tokens and 128 output tokens, all sent at once, on the server settings of the run behind the
// published 15.1k tokens/s (vLLM pull request 16458, "[TPU] Increase block size and reset block
// shapes", its "before" run: 7.87 requests/s, 15,105 total tokens/s): --max-num-batched-tokens
// 512, --gpu-memory-utilization 0.95, --max-model-len 2048, --max-num-seqs 512, V1 engine
// (chunked prefill). Rather than simulating every step, the bench costs representative steps
// of the steady state and extrapolates (the rule, stated in the counters' README entry):
//  - KV capacity C: the KV cache gets 95% of HBM minus the weights; C = that / (1,928 positions
//    x 128 KiB per position), the sequences that fit at full length (65 on v6e).
//  - steady state (Little's law): a request costs 1,800 prefill tokens and 127 decode tokens
//    (its first output token comes out of its last prefill chunk). The scheduler runs every
//    decoding sequence and fills the rest of the 512-token budget with prefill chunks, so a
//    step decodes d = round(512 x 127 / 1,927) = 34 sequences and prefills 512 - d = 478
//    prompt tokens; the budget binds before the KV cache (d + 1 < C). Requests/s = the step's
//    tokens / 1,927 / step time. (Where the KV cache binds, d = C - 1 and the step prefills
//    1,800 d / 127 tokens.)
//  - step time: the mean of 4 steps whose prefill chunk starts at 0, 1/4, 1/2 and 3/4 of a
//    prompt (a chunk crossing the prompt's end continues with the next prompt), the decode
//    contexts spread evenly over 1,801..1,927.
//  - the lm_head runs on the sampling rows padded to a power of two, at least 8, as vLLM's V1
//    TPU model runner pads its request count to a compiled size (its
//    _get_padded_num_reqs_with_upper_limit, MIN_NUM_SEQS = 8); a full step's 512 tokens are its
//    largest token bucket, so the token rows need no padding (with TPU_SERVE_SIM_BUDGET, a step
//    short of a bucket is not padded to it either).
//  - not modeled: host time between steps (scheduling, input preparation, the sampled tokens'
//    transfer; no published figure for this run), the ramp of the 1,000-request run.
// Counters: req_per_s, output_tok_per_s, total_tok_per_s, TPOT_ms (the step time: every decoding
// sequence gets one token per step), usd_per_M_total_tok / usd_per_M_out_tok at kUsdPerChipHour.
// BM_DecodeStep: d decodes only (HBM_BW_pct of the whole step, attn_BW_pct of the attention
// program alone); BM_PrefillStep: one 1,024-token chunk at the start of a prompt (MFU_pct of the
// step with attention FLOPs counted causally, attn_MFU_pct of the attention program alone);
// BM_PrefillLinear: one bf16 linear of a 1,024-token prefill step alone (MFU_pct).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "codegen/launch.h"
#include "codegen/paged_attention.h"
#include "device/profiling.h"
#include "device/sim_driver.h"
#include "sim/timing_model.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/models.h"
#include "tpucore/streams.h"

namespace {

using namespace tpu;

constexpr int64_t kLayers = 32, kHidden = 4096, kInter = 14336, kHeads = 32, kKvHeads = 8, kHeadDim = 128,
                  kVocab = 128256, kBlock = 16, kIn = 1800, kOut = 128, kRequests = 1000;
constexpr double kUsdPerChipHour = 2.70;  // assumed on-demand price of one v6e chip-hour
// The published run's server settings (vLLM pull request 16458's benchmark command).
constexpr int64_t kMaxBatchedTokens = 512;  // --max-num-batched-tokens 512 (TPU_SERVE_SIM_BUDGET=<tokens> changes it)
constexpr double kMemoryUtilization = 0.95; // --gpu-memory-utilization 0.95

std::string preset() {
  const char* e = std::getenv("TPU_SERVE_SIM_CHIP");
  return e && *e ? e : "v6e";
}

struct Parts {
  Device dev;
  std::shared_ptr<models::DecoderLayer> layer;
  std::shared_ptr<nn::RMSNorm> norm;
  Tensor head;
  std::vector<double> inv_freq;
  int64_t layer_params = 0;
  // The layer's dense parts as two compiled functions (TPU_SERVE_SIM_EAGER=1: op by op, as the
  // engine's eager step runs them): before attention x -> q, k, v (norm, projections, RoPE);
  // after it (x, attention out) -> x + o_proj + MLP block.
  std::function<std::vector<Tensor>(const Tensor&, const Tensor&, const Tensor&)> pre;
  std::function<Tensor(const Tensor&, const Tensor&)> post;
};

bool eager() {
  const char* e = std::getenv("TPU_SERVE_SIM_EAGER");
  return e && *e == '1';
}

Parts& parts(int index) {
  static Parts p[2];
  static bool made[2] = {false, false};
  if (!made[index]) {
    set_sim_chip(index == 0 ? preset() : preset() + "-ideal", index);
    Parts& q = p[index];
    q.dev = Device(DeviceType::sim, index);
    models::ModelConfig c;
    c.vocab_size = kVocab, c.hidden_size = kHidden, c.intermediate_size = kInter, c.num_hidden_layers = 1;
    c.num_attention_heads = kHeads, c.num_key_value_heads = kKvHeads, c.head_dim = kHeadDim;
    c.rope_theta = 500000.0, c.rms_norm_eps = 1e-5;
    NoGradGuard ng;
    q.layer = std::make_shared<models::DecoderLayer>(c, nullptr);
    q.layer->to(DType::bf16);
    q.layer->to(q.dev);
    q.layer->eval();
    q.layer_params = q.layer->num_parameters();
    q.norm = std::make_shared<nn::RMSNorm>(Shape{kHidden}, c.rms_norm_eps);
    q.norm->to(DType::bf16);
    q.norm->to(q.dev);
    q.head = empty({kVocab, kHidden}, {DType::bf16, q.dev});
    q.inv_freq = nn::rope_inv_freq(kHeadDim, c.rope_theta);
    models::DecoderLayer* L = q.layer.get();
    auto pre = [L](const Tensor& x, const Tensor& cos, const Tensor& sin) {
      nn::Attention& at = *L->self_attn;
      const int64_t np = x.shape()[1];
      Tensor xn = L->input_layernorm->forward(x);
      Tensor qq = reshape(at.q_proj->forward(xn), Shape{1, np, kHeads, kHeadDim});
      Tensor k = reshape(at.k_proj->forward(xn), Shape{1, np, kKvHeads, kHeadDim});
      Tensor v = reshape(at.v_proj->forward(xn), Shape{1, np, kKvHeads, kHeadDim}).contiguous();
      qq = transpose(rotary_embedding(transpose(qq, 1, 2), cos, sin), 1, 2).contiguous();
      k = transpose(rotary_embedding(transpose(k, 1, 2), cos, sin), 1, 2).contiguous();
      return std::vector<Tensor>{qq, k, v};
    };
    auto post = [L](const Tensor& x, const Tensor& out) {
      Tensor h = add(x, L->self_attn->o_proj->forward(out));
      return add(h, L->mlp->forward(L->post_attention_layernorm->forward(h)));
    };
    if (eager()) {
      q.pre = pre;
      q.post = post;
    } else {
      CompileOptions o{.name = "serve_sim_pre" + std::to_string(index), .warn_after_recompiles = 1000};
      q.pre = compile(pre, o);
      o.name = "serve_sim_post" + std::to_string(index);
      q.post = compile(post, o);
    }
    made[index] = true;
  }
  return p[index];
}

const sim::ChipConfig& chip(int index) { return device::sim_device(index).config(); }

struct Seq {
  int64_t q_len, ctx;  // new tokens, positions after the step
  bool samples;        // its last token samples (a decode, or the prompt's last chunk)
};

struct StepCost {
  double cycles = 0, attn_cycles = 0, bytes = 0, attn_bytes = 0, model_flops = 0, attn_flops = 0;
  int64_t tokens = 0;
};

// TPU_SERVE_SIM_BREAKDOWN=2: every program run of a costed step, summed per program (the host op
// or region that launched it), with what the calibrated model priced: cycles (calibrated and
// ideal), HBM bytes read and written, MXU FLOPs, the compute term C (MXU streaming at
// mxu_efficiency, or the busiest vector unit), the memory term M (compulsory bytes at the HBM
// fraction given by the share s of written bytes stored as 16-bit vector results:
// s / hbm_efficiency + (1 - s) / wide_hbm_efficiency) and the fixed costs (launch, reduce).
struct RunRow {
  double runs = 0, cycles = 0, ideal = 0, read = 0, written = 0, flops = 0, c_mxu = 0, c_vec = 0, m = 0, m16 = 0, fixed = 0;
};
class BreakdownSink : public device::ProgramRunSink {
 public:
  void on_program_run(device::ProgramRun&& r) override {
    const sim::Stats& s = r.stats;
    const sim::ChipConfig& cfg = device::sim_device(0).config();  // the calibrated preset (index 0)
    const sim::TimingConfig& t = cfg.timing;
    const sim::CountedWork& w = s.work;
    double cm = 0, cv = 0, narrow = 0;
    bool reduces = false;
    for (const sim::CoreWork& k : w.cores) {
      cm = std::max(cm, (k.mxu_stream_cycles + t.weight_load_exposed * k.mxu_weight_cycles) / (cfg.mxu.count * std::max(1e-9, t.mxu_efficiency)));
      cv = std::max(cv, k.vector_cycles);
      narrow += k.narrow_store_bytes;
      reduces = reduces || k.xlu_cycles > 0;
    }
    const double bw = cfg.hbm_bytes_per_cycle() * std::max(1, t.megacore);
    const double share = w.compulsory_written_bytes > 0 ? std::min(1.0, narrow / double(w.compulsory_written_bytes)) : 0.0;
    std::lock_guard<std::mutex> lk(mu_);
    RunRow& row = rows_[r.tag.empty() ? r.program : r.tag];
    row.runs += 1;
    row.cycles += s.cycles;
    row.ideal += s.ideal_cycles;
    row.read += double(s.hbm_bytes_read);
    row.written += double(s.hbm_bytes_written);
    row.flops += s.mxu_flops;
    row.c_mxu += cm;
    row.c_vec += cv;
    row.m += double(w.compulsory_bytes()) / bw;
    row.m16 += share * double(w.compulsory_bytes()) / bw;  // bytes priced at hbm_efficiency, in peak cycles
    row.fixed += t.launch_cycles + (reduces ? t.reduce_cycles : 0);
  }
  void on_program_enqueued(device::SimDevice&) override {}
  bool wants_trace() const override { return false; }
  void print(double clock_hz) {
    std::lock_guard<std::mutex> lk(mu_);
    std::fprintf(stderr, "  %-34s %5s %10s %10s %9s %9s %9s %9s %9s %9s %6s %8s\n", "program", "runs", "cal_us", "ideal_us", "read_MB",
                 "write_MB", "GFLOP", "C_mxu_us", "C_vec_us", "M_pk_us", "s16", "fix_us");
    RunRow tot;
    for (const auto& [name, r] : rows_) {
      auto us = [&](double c) { return c / clock_hz * 1e6; };
      std::fprintf(stderr, "  %-34s %5.0f %10.1f %10.1f %9.2f %9.2f %9.2f %9.1f %9.1f %9.1f %6.2f %8.1f\n", name.c_str(), r.runs, us(r.cycles),
                   us(r.ideal), r.read / 1e6, r.written / 1e6, r.flops / 1e9, us(r.c_mxu), us(r.c_vec), us(r.m),
                   r.m > 0 ? r.m16 / r.m : 0.0, us(r.fixed));
      tot.runs += r.runs, tot.cycles += r.cycles, tot.ideal += r.ideal, tot.read += r.read, tot.written += r.written;
      tot.flops += r.flops, tot.c_mxu += r.c_mxu, tot.c_vec += r.c_vec, tot.m += r.m, tot.m16 += r.m16, tot.fixed += r.fixed;
    }
    auto us = [&](double c) { return c / clock_hz * 1e6; };
    std::fprintf(stderr, "  %-34s %5.0f %10.1f %10.1f %9.2f %9.2f %9.2f %9.1f %9.1f %9.1f %6.2f %8.1f\n", "total (one layer)", tot.runs,
                 us(tot.cycles), us(tot.ideal), tot.read / 1e6, tot.written / 1e6, tot.flops / 1e9, us(tot.c_mxu), us(tot.c_vec),
                 us(tot.m), tot.m > 0 ? tot.m16 / tot.m : 0.0, us(tot.fixed));
    rows_.clear();
  }

 private:
  std::mutex mu_;
  std::map<std::string, RunRow> rows_;
};

int breakdown_level() {
  const char* e = std::getenv("TPU_SERVE_SIM_BREAKDOWN");
  return e && *e ? std::atoi(e) : 0;
}

// Chip cycles, HBM bytes and the paged attention program's cycles of fn (timing-only).
struct Probe {
  double cycles, bytes, attn;
};
template <class F>
Probe measure(const Device& dev, F&& fn) {
  synchronize(dev);
  reset_sim_stats();
  static BreakdownSink sink;
  const int level = breakdown_level();
  if (level >= 2 && dev.index == 0) device::set_program_run_sink(&sink);
  fn();
  synchronize(dev);
  if (level >= 2 && dev.index == 0) {
    device::set_program_run_sink(nullptr);
    sink.print(device::sim_device(0).config().clock_ghz * 1e9);
  }
  const SimStats s = sim_stats();
  const codegen::CodegenStats cs = codegen::stats();
  if (level == 1)
    for (const auto& [name, cyc] : cs.cycles_by_kernel)
      std::fprintf(stderr, "  %-40s %6llu runs %12.0f cycles\n", name.c_str(),
                   (unsigned long long)cs.runs_by_kernel.at(name), cyc);
  auto it = cs.cycles_by_kernel.find("paged_attention");
  return {s.cycles, double(s.hbm_bytes), it == cs.cycles_by_kernel.end() ? 0.0 : it->second};
}

// The request count a step's sampling runs on: vLLM's V1 TPU model runner pads it to a power of
// two of at least 8 (MIN_NUM_SEQS), at most --max-num-seqs (512), so that each size is one
// compiled graph.
int64_t padded_requests(int64_t n) {
  int64_t p = 8;
  while (p < n) p *= 2;
  return std::min<int64_t>(p, 512);
}

// One serving step of these sequences: 32 x (one layer) + the final norm and the lm_head on
// the sampling rows.
StepCost step_cost(int index, const std::vector<Seq>& seqs) {
  Parts& p = parts(index);
  SimTimingOnly timing;
  NoGradGuard ng;
  codegen::PagedAttentionSpec spec{.heads = kHeads, .kv_heads = kKvHeads, .head_dim = kHeadDim, .block_size = kBlock};
  spec.scale = float(1.0 / std::sqrt(double(kHeadDim)));
  spec.dtype = sim::DType::bf16;
  spec.mode = sim::MxuMode::bf16;
  codegen::choose_paged_attention_tiling(chip(index), spec);
  std::vector<int64_t> qs{0}, ctx, pos;
  std::vector<std::vector<int32_t>> tables;
  int32_t next_block = 0;
  int64_t sampling = 0;
  StepCost c;
  for (const Seq& s : seqs) {
    qs.push_back(qs.back() + s.q_len);
    ctx.push_back(s.ctx);
    std::vector<int32_t> t;
    for (int64_t b = 0; b < (s.ctx + kBlock - 1) / kBlock; ++b) t.push_back(next_block++);
    tables.push_back(std::move(t));
    for (int64_t i = 0; i < s.q_len; ++i) {
      pos.push_back(s.ctx - s.q_len + i);
      c.attn_flops += 4.0 * kHeads * kHeadDim * double(s.ctx - s.q_len + i + 1);
    }
    sampling += s.samples;
  }
  const int64_t units = codegen::paged_attention_units(spec, qs);
  while (spec.max_units < units) spec.max_units *= 2;
  std::vector<const std::vector<int32_t>*> tp;
  for (const auto& t : tables) tp.push_back(&t);
  const codegen::PagedAttentionMeta meta = codegen::plan_paged_attention(spec, next_block, qs, ctx, tp);
  const int64_t n = meta.num_tokens, np = n;  // the kernel needs no query rows past the tokens
  const Device dev = p.dev;
  auto i32 = [&](const std::vector<int32_t>& v) {
    return from_vector(v, Shape{int64_t(v.size())}, TensorOptions(DType::i32, dev));
  };
  const Tensor units_t = i32(meta.units), pages_t = i32(meta.pages), slots_t = i32(meta.slots);
  const Tensor kc = empty({int64_t(next_block) * kBlock, kKvHeads * kHeadDim}, {DType::bf16, dev});
  const Tensor vc = empty({int64_t(next_block) * kBlock, kKvHeads * kHeadDim}, {DType::bf16, dev});
  auto [cos, sin] = nn::rope_tables(pos, 1, p.inv_freq, DType::bf16, dev);
  const Tensor x = empty({1, np, kHidden}, {DType::bf16, dev});
  Tensor h;
  const Tensor out = empty({1, np, kHeads * kHeadDim}, {DType::bf16, dev});
  if (!eager()) {  // compile for this shape first (the warm-up step of a bucket)
    std::vector<Tensor> qkv = p.pre(x, cos, sin);
    h = p.post(x, out);
    synchronize(dev);
  }
  const Probe lp = measure(dev, [&] {
    std::vector<Tensor> qkv = p.pre(x, cos, sin);
    codegen::run_paged_attention(spec, n, qkv[0], qkv[1], qkv[2], kc, vc, out, units_t, pages_t, slots_t);
    h = p.post(x, out);
  });
  Probe hp{0, 0, 0};  // no row samples (a prefill chunk short of its prompt's end): no lm_head
  if (sampling > 0) {
    const Tensor rows = empty({1, padded_requests(sampling), kHidden}, {DType::bf16, dev});
    hp = measure(dev, [&] { (void)linear(p.norm->forward(rows), p.head); });
  }
  // The attention program's HBM bytes, from its plan (the count the tiny-chip test checks).
  const double row = kKvHeads * kHeadDim * 2.0, page = kBlock * row;
  const double q_bytes = double(qs.back()) * kHeads * kHeadDim * 2.0;
  c.attn_bytes = 4.0 * n * row + q_bytes + 2.0 * meta.kv_pages_read * page + n * kHeads * kHeadDim * 2.0;
  c.cycles = kLayers * lp.cycles + hp.cycles;
  c.attn_cycles = kLayers * lp.attn;
  c.bytes = kLayers * lp.bytes + hp.bytes;
  c.attn_bytes *= kLayers;
  c.attn_flops *= kLayers;
  c.tokens = n;
  c.model_flops = 2.0 * double(kLayers * p.layer_params) * double(n) + c.attn_flops + 2.0 * kVocab * kHidden * double(sampling);
  return c;
}

double clock_hz(int index) { return chip(index).clock_ghz * 1e9; }
double peak(int index) { return chip(index).peak_flops(); }
double hbm_bps(int index) { return chip(index).memory.hbm_bandwidth_gbps * 1e9; }

void label(benchmark::State& st, int index) {
  st.SetLabel(chip(index).name + ", " + chip(index).timing.model + " timing model");
}

// Sequences that fit in the KV cache at full length (95% of HBM minus the bf16 weights).
int64_t concurrency(int index) {
  const double weights = 2.0 * (double(kLayers * parts(index).layer_params) + 2.0 * kVocab * kHidden + kHidden);
  const double kv = kMemoryUtilization * double(chip(index).memory.hbm_bytes) - weights;
  const double per_seq = double(kIn + kOut) * kLayers * 2.0 * kKvHeads * kHeadDim * 2.0;
  return int64_t(kv / per_seq);
}

int64_t token_budget() {
  const char* e = std::getenv("TPU_SERVE_SIM_BUDGET");
  return e && *e ? std::max<int64_t>(2, std::atoll(e)) : kMaxBatchedTokens;
}

// Decoding sequences per steady-state step: the token budget's share of decodes
// (512 x 127 / 1,927, rounded), or the KV cache's C - 1 where that is fewer.
int64_t steady_decodes(int index) {
  const int64_t budget = (token_budget() * (kOut - 1) + (kIn + kOut - 1) / 2) / (kIn + kOut - 1);
  return std::min(budget, concurrency(index) - 1);
}

// Prompt tokens per steady-state step: the rest of the budget, or (KV-bound) the 1,800 d / 127
// that replace the requests leaving.
int64_t steady_prefill(int64_t d) {
  return std::min(token_budget() - d, (kIn * d + kOut - 2) / (kOut - 1));
}

std::vector<Seq> decodes(int64_t d) {
  std::vector<Seq> s;
  for (int64_t i = 0; i < d; ++i) s.push_back({1, kIn + 1 + (i * (kOut - 1)) / d, true});
  return s;
}

void BM_Workload(benchmark::State& st) {
  const int index = int(st.range(0));
  parts(index);
  const int64_t d = steady_decodes(index);
  const int64_t prefill = steady_prefill(d);
  double step_s = 0, tokens = 0, attn_s = 0;
  for (auto _ : st) {
    step_s = attn_s = tokens = 0;
    for (int sample = 0; sample < 4; ++sample) {
      std::vector<Seq> seqs = decodes(d);
      int64_t start = sample * kIn / 4, left = prefill;
      while (left > 0) {
        const int64_t chunk = std::min(left, kIn - start);
        seqs.push_back({chunk, start + chunk, start + chunk == kIn});
        left -= chunk;
        start = 0;
      }
      const StepCost c = step_cost(index, seqs);
      step_s += c.cycles / clock_hz(index) / 4;
      attn_s += c.attn_cycles / clock_hz(index) / 4;
      tokens += double(c.tokens) / 4;
    }
  }
  // Each request is 1,800 prefill and 127 decode tokens of the steps' work.
  const double req_s = tokens / double(kIn + kOut - 1) / step_s;
  st.counters["kv_capacity"] = double(concurrency(index));
  st.counters["decodes"] = double(d);
  st.counters["step_tokens"] = tokens;
  st.counters["step_ms"] = step_s * 1e3;
  st.counters["attn_share_pct"] = 100.0 * attn_s / step_s;
  st.counters["req_per_s"] = req_s;
  st.counters["output_tok_per_s"] = req_s * kOut;
  st.counters["total_tok_per_s"] = req_s * (kIn + kOut);
  st.counters["TPOT_ms"] = step_s * 1e3;
  st.counters["run_s_1000_req"] = double(kRequests) / req_s;
  st.counters["usd_per_M_total_tok"] = kUsdPerChipHour / 3600.0 / (req_s * (kIn + kOut)) * 1e6;
  st.counters["usd_per_M_out_tok"] = kUsdPerChipHour / 3600.0 / (req_s * kOut) * 1e6;
  label(st, index);
}

void BM_DecodeStep(benchmark::State& st) {
  const int index = int(st.range(0));
  parts(index);
  const int64_t d = steady_decodes(index);
  StepCost c;
  for (auto _ : st) c = step_cost(index, decodes(d));
  const double s = c.cycles / clock_hz(index), a = c.attn_cycles / clock_hz(index);
  st.counters["seqs"] = double(d);
  st.counters["step_ms"] = s * 1e3;
  st.counters["HBM_BW_pct"] = 100.0 * c.bytes / s / hbm_bps(index);
  st.counters["attn_ms"] = a * 1e3;
  st.counters["attn_BW_pct"] = 100.0 * c.attn_bytes / a / hbm_bps(index);
  label(st, index);
}

void BM_PrefillStep(benchmark::State& st) {
  const int index = int(st.range(0));
  parts(index);
  StepCost c;
  for (auto _ : st) c = step_cost(index, {{1024, 1024, false}});
  const double s = c.cycles / clock_hz(index), a = c.attn_cycles / clock_hz(index);
  st.counters["step_ms"] = s * 1e3;
  st.counters["MFU_pct"] = 100.0 * c.model_flops / s / peak(index);
  st.counters["attn_ms"] = a * 1e3;
  st.counters["attn_MFU_pct"] = 100.0 * c.attn_flops / a / peak(index);
  label(st, index);
}

// One bf16 linear of the prefill step, x [1024, k] w [n, k]^T (the layer's projections and MLP
// matmuls), MFU of the program alone.
void BM_PrefillLinear(benchmark::State& st) {
  const int index = int(st.range(0));
  const int64_t k = st.range(1), n = st.range(2), m = 1024;
  Parts& p = parts(index);
  SimTimingOnly timing;
  NoGradGuard ng;
  const Tensor x = empty({m, k}, {DType::bf16, p.dev}), w = empty({n, k}, {DType::bf16, p.dev});
  Probe pr{};
  for (auto _ : st) pr = measure(p.dev, [&] { (void)linear(x, w); });
  st.counters["MFU_pct"] = 100.0 * 2.0 * double(m * k * n) / (pr.cycles / clock_hz(index)) / peak(index);
  st.counters["cycles"] = pr.cycles;
  label(st, index);
}

}  // namespace

BENCHMARK(BM_PrefillLinear)->Args({1, 4096, 4096})->Args({1, 4096, 1024})->Args({1, 4096, 14336})->Args({1, 14336, 4096})->Args({0, 4096, 4096})->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_DecodeStep)->Arg(0)->Arg(1)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_PrefillStep)->Arg(0)->Arg(1)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_Workload)->Arg(0)->Arg(1)->Unit(benchmark::kSecond)->Iterations(1);

BENCHMARK_MAIN();
