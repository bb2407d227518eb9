// The chip's ragged paged attention (codegen/paged_attention.h) on the tiny chip: the
// data-driven scalar instructions it needs (sld, loopr); its outputs and cache update for a
// mixed batch (fresh prefill, chunk after cached tokens, decodes) against attention computed
// naively in double and against the cpu kernel (serve::ragged_paged_attention); the HBM bytes
// it reads (the pages in use, not the cache); a sliding window and soft-capped scores (planned
// with and without the window); bad step data; and the serving engine with the
// model on sim equal to one-request-at-a-time generate() (greedy).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "codegen/launch.h"
#include "codegen/paged_attention.h"
#include "core/codegen_testing.h"
#include "ops/fallback.h"
#include "core/llm_reference.h"
#include "core/testing.h"
#include "sim/assembly.h"
#include "sim/builder.h"
#include "sim/chip.h"
#include "sim/error.h"
#include "sim/presets.h"
#include "tpucore/models.h"
#include "tpucore/serve/engine.h"
#include "tpucore/serve/paged_cache.h"

using namespace tpu;
using B = sim::ProgramBuilder;
using tpu::testing::expect_error;

TEST_CASE("sim: sld reads a word into a register and loopr counts by a register", "[sim][paged]") {
  sim::Chip chip = sim::Chip::create("tiny");
  const std::vector<int32_t> words{3, -2, 40, 7};
  chip.write_hbm(64, words.data(), 16);
  B b("data_driven");
  b.sload(1, B::hbm_at(B::at(0, {{0, 1}})));  // r1 = 3 (r0 = 64 is the argument)
  b.sset(2, 0);
  b.loop_reg(3, 1);
  b.sadd(2, 2, 5);
  b.end_loop();
  b.sload(4, B::hbm_at(B::at(4, {{0, 1}})));  // -2: no iteration
  b.sset(5, 0);
  b.loop_reg(6, 4);
  b.sadd(5, 5, 1);
  b.end_loop();
  b.sload(7, B::hbm_at(B::at(8, {{0, 1}})));  // a loaded value used as an address: words[3]
  b.sload(8, B::hbm_at(B::at(-28, {{0, 1}, {7, 1}})));
  sim::Program p = b.finish();
  const sim::RunResult r = chip.run(p, {.registers = {64}});
  CHECK(r.registers[1] == 3);
  CHECK(r.registers[2] == 15);
  CHECK(r.registers[5] == 0);
  CHECK(r.registers[8] == 7);
  // Text form round trip.
  CHECK(sim::parse_program(sim::to_text(p)).code == p.code);
  // A misaligned or out-of-range word is a SimError naming the instruction.
  B bad("bad");
  bad.sload(1, B::hbm_at(B::at(2)));
  CHECK_THROWS_AS(chip.run(bad.finish()), sim::SimError);
  B far("far");
  far.sload(1, B::hbm_at(B::at(int64_t(1) << 40)));
  CHECK_THROWS_AS(chip.run(far.finish()), sim::SimError);
}

