// The ragged paged decode attention of paged_attention.h (manual copies, scalar-prefetched
// block tables and lengths) compared with the library's ragged paged attention op
// (serve::paged_attention) on the cpu interpreter; with --sim CHIP also on sim:0, values and
// simulated cycles. Every sequence decodes one token; the built-in op first writes that token's
// K and V into its cache slot, then both read the same cache.
//
//   kernel_paged_attention [--seqs B --heads H --kv-heads KH --dim D --page P --max-len L
//                           --pages-per-step N --sim CHIP]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "codegen/launch.h"
#include "codegen/paged_attention.h"
#include "compare.h"
#include "paged_attention.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/serve/paged_op.h"
#include "tpucore/streams.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: kernel_paged_attention [--seqs B] [--heads H] [--kv-heads KH] [--dim D] [--page P]\n"
               "                              [--max-len L] [--pages-per-step N] [--sim CHIP]\n"
               "Runs ragged paged decode attention as a user kernel (manual double-buffered page copies,\n"
               "scalar-prefetched block tables) and compares it with the library's paged attention op;\n"
               "--sim CHIP: also on sim:0 with that chip preset (values and cycles).\n");
}

tpu::Tensor i32_tensor(const std::vector<int32_t>& v, tpu::Shape s, tpu::Device d) {
  return tpu::from_vector(v, s, tpu::TensorOptions(tpu::DType::i32, d));
}

}  // namespace

using kernel_examples::max_rel_error;

