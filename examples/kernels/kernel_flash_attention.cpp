// The flash-attention forward of flash_attention.h as a kernel op, compared with the library's
// scaled_dot_product_attention on the cpu interpreter; with --sim CHIP also on sim:0, values and
// simulated cycles (the library's attention is one fused kernel too).
//
//   kernel_flash_attention [--heads H --seq S --dim D --bq BQ --bk BK --causal 0|1 --sim CHIP]
#include <cmath>
#include <cstdio>
#include <string>

#include "compare.h"
#include "flash_attention.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: kernel_flash_attention [--heads H] [--seq S] [--dim D] [--bq BQ] [--bk BK] [--causal 0|1]\n"
               "                              [--sim CHIP]\n"
               "Runs softmax(q k^T / sqrt(D)) v as a user kernel (flash attention, online softmax) and compares it\n"
               "with the library's scaled_dot_product_attention; --sim CHIP: also on sim:0 with that chip preset.\n");
}

}  // namespace

using kernel_examples::max_rel_error;

int main(int argc, char** argv) {
  int64_t heads = 4, seq = 256, dim = 64, bq = 128, bk = 128, causal = 1;
  std::string chip;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--heads") heads = std::stoll(v);
    else if (a == "--seq") seq = std::stoll(v);
    else if (a == "--dim") dim = std::stoll(v);
    else if (a == "--bq") bq = std::stoll(v);
    else if (a == "--bk") bk = std::stoll(v);
    else if (a == "--causal") causal = std::stoll(v);
    else if (a == "--sim") chip = v;
    else {
      usage(stderr);
      return 2;
    }
  }
  try {
    tpu::Generator g(2);
    tpu::Tensor q = tpu::randn({heads, seq, dim}, {}, &g), k = tpu::randn({heads, seq, dim}, {}, &g),
                v = tpu::randn({heads, seq, dim}, {}, &g);
    const tpu::kernel::Params params{{"bq", bq}, {"bk", bk}, {"causal", causal}};
    const auto& op = examples::flash_attention_op();
    const double e = max_rel_error(op({q, k, v}, params), tpu::scaled_dot_product_attention(q, k, v, {}, causal != 0));
    std::printf("kernel_flash_attention: q, k, v [%lld, %lld, %lld] f32, blocks %lld x %lld, causal %lld\n",
                static_cast<long long>(heads), static_cast<long long>(seq), static_cast<long long>(dim),
                static_cast<long long>(bq), static_cast<long long>(bk), static_cast<long long>(causal));
    std::printf("  cpu interpreter: relative error (max |diff| / max |ref|) vs scaled_dot_product_attention %.3g\n", e);
    if (e > 1e-5) {
      std::fprintf(stderr, "kernel_flash_attention: error above 1e-5\n");
      return 1;
    }
    if (!chip.empty()) {
      tpu::set_sim_chip(chip, 0);
      const tpu::Device sim("sim:0");
      tpu::Tensor qs = q.to(sim), ks = k.to(sim), vs = v.to(sim);
      tpu::Tensor ok = op({qs, ks, vs}, params), ob = tpu::scaled_dot_product_attention(qs, ks, vs, {}, causal != 0);
      std::printf("  sim:0 (%s): max relative difference kernel vs built-in %.3g (bf16 MXU passes)\n", chip.c_str(),
                  max_rel_error(ok, ob));
      tpu::SimTimingOnly timing;
      auto cycles = [&](auto&& run) {
        run();
        tpu::synchronize(sim);
        tpu::reset_sim_stats();
        run();
        tpu::synchronize(sim);
        return tpu::sim_stats().cycles;
      };
      const double ck = cycles([&] { (void)op({qs, ks, vs}, params); });
      const double cb = cycles([&] { (void)tpu::scaled_dot_product_attention(qs, ks, vs, {}, causal != 0); });
      std::printf("  sim:0 (%s, timing-only): kernel %.0f cycles, built-in attention %.0f cycles, ratio %.2f\n",
                  chip.c_str(), ck, cb, ck / cb);
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "kernel_flash_attention: error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