namespace {

struct Batch {
  std::vector<int64_t> qs{0}, ctx;
  std::vector<std::vector<int32_t>> tables;
  void add(int64_t new_tokens, int64_t context, std::vector<int32_t> table) {
    qs.push_back(qs.back() + new_tokens);
    ctx.push_back(context);
    tables.push_back(std::move(table));
  }
  std::vector<const std::vector<int32_t>*> ptrs() const {
    std::vector<const std::vector<int32_t>*> p;
    for (const auto& t : tables) p.push_back(&t);
    return p;
  }
};

// Runs the program on a bare tiny chip: returns out, and the caches after the step.
struct ChipRun {
  std::vector<float> out, kc, vc;
  sim::Stats stats;
};
ChipRun run_on_chip(const codegen::PagedAttentionSpec& s, const codegen::PagedAttentionMeta& m, int64_t slots,
                    const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& kc, const std::vector<float>& vc) {
  sim::Chip chip = sim::Chip::create("tiny");
  uint64_t at = 0;
  auto put = [&](const void* data, size_t bytes, size_t reserve) {
    const uint64_t a = at;
    if (bytes) chip.write_hbm(a, data, bytes);
    at += (std::max(bytes, reserve) + 63) / 64 * 64;
    return int64_t(a);
  };
  const int64_t n = m.num_tokens, qrow = s.heads * s.head_dim;
  // q holds exactly the step's tokens (no padding rows for a last, partial prefill tile).
  const int64_t aq = put(q.data(), q.size() * 4, 0), ak = put(k.data(), k.size() * 4, 0),
                av = put(v.data(), v.size() * 4, 0), akc = put(kc.data(), kc.size() * 4, 0),
                avc = put(vc.data(), vc.size() * 4, 0), aout = put(nullptr, 0, size_t(n * qrow * 4)),
                au = put(m.units.data(), m.units.size() * 4, 0), ap = put(m.pages.data(), m.pages.size() * 4, 0),
                as = put(m.slots.data(), m.slots.size() * 4, 0);
  const sim::Program p = codegen::make_paged_attention_program(chip.config(), s);
  const sim::RunResult r = chip.run(p, {.race_check = true, .fail_on_race = true,
                                        .registers = {aq, ak, av, akc, avc, aout, au, ap, as}});
  ChipRun cr;
  cr.stats = r.stats;
  cr.out.resize(size_t(n * qrow));
  chip.read_hbm(uint64_t(aout), cr.out.data(), cr.out.size() * 4);
  cr.kc.resize(kc.size());
  cr.vc.resize(vc.size());
  chip.read_hbm(uint64_t(akc), cr.kc.data(), kc.size() * 4);
  chip.read_hbm(uint64_t(avc), cr.vc.data(), vc.size() * 4);
  (void)slots;
  return cr;
}

// Attention computed naively in double: each token attends to positions 0..its own of its
// sequence (cached positions from the cache through the block table, new ones from k / v).
std::vector<double> naive_attention(const Batch& b, const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const std::vector<float>& kc,
                                    const std::vector<float>& vc, int64_t hq, int64_t hkv, int64_t d, int64_t bs,
                                    float scale, int64_t window = 0, double softcap = 0) {
  const int64_t row = hkv * d, group = hq / hkv;
  std::vector<double> out(size_t(b.qs.back() * hq * d));
  for (size_t sq = 0; sq + 1 < b.qs.size(); ++sq) {
    const int64_t q0 = b.qs[sq], ql = b.qs[sq + 1] - q0, ctx = b.ctx[sq];
    auto kv_at = [&](const std::vector<float>& cachev, const std::vector<float>& newv, int64_t pos, int64_t h, int64_t i) {
      if (pos >= ctx - ql) return double(newv[size_t((q0 + pos - (ctx - ql)) * row + h * d + i)]);
      const int64_t slot = b.tables[sq][size_t(pos / bs)] * bs + pos % bs;
      return double(cachev[size_t(slot * row + h * d + i)]);
    };
    for (int64_t t = 0; t < ql; ++t) {
      const int64_t pos = ctx - ql + t;
      for (int64_t h = 0; h < hq; ++h) {
        std::vector<double> sc(size_t(pos + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += double(q[size_t(((q0 + t) * hq + h) * d + i)]) * kv_at(kc, k, j, h / group, i);
          sc[size_t(j)] = softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
          if (window > 0 && j <= pos - window) sc[size_t(j)] = -1e300;  // outside (pos - window, pos]
          mx = std::max(mx, sc[size_t(j)]);
        }
        double den = 0;
        for (auto& e : sc) den += (e = e == -1e300 ? 0.0 : std::exp(e - mx));
        for (int64_t i = 0; i < d; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= pos; ++j) o += sc[size_t(j)] * kv_at(vc, v, j, h / group, i);
          out[size_t(((q0 + t) * hq + h) * d + i)] = o / den;
        }
      }
    }
  }
  return out;
}

// Runs one step of random q / k / v and random caches on the tiny chip and returns the largest
// difference from naive attention in double (and, when `cpu_err` is given, the largest
// difference of the cpu kernel serve::ragged_paged_attention from it). The spec's window and
// softcap apply to both.
double chip_error_vs_naive(const codegen::PagedAttentionSpec& s, const codegen::PagedAttentionMeta& m, const Batch& b,
                           int64_t nb, std::mt19937& rng, double* cpu_err = nullptr) {
  const int64_t n = m.num_tokens, hq = s.heads, hkv = s.kv_heads, d = s.head_dim, bs = s.block_size, row = hkv * d;
  std::normal_distribution<float> nd;
  auto randv = [&](size_t sz) {
    std::vector<float> x(sz);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  const std::vector<float> q = randv(size_t(n * hq * d)), k = randv(size_t(n * row)), v = randv(size_t(n * row));
  const std::vector<float> kc = randv(size_t(nb * bs * row)), vc = randv(size_t(nb * bs * row));
  const ChipRun cr = run_on_chip(s, m, nb * bs, q, k, v, kc, vc);
  const std::vector<double> ref = naive_attention(b, q, k, v, kc, vc, hq, hkv, d, bs, s.scale, s.window, s.softcap);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - double(cr.out[i])));
  if (cpu_err) {
    serve::PagedKVCache cache({1, hkv, d, bs, nb});
    std::copy(kc.begin(), kc.end(), cache.key(0, 0, 0, 0));
    std::copy(vc.begin(), vc.end(), cache.value(0, 0, 0, 0));
    serve::RaggedBatch rb;
    rb.query_start = b.qs;
    rb.context_len = b.ctx;
    rb.block_tables = b.ptrs();
    std::vector<float> cpu(size_t(n * hq * d));
    serve::ragged_paged_attention(cache, 0, rb, q.data(), k.data(), v.data(), cpu.data(), hq, s.scale, s.window,
                                  s.softcap);
    *cpu_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) *cpu_err = std::max(*cpu_err, std::abs(ref[i] - double(cpu[i])));
  }
  return worst;
}

