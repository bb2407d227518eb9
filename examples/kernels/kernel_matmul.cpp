// A user kernel end to end: the tiled matmul with a bias + activation epilogue of
// matmul_epilogue.h, registered as an op, checked against the library's own ops (matmul, add,
// relu / silu) on the cpu interpreter, eagerly and inside tpu::compile.
//
// With --sim CHIP (a preset: v5e, v6e, ...) it also runs both on sim:0 in timing-only mode and
// prints their simulated cycles.
//
//   kernel_matmul [--m M --k K --n N --bm BM --bn BN --bk BK --act relu|silu|none --dtype f32|bf16 --sim CHIP]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "compare.h"
#include "matmul_epilogue.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/streams.h"
#include "tpucore/ops.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: kernel_matmul [--m M] [--k K] [--n N] [--bm BM] [--bn BN] [--bk BK] [--act relu|silu|none]\n"
               "                     [--dtype f32|bf16] [--sim CHIP]\n"
               "Runs act(x w + b) as a user kernel (tiled matmul with a fused epilogue) in the cpu interpreter,\n"
               "eagerly and inside tpu::compile, and compares it with the library's matmul + add + activation.\n"
               "--sim CHIP: also the simulated cycles of both on sim:0 with that chip preset (timing-only).\n");
}

}  // namespace

using kernel_examples::max_rel_error;

int main(int argc, char** argv) {
  int64_t m = 256, k = 512, n = 384, bm = 256, bn = 384, bk = 128;
  std::string act = "relu", dtype = "f32", chip;
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
    if (a == "--m") m = std::stoll(v);
    else if (a == "--k") k = std::stoll(v);
    else if (a == "--n") n = std::stoll(v);
    else if (a == "--bm") bm = std::stoll(v);
    else if (a == "--bn") bn = std::stoll(v);
    else if (a == "--bk") bk = std::stoll(v);
    else if (a == "--act") act = v;
    else if (a == "--dtype") dtype = v;
    else if (a == "--sim") chip = v;
    else {
      usage(stderr);
      return 2;
    }
  }
  try {
    const examples::Act ea = act == "relu"   ? examples::Act::relu
                             : act == "silu" ? examples::Act::silu
                             : act == "none" ? examples::Act::none
                                             : throw tpu::Error("--act must be relu, silu or none, got " + act);
    const tpu::DType dt = dtype == "bf16" ? tpu::DType::bf16 : tpu::DType::f32;
    tpu::Generator g(1);
    tpu::Tensor x = tpu::randn({m, k}, {}, &g).to(dt), w = tpu::randn({k, n}, {}, &g).to(dt);
    tpu::Tensor b = tpu::randn({n}, {}, &g);
    const tpu::kernel::Params params{{"bm", bm}, {"bn", bn}, {"bk", bk}, {"act", static_cast<int64_t>(ea)}};
    const auto& op = examples::matmul_epilogue_op();
    auto builtin = [&](const tpu::Tensor& xx, const tpu::Tensor& ww, const tpu::Tensor& bb) {
      tpu::Tensor y = tpu::add(tpu::matmul(xx.to(tpu::DType::f32), ww.to(tpu::DType::f32)), bb);
      y = ea == examples::Act::relu ? tpu::relu(y) : ea == examples::Act::silu ? tpu::silu(y) : y;
      return y.to(dt);
    };
    tpu::Tensor want = builtin(x, w, b);
    tpu::Tensor eager = op({x, w, b}, params);
    auto compiled = tpu::compile([&](const tpu::Tensor& xx, const tpu::Tensor& ww, const tpu::Tensor& bb) {
      return tpu::mul(op({xx, ww, bb}, params), 2.0);  // a neighbour op around the kernel's node
    });
    tpu::Tensor comp = compiled(x, w, b);
    std::printf("kernel_matmul: y = %s(x w + b), x [%lld, %lld] %s, w [%lld, %lld], blocks %lld x %lld x %lld\n",
                act.c_str(), static_cast<long long>(m), static_cast<long long>(k), dtype.c_str(),
                static_cast<long long>(k), static_cast<long long>(n), static_cast<long long>(bm),
                static_cast<long long>(bn), static_cast<long long>(bk));
    const double e1 = max_rel_error(eager, want), e2 = max_rel_error(comp, tpu::mul(want, 2.0));
    std::printf("  cpu interpreter, eager:    relative error (max |diff| / max |ref|) vs built-in ops %.3g\n", e1);
    std::printf("  cpu interpreter, compiled: relative error (max |diff| / max |ref|) vs built-in ops %.3g\n", e2);
    const double tol = dt == tpu::DType::f32 ? 1e-5 : 1.0 / 128;
    if (e1 > tol || e2 > tol) {
      std::fprintf(stderr, "kernel_matmul: error above the tolerance %.3g\n", tol);
      return 1;
    }
    std::printf("  within %.3g\n", tol);
    if (!chip.empty()) {
      tpu::set_sim_chip(chip, 0);
      const tpu::Device sim("sim:0");
      tpu::Tensor xs = x.to(sim), ws = w.to(sim), bs = b.to(sim);
      // The library's matmul with its epilogue fused (one compiled region), in the operands' dtype.
      tpu::Tensor bd = bs.to(dt);
      auto builtin_c = tpu::compile([&](const tpu::Tensor& xx) {
        tpu::Tensor y = tpu::add(tpu::matmul(xx, ws), bd);
        return ea == examples::Act::relu ? tpu::relu(y) : ea == examples::Act::silu ? tpu::silu(y) : y;
      });
      tpu::SimTimingOnly timing;
      auto cycles = [&](auto&& run) {
        run();  // builds and caches the programs
        tpu::synchronize(sim);
        tpu::reset_sim_stats();
        run();
        tpu::synchronize(sim);
        return tpu::sim_stats().cycles;
      };
      const double ck = cycles([&] { (void)op({xs, ws, bs}, params); });
      const double cb = cycles([&] { (void)builtin_c(xs); });
      std::printf("  sim:0 (%s, timing-only): kernel %.0f cycles, built-in compiled matmul + epilogue %.0f cycles, "
                  "ratio %.2f\n",
                  chip.c_str(), ck, cb, ck / cb);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_matmul: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