int main(int argc, char** argv) {
  int64_t seqs = 4, heads = 8, kv_heads = 2, dim = 128, page = 16, max_len = 200, pps = 0;
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
    if (a == "--seqs") seqs = std::stoll(v);
    else if (a == "--heads") heads = std::stoll(v);
    else if (a == "--kv-heads") kv_heads = std::stoll(v);
    else if (a == "--dim") dim = std::stoll(v);
    else if (a == "--page") page = std::stoll(v);
    else if (a == "--max-len") max_len = std::stoll(v);
    else if (a == "--pages-per-step") pps = std::stoll(v);
    else if (a == "--sim") chip = v;
    else {
      usage(stderr);
      return 2;
    }
  }
  try {
    if (seqs < 1 || kv_heads < 1 || heads % kv_heads != 0 || page < 1 || max_len < 1 || dim < 1) {
      std::fprintf(stderr, "kernel_paged_attention: bad sizes (heads must be a multiple of kv-heads)\n");
      return 2;
    }
    // Ragged lengths in [1, max_len], pages of every sequence scattered over the cache.
    std::mt19937 rng(7);
    const int64_t max_pages = (max_len + page - 1) / page, num_pages = seqs * max_pages;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> lens, query_start{0};
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> table_flat, lens32;
    for (int64_t b = 0; b < seqs; ++b) {
      lens.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_len)));
      lens32.push_back(static_cast<int32_t>(lens.back()));
      query_start.push_back(b + 1);
      tables.emplace_back(perm.begin() + b * max_pages, perm.begin() + (b + 1) * max_pages);
      table_flat.insert(table_flat.end(), tables.back().begin(), tables.back().end());
    }
    std::vector<const std::vector<int32_t>*> ptrs;
    for (const auto& t : tables) ptrs.push_back(&t);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    tpu::codegen::PagedAttentionSpec spec;
    spec.heads = heads;
    spec.kv_heads = kv_heads;
    spec.head_dim = dim;
    spec.block_size = page;
    spec.max_units = seqs;
    spec.scale = static_cast<float>(scale);
    tpu::Generator g(3);
    const int64_t row = kv_heads * dim;
    const tpu::Tensor q0 = tpu::randn({seqs + 1024, heads * dim}, {}, &g), kn0 = tpu::randn({seqs + 1024, row}, {}, &g),
                      vn0 = tpu::randn({seqs + 1024, row}, {}, &g), kc0 = tpu::randn({num_pages * page, row}, {}, &g),
                      vc0 = tpu::randn({num_pages * page, row}, {}, &g);
    const tpu::kernel::KernelDef def =
        examples::paged_decode_attention_kernel(seqs, heads, kv_heads, dim, page, max_pages, scale, pps);
    // Both attentions on device d: the built-in op (which also writes the new K and V rows into
    // the cache) then the kernel over that cache; out [seqs * heads, dim] each.
    auto run = [&](const tpu::Device& d, bool timed_builtin, bool timed_kernel, tpu::Tensor& ob, tpu::Tensor& ok) {
      const int64_t rows = seqs + spec.tile_tokens - 1;
      const tpu::codegen::PagedAttentionMeta meta =
          tpu::codegen::plan_paged_attention(spec, num_pages, query_start, lens, ptrs);
      std::vector<int32_t> slots = meta.slots;
      slots.resize(static_cast<size_t>(rows), 0);
      tpu::Tensor q = tpu::narrow(q0, 0, 0, rows).contiguous().to(d), kc = kc0.to(d), vc = vc0.to(d);
      const tpu::Tensor units = i32_tensor(meta.units, {static_cast<int64_t>(meta.units.size())}, d),
                        pages = i32_tensor(meta.pages, {static_cast<int64_t>(meta.pages.size())}, d),
                        slot_t = i32_tensor(slots, {rows}, d);
      const tpu::Tensor kn = tpu::narrow(kn0, 0, 0, rows).contiguous().to(d), vn = tpu::narrow(vn0, 0, 0, rows).contiguous().to(d);
      auto builtin = [&] { return tpu::serve::paged_attention(spec, q, kn, vn, kc, vc, units, pages, slot_t); };
      ob = builtin();
      const tpu::Tensor bt = i32_tensor(table_flat, {seqs, max_pages}, d), ln = i32_tensor(lens32, {seqs}, d);
      const tpu::Tensor qk = tpu::narrow(q, 0, 0, seqs).contiguous().reshape({seqs * heads, dim});
      auto kernel = [&] { return tpu::kernel::call(def, {bt, ln, qk, kc, vc}, {{tpu::Shape{seqs * heads, dim}, tpu::DType::f32}})[0]; };
      ok = kernel();
      ob = tpu::narrow(ob, 0, 0, seqs).contiguous().reshape({seqs * heads, dim});
      double cb = 0, ck = 0;
      if (timed_builtin || timed_kernel) {
        tpu::SimTimingOnly timing;
        auto cycles = [&](auto&& f) {
          tpu::synchronize(d);
          tpu::reset_sim_stats();
          (void)f();
          tpu::synchronize(d);
          return static_cast<double>(tpu::sim_stats().cycles);
        };
        cb = cycles(builtin);
        ck = cycles(kernel);
      }
      return std::pair{cb, ck};
    };
    std::printf("kernel_paged_attention: %lld sequences (lengths 1..%lld), heads %lld / kv heads %lld, dim %lld, "
                "pages of %lld, f32\n", static_cast<long long>(seqs), static_cast<long long>(max_len),
                static_cast<long long>(heads), static_cast<long long>(kv_heads), static_cast<long long>(dim),
                static_cast<long long>(page));
    tpu::Tensor ob, ok;
    (void)run(tpu::Device(), false, false, ob, ok);
    const double e = max_rel_error(ok, ob);
    std::printf("  cpu interpreter: relative error (max |diff| / max |ref|) vs the built-in paged attention %.3g\n", e);
    if (e > 1e-5) {
      std::fprintf(stderr, "kernel_paged_attention: error above 1e-5\n");
      return 1;
    }
    if (!chip.empty()) {
      tpu::set_sim_chip(chip, 0);
      const tpu::Device sim("sim:0");
      tpu::set_float32_matmul_precision("highest");  // f32-accurate products, as the built-in's f32 mode
      tpu::codegen::choose_paged_attention_tiling(tpu::codegen::chip_config(sim), spec);
      const auto [cb, ck] = run(sim, true, true, ob, ok);
      const double es = max_rel_error(ok, ob);
      std::printf("  sim:0 (%s): relative error kernel vs built-in %.3g\n", chip.c_str(), es);
      std::printf("  sim:0 (%s, timing-only): kernel %.0f cycles, built-in paged attention %.0f cycles, ratio %.2f\n",
                  chip.c_str(), ck, cb, ck / cb);
      if (es > 1e-5) {
        std::fprintf(stderr, "kernel_paged_attention: error on sim above 1e-5\n");
        return 1;
      }
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "kernel_paged_attention: error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