// 4 heads over 2 KV heads of 8, blocks of 4, scale 0.3, tiled for the tiny chip, with decode
// steps one page longer than prefill steps (the two classes then sum in different orders).
codegen::PagedAttentionSpec tiny_spec_longer_decode_steps(int64_t max_units) {
  codegen::PagedAttentionSpec s{.heads = 4, .kv_heads = 2, .head_dim = 8, .block_size = 4};
  s.scale = 0.3f;
  s.max_units = max_units;
  codegen::choose_paged_attention_tiling(sim::preset_config("tiny"), s);
  s.decode_pages_per_step = s.pages_per_step + 1;
  return s;
}

}  // namespace

TEST_CASE("paged attention on the tiny chip equals the cpu kernel and naive attention (mixed batch)", "[sim][paged]") {
  const int64_t hq = 4, hkv = 2, d = 8, bs = 4, nb = 96, row = hkv * d;
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  codegen::PagedAttentionSpec s{.heads = hq, .kv_heads = hkv, .head_dim = d, .block_size = bs};
  s.scale = 1.f / std::sqrt(float(d));
  s.max_units = 8;
  codegen::choose_paged_attention_tiling(cfg, s);
  INFO("pages/step " << s.pages_per_step << ", tile tokens " << s.tile_tokens);
  CHECK(s.pages_per_step * bs >= cfg.mxu.cols);
  std::mt19937 rng(5);
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  auto table = [&](int64_t positions) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < (positions + bs - 1) / bs; ++i) t.push_back(perm[next++]);
    return t;
  };
  Batch b;
  b.add(1, 23, table(23));   // decode after 22 cached positions (two steps of keys and a tail)
  b.add(11, 11, table(11));  // a fresh prefill (two tiles)
  b.add(5, 14, table(14));   // a chunk after 9 cached positions
  b.add(1, 1, table(1));     // a one-token prompt
  b.add(1, 6, table(6));     // another decode
  const codegen::PagedAttentionMeta m = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs());
  const int64_t n = m.num_tokens;
  std::normal_distribution<float> nd;
  auto randv = [&](size_t sz) {
    std::vector<float> x(sz);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  const std::vector<float> q = randv(size_t(n * hq * d)), k = randv(size_t(n * row)), v = randv(size_t(n * row));
  // Earlier positions already cached (random), the rest of the cache random too (never read).
  const std::vector<float> kc = randv(size_t(nb * bs * row)), vc = randv(size_t(nb * bs * row));
  const ChipRun cr = run_on_chip(s, m, nb * bs, q, k, v, kc, vc);

  // The cpu kernel on the same cache contents.
  serve::PagedKVCache cache({1, hkv, d, bs, nb});
  std::copy(kc.begin(), kc.end(), cache.key(0, 0, 0, 0));
  std::copy(vc.begin(), vc.end(), cache.value(0, 0, 0, 0));
  serve::RaggedBatch rb;
  rb.query_start = b.qs;
  rb.context_len = b.ctx;
  rb.block_tables = b.ptrs();
  std::vector<float> cpu(size_t(n * hq * d));
  serve::ragged_paged_attention(cache, 0, rb, q.data(), k.data(), v.data(), cpu.data(), hq, s.scale);

  const std::vector<double> ref = naive_attention(b, q, k, v, kc, vc, hq, hkv, d, bs, s.scale);
  double worst_naive = 0, worst_cpu = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst_naive = std::max(worst_naive, std::abs(ref[i] - double(cr.out[i])));
    worst_cpu = std::max(worst_cpu, std::abs(double(cpu[i]) - double(cr.out[i])));
  }
  CHECK(worst_naive < 2e-5);
  CHECK(worst_cpu < 2e-5);
  // The fused cache update: every new token's K/V row sits in its slot; nothing else changed.
  int64_t changed = 0;
  for (size_t i = 0; i < kc.size(); ++i) changed += (cr.kc[i] != kc[i]) + (cr.vc[i] != vc[i]);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < row; ++i) {
      const size_t slot = size_t(m.slots[size_t(t)]);
      REQUIRE(cr.kc[slot * size_t(row) + size_t(i)] == k[size_t(t * row + i)]);
      REQUIRE(cr.vc[slot * size_t(row) + size_t(i)] == v[size_t(t * row + i)]);
    }
  CHECK(changed == 2 * n * row);

  // HBM reads: the new rows, the unit table, each unit's queries and the pages that hold its
  // keys up to its last query (K and V), computed here from the batch; far below the cache's size.
  const int64_t page = bs * row * 4;
  int64_t q_reads = 0, pages = 0;
  for (size_t sq = 0; sq + 1 < b.qs.size(); ++sq) {
    const int64_t ql = b.qs[sq + 1] - b.qs[sq], ctx = b.ctx[sq];
    const int64_t tile = ql == 1 ? 1 : s.tile_tokens;
    for (int64_t t0 = 0; t0 < ql; t0 += tile) {
      const int64_t last = ctx - ql + std::min(ql, t0 + tile) - 1;
      pages += last / bs + 1;
      q_reads += (std::min(ql, t0 + tile) - t0) * hq * d * 4;  // only the unit's own tokens
    }
  }
  CHECK(pages == m.kv_pages_read);
  // The kernel looks two steps ahead: two steps of -1 entries (nothing read) past each class's last unit.
  CHECK(std::count(m.pages.end() - 2 * codegen::paged_pages_per_step(s, false), m.pages.end(), -1) ==
        2 * codegen::paged_pages_per_step(s, false));
  const int64_t expect_read = 2 * n * row * 4 + (1 + s.max_units) * codegen::kPagedUnitWords * 4 + q_reads +
                              2 * pages * page;
  CHECK(int64_t(cr.stats.hbm_bytes_read) == expect_read);
  CHECK(int64_t(cr.stats.hbm_bytes_written) == 2 * n * row * 4 + n * hq * d * 4);
  CHECK(2 * pages * page < int64_t(kc.size() + vc.size()) * 4 / 3);
}

TEST_CASE("paged attention pipeline: long prefill chunks, odd decode count, other decode step size", "[sim][paged]") {
  // Exercises the software pipeline's edges on the tiny chip (f32, race checking on): prefill
  // sequences of several tiles with many KV steps each (masked and unmasked), a last tile of
  // one token, an odd number of decode units (the prefill class starts on the other buffer
  // parity), contexts on and off block boundaries, and decode units stepping over 3 pages while
  // prefill units step over the chosen 2; against attention computed naively in double.
  const int64_t bs = 4, nb = 160;
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  const codegen::PagedAttentionSpec s = tiny_spec_longer_decode_steps(16);
  std::mt19937 rng(11);
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  auto table = [&](int64_t positions) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < (positions + bs - 1) / bs; ++i) t.push_back(perm[next++]);
    return t;
  };
  Batch b;
  b.add(1, 57, table(57));                              // decodes: long, short, on a block boundary
  b.add(2 * s.tile_tokens + 1, 70, table(70));          // a chunk after cached positions, last tile of 1
  b.add(1, 3, table(3));
  b.add(3 * s.tile_tokens - 2, 3 * s.tile_tokens - 2, table(3 * s.tile_tokens - 2));  // a fresh prompt
  b.add(1, 40, table(40));
  const codegen::PagedAttentionMeta m = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs());
  REQUIRE(m.units[1] == 3);
  CHECK(chip_error_vs_naive(s, m, b, nb, rng) < 2e-5);
  // The page list runs two steps of each class's own step size past its last unit (-1 entries),
  // and a unit's last step lists -1 past its last page.
  // Decode steps of 12 keys: contexts 57, 3, 40 take 5, 1, 4 steps (30 entries) over 15, 1, 10 pages.
  REQUIRE(s.decode_pages_per_step * bs == 12);
  CHECK(std::count(m.pages.begin(), m.pages.begin() + 30 + 2 * 3, -1) == 30 - (15 + 1 + 10) + 2 * 3);
  // The same step with a different decode step size is a different program.
  codegen::PagedAttentionSpec s2 = s;
  s2.decode_pages_per_step = 0;
  CHECK(codegen::paged_attention_key(s2) != codegen::paged_attention_key(s));
}

TEST_CASE("paged attention decode step: ragged lengths, only the pages below each length are read", "[sim][paged]") {
  // A decode-only step of ragged lengths on the tiny chip (decode steps of 2 pages of 4 keys):
  // 1 key, exactly one full page, exactly one full step, one past a full page, one past two
  // full steps, three full steps. 8 query heads over 2 KV heads (groups of 4 rows per KV head).
  // Head dim 8 (the MXU width) and 12 (one and a half).
  // Values against attention computed naively in double; HBM bytes read against the closed
  // form of what the step needs: the new K/V rows, the unit table, the queries, and K and V of
  // ceil(length / block) pages per sequence (no padding pages, nothing past the last unit).
  for (const int64_t d : {int64_t(8), int64_t(12)}) {
    const int64_t hq = 8, hkv = 2, bs = 4, nb = 64, row = hkv * d;
    const sim::ChipConfig cfg = sim::preset_config("tiny");
    codegen::PagedAttentionSpec s{.heads = hq, .kv_heads = hkv, .head_dim = d, .block_size = bs};
    s.scale = 1.f / std::sqrt(float(d));
    s.max_units = 8;
    codegen::choose_paged_attention_tiling(cfg, s);
    REQUIRE(codegen::paged_pages_per_step(s, true) == 2);
    std::mt19937 rng(uint32_t(70 + d));
    std::vector<int32_t> perm(static_cast<size_t>(nb));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    Batch b;
    const std::vector<int64_t> lens{1, 4, 8, 13, 17, 24};
    for (const int64_t len : lens) {
      std::vector<int32_t> t;
      for (int64_t i = 0; i < (len + bs - 1) / bs; ++i) t.push_back(perm[next++]);
      b.add(1, len, std::move(t));
    }
    const codegen::PagedAttentionMeta m = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs());
    const int64_t n = m.num_tokens;
    std::normal_distribution<float> nd;
    auto randv = [&](size_t sz) {
      std::vector<float> x(sz);
      for (auto& e : x) e = nd(rng);
      return x;
    };
    const std::vector<float> q = randv(size_t(n * hq * d)), k = randv(size_t(n * row)), v = randv(size_t(n * row));
    const std::vector<float> kc = randv(size_t(nb * bs * row)), vc = randv(size_t(nb * bs * row));
    const ChipRun cr = run_on_chip(s, m, nb * bs, q, k, v, kc, vc);
    const std::vector<double> ref = naive_attention(b, q, k, v, kc, vc, hq, hkv, d, bs, s.scale);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - double(cr.out[i])));
    INFO("head dim " << d);
    CHECK(worst < 2e-5);
    int64_t pages = 0;
    for (const int64_t len : lens) pages += (len + bs - 1) / bs;  // 1 + 1 + 2 + 4 + 5 + 6
    CHECK(pages == 19);
    CHECK(m.kv_pages_read == pages);
    const int64_t expect_read = 2 * n * row * 4 + (1 + s.max_units) * codegen::kPagedUnitWords * 4 +
                                n * hq * d * 4 + 2 * pages * bs * row * 4;
    CHECK(int64_t(cr.stats.hbm_bytes_read) == expect_read);
    CHECK(int64_t(cr.stats.hbm_bytes_written) == 2 * n * row * 4 + n * hq * d * 4);
  }
}

TEST_CASE("paged attention: softmax in uneven KV-head chunks, prefill steps shorter than decode steps", "[sim][paged]") {
  // Three KV heads: prefill units run the softmax's vector work in chunks of two heads and one
  // (emit_step); prefill steps of 2 pages, decode steps of 3, prefill tiles of 6 tokens, so the
  // units' diagonal steps mask at every offset; against attention computed naively in double.
  const int64_t hq = 6, hkv = 3, d = 8, bs = 4, nb = 128;
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  codegen::PagedAttentionSpec s{.heads = hq, .kv_heads = hkv, .head_dim = d, .block_size = bs};
  s.scale = 0.4f;
  s.max_units = 16;
  s.tile_tokens = 6;
  s.pages_per_step = 2;
  s.decode_pages_per_step = 3;
  std::mt19937 rng(23);
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  auto table = [&](int64_t positions) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < (positions + bs - 1) / bs; ++i) t.push_back(perm[next++]);
    return t;
  };
  Batch b;
  b.add(1, 29, table(29));
  b.add(17, 17, table(17));  // a fresh prompt: tiles of 6, 6 and 5 tokens
  b.add(13, 50, table(50));  // a chunk after 37 cached positions (unmasked steps first)
  b.add(1, 9, table(9));
  const codegen::PagedAttentionMeta m = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs());
  CHECK(chip_error_vs_naive(s, m, b, nb, rng) < 2e-5);
}

TEST_CASE("paged attention by token kind: a token's result does not depend on how its step was cut", "[sim][paged]") {
  // With prompt-token counts, prompt tokens go in prefill units (a chunk of one too) and the
  // others in a decode unit each. Decode steps here cover more keys than prefill steps, so the
  // two classes round differently; a token must come out bitwise the same when its step is cut
  // otherwise: step A computes positions 15..20 of one sequence (3 prompt tokens, then 3 decode
  // tokens); step B, over A's cache, recomputes position 17 as a chunk of one prompt token and
  // position 20 as a lone decode token.
  const int64_t hq = 4, hkv = 2, d = 8, bs = 4, nb = 16, row = hkv * d;
  const codegen::PagedAttentionSpec s = tiny_spec_longer_decode_steps(8);
  std::mt19937 rng(23);
  std::vector<int32_t> table(static_cast<size_t>(6));
  std::iota(table.begin(), table.end(), 5);
  std::normal_distribution<float> nd;
  auto randv = [&](size_t sz) {
    std::vector<float> x(sz);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  Batch a;
  a.add(6, 21, table);
  const std::vector<int64_t> a_prompt{3};
  const codegen::PagedAttentionMeta ma = codegen::plan_paged_attention(s, nb, a.qs, a.ctx, a.ptrs(), &a_prompt);
  CHECK(ma.units[1] == 3);  // decode units: positions 18, 19, 20
  CHECK(ma.units[2] == 1);  // one prefill unit: positions 15..17
  CHECK(codegen::paged_attention_units(s, a.qs, &a_prompt) == 4);
  CHECK(codegen::paged_attention_units(s, a.qs) == 1);  // by count: one prefill unit
  const std::vector<float> q = randv(size_t(6 * hq * d)), k = randv(size_t(6 * row)), v = randv(size_t(6 * row));
  const std::vector<float> kc = randv(size_t(nb * bs * row)), vc = randv(size_t(nb * bs * row));
  const ChipRun ra = run_on_chip(s, ma, nb * bs, q, k, v, kc, vc);
  const std::vector<double> ref = naive_attention(a, q, k, v, kc, vc, hq, hkv, d, bs, s.scale);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - double(ra.out[i])));
  CHECK(worst < 2e-5);

  Batch b;  // the same sequence twice: position 17 (a prompt token), position 20 (a decode token)
  b.add(1, 18, table);
  b.add(1, 21, table);
  const std::vector<int64_t> b_prompt{1, 0};
  const codegen::PagedAttentionMeta mb = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs(), &b_prompt);
  CHECK(mb.units[1] == 1);
  CHECK(mb.units[2] == 1);
  auto rows = [](const std::vector<float>& x, int64_t width, std::initializer_list<int64_t> which) {
    std::vector<float> out;
    for (int64_t r : which) out.insert(out.end(), x.begin() + r * width, x.begin() + (r + 1) * width);
    return out;
  };
  const ChipRun rb = run_on_chip(s, mb, nb * bs, rows(q, hq * d, {2, 5}), rows(k, row, {2, 5}), rows(v, row, {2, 5}),
                                 ra.kc, ra.vc);
  CHECK(rb.out == rows(ra.out, hq * d, {2, 5}));  // bitwise
  expect_error([&] { codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs(), &a_prompt); },
               {"1 prompt-token counts"});
}

TEST_CASE("paged attention with a sliding window and soft-capped scores on the tiny chip", "[sim][paged]") {
  // Window 7 over blocks of 4 with soft-capping at 1.5: once planned with the window (every
  // layer sliding: the pages wholly before each unit's window are left out of its page list)
  // and once planned without it (mixed local / global layers: all pages, the window masked);
  // chip and cpu kernel against naive attention in double.
  const int64_t hq = 4, hkv = 2, d = 8, bs = 4, nb = 128;
  const sim::ChipConfig cfg = sim::preset_config("tiny");
  codegen::PagedAttentionSpec s{.heads = hq, .kv_heads = hkv, .head_dim = d, .block_size = bs};
  s.scale = 0.5f;
  s.max_units = 16;
  codegen::choose_paged_attention_tiling(cfg, s);
  s.decode_pages_per_step = 1;  // decode steps of 4 keys: a window of 7 spans steps
  std::mt19937 rng(41);
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  auto table = [&](int64_t positions) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < (positions + bs - 1) / bs; ++i) t.push_back(perm[next++]);
    return t;
  };
  Batch b;
  b.add(1, 30, table(30));                          // decode far past the window
  b.add(2 * s.tile_tokens + 3, 40, table(40));      // a chunk after cached positions: units start mid-context
  b.add(1, 5, table(5));                            // decode within the window
  b.add(s.tile_tokens + 2, s.tile_tokens + 2, table(s.tile_tokens + 2));  // a fresh prompt
  codegen::PagedAttentionSpec run = s;
  run.window = 7;
  run.softcap = 1.5f;
  const codegen::PagedAttentionMeta all = codegen::plan_paged_attention(s, nb, b.qs, b.ctx, b.ptrs());
  const codegen::PagedAttentionMeta windowed = codegen::plan_paged_attention(run, nb, b.qs, b.ctx, b.ptrs());
  double cpu_err = 1;
  CHECK(chip_error_vs_naive(run, all, b, nb, rng, &cpu_err) < 2e-5);
  CHECK(cpu_err < 2e-5);
  CHECK(chip_error_vs_naive(run, windowed, b, nb, rng) < 2e-5);
  // The windowed plan reads only the pages a unit's window covers: the 30-position decode
  // reads keys 23..29 (blocks 5..7: 3 pages, not 8).
  CHECK(windowed.kv_pages_read < all.kv_pages_read);
  CHECK(windowed.units[size_t(codegen::kPagedUnitWords) + 3] == 3);  // its steps of one page
  CHECK(all.units[size_t(codegen::kPagedUnitWords) + 3] == 8);
  // Window and softcap are constants of the program.
  CHECK(codegen::paged_attention_key(run) != codegen::paged_attention_key(s));
  // Soft-capping alone (the test's scaled scores, about N(0, 1.4^2), often exceed the cap).
  codegen::PagedAttentionSpec capped = s;
  capped.softcap = 1.5f;
  CHECK(chip_error_vs_naive(capped, all, b, nb, rng) < 2e-5);
}

TEST_CASE("paged attention tiling: prefill key steps about a unit's span, decode steps an MXU width", "[sim][paged]") {
  // The v6e preset with Llama-3-8B's attention shape (32 query heads, 8 KV heads, head dim 128).
  const sim::ChipConfig cfg = sim::preset_config("v6e");
  codegen::PagedAttentionSpec s{.heads = 32, .kv_heads = 8, .head_dim = 128, .block_size = 16};
  s.dtype = sim::DType::bf16;
  s.mode = sim::MxuMode::bf16;
  codegen::choose_paged_attention_tiling(cfg, s);
  INFO("tile " << s.tile_tokens << ", pages/step " << s.pages_per_step << ", decode " << s.decode_pages_per_step);
  CHECK(s.tile_tokens * 4 >= cfg.mxu.rows);  // a unit gives each KV head at least an MXU height of rows
  CHECK(s.pages_per_step * s.block_size <= s.tile_tokens);
  CHECK(s.pages_per_step * s.block_size * 2 > s.tile_tokens);
  CHECK(codegen::paged_pages_per_step(s, true) * s.block_size >= cfg.mxu.cols);
  CHECK(codegen::paged_attention_vmem_bytes(cfg, s) <= int64_t(cfg.memory.vmem_bytes));
}

TEST_CASE("paged attention: bad step data is a tpu::Error", "[sim][paged]") {
  codegen::PagedAttentionSpec s{.heads = 4, .kv_heads = 2, .head_dim = 8, .block_size = 4, .max_units = 2};
  const std::vector<int32_t> t{0, 1}, bad{0, 9};
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 1}, {9}, {&t}); }, {"covers fewer"});
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 1}, {5}, {&bad}); }, {"block 9 outside"});
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 3}, {2}, {&t}); }, {"3 tokens with a context of 2"});
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 1, 2, 3}, {1, 1, 1}, {&t, &t, &t}); }, {"3 work units"});
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 1}, {1}, {}); }, {"do not describe one batch"});
  s.kv_heads = 3;
  expect_error([&] { codegen::plan_paged_attention(s, 8, {0, 1}, {1}, {&t}); }, {"invalid spec"});
}

TEST_CASE("serve: the engine with the model on sim (tiny chip, paged attention program) equals cpu generate()",
          "[serve][sim][paged]") {
  tpu::testing::TinySim sim;
  tpu::testing::llm::TinyCfg c;
  auto dir = tpu::testing::llm::temp_dir("serve_paged_sim");
  tpu::testing::llm::write_tiny_model(dir, c, DType::f32, 1, 31);
  auto cpu = models::load_causal_lm(dir.string());
  auto on_chip = models::load_causal_lm(dir.string(), sim.dev());
  std::filesystem::remove_all(dir);
  serve::EngineConfig ec;
  ec.block_size = 4;
  ec.max_num_batched_tokens = 8;  // chunks and decodes share steps
  ec.max_num_seqs = 3;
  ec.max_model_len = 20;
  serve::Engine e(on_chip, ec);
  std::mt19937 rng(8);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : {3, 9, 1, 6, 12}) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(int64_t(rng() % uint32_t(c.vocab)));
    prompts.push_back(p);
  }
  models::GenerationConfig g;
  g.max_new_tokens = 5;
  std::map<int64_t, std::vector<int64_t>> out;
  std::vector<int64_t> ids;
  for (const auto& p : prompts) {
    auto id = std::make_shared<int64_t>(0);
    serve::RequestCallbacks cb;
    cb.on_token = [&out, id](int64_t t) {
      out[*id].push_back(t);
      return true;
    };
    *id = e.add_request(p, serve::SamplingParams::from_generation_config(g), cb);
    ids.push_back(*id);
  }
  tpu::testing::ChipRunProbe probe;
  bool mixed = false;
  for (int i = 0; i < 200 && e.has_work(); ++i) {
    e.step();
    bool chunk = false, decode = false;
    for (auto [id, n] : e.last_schedule()) (n > 1 ? chunk : decode) = true;
    mixed = mixed || (chunk && decode);
  }
  REQUIRE_FALSE(e.has_work());
  CHECK(mixed);
  tpu::testing::ChipRunProbe::sync_all();
  const codegen::CodegenStats st = codegen::stats();
  CHECK(st.runs_by_kernel.count("paged_attention") == 1);
  CHECK(probe.new_runs() > 0);
  for (const auto& f : ops::fallback_counts()) UNSCOPED_INFO("host fallback " << f.op << " x" << f.calls);
  CHECK(probe.new_fallbacks() == 0);  // every op of the step runs on the chip
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(out[ids[i]] == models::generate(*cpu, {prompts[i]}, g)[0]);
  }
  CHECK(e.metrics().blocks_used == 0);
}
