#include "tpucore/serve/paged_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codegen/launch.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "tpucore/core/half.h"
#include "tpucore/core/parallel.h"
#include "tpucore/ops.h"

namespace tpu::serve {
namespace {

using namespace ops;

codegen::PagedAttentionSpec spec_of(const Attrs& a, DType dt) {
  codegen::PagedAttentionSpec s;
  s.heads = a.get_int("heads");
  s.kv_heads = a.get_int("kv_heads");
  s.head_dim = a.get_int("head_dim");
  s.block_size = a.get_int("block_size");
  s.pages_per_step = a.get_int("pages_per_step");
  s.decode_pages_per_step = a.get_int("decode_pages_per_step");
  s.tile_tokens = a.get_int("tile_tokens");
  s.max_units = a.get_int("max_units");
  s.scale = static_cast<float>(a.get_float("scale"));
  s.window = a.get_int("window");
  s.softcap = static_cast<float>(a.get_float("softcap"));
  const bool bf = dt == DType::bf16;
  s.dtype = bf ? sim::DType::bf16 : sim::DType::f32;
  s.mode = bf ? sim::MxuMode::bf16 : sim::MxuMode::f32;  // f32: exact products, as on the cpu
  return s;
}

void paged_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor &q = a.inputs[0], &kn = a.inputs[1], &vn = a.inputs[2], &kc = a.inputs[3], &vc = a.inputs[4];
  const codegen::PagedAttentionSpec s = spec_of(a.attrs, q.dtype());
  TPU_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.block_size > 0 &&
                s.pages_per_step > 0 && s.decode_pages_per_step >= 0 && s.tile_tokens > 0 && s.max_units > 0 &&
                s.window >= 0 && s.softcap >= 0,
            "serve_paged_attention: invalid spec ({} heads, {} kv heads, head_dim {}, block {}, {} pages/step, tile {}, "
            "{} units, window {}, softcap {})",
            s.heads, s.kv_heads, s.head_dim, s.block_size, s.pages_per_step, s.tile_tokens, s.max_units, s.window,
            s.softcap);
  const int64_t qrow = s.heads * s.head_dim, row = s.kv_heads * s.head_dim;
  TPU_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
            "serve_paged_attention: q is {}, want f32 or bf16", dtype_name(q.dtype()));
  TPU_CHECK(q.numel() > 0 && q.numel() % qrow == 0, "serve_paged_attention: q ({}) is not rows of {} heads x {}",
            describe(q), s.heads, s.head_dim);
  const int64_t rows = q.numel() / qrow;
  for (const Tensor* t : {&kn, &vn})
    TPU_CHECK(t->dtype() == q.dtype() && t->device() == q.device() && t->numel() == rows * row,
              "serve_paged_attention: new keys/values ({}) must be {} rows of {} {} values on {}", describe(*t), rows,
              row, dtype_name(q.dtype()), q.device().str());
  for (const Tensor* t : {&kc, &vc})
    TPU_CHECK(t->dtype() == q.dtype() && t->device() == q.device() && t->dim() == 2 && t->size(1) == row &&
                  t->size(0) > 0 && t->size(0) % s.block_size == 0 && t->shape() == kc.shape(),
              "serve_paged_attention: the caches ({}) must be [blocks * {}, {}] {} tensors on {}", describe(*t),
              s.block_size, row, dtype_name(q.dtype()), q.device().str());
  for (int i = 5; i < 8; ++i)
    TPU_CHECK(a.inputs[static_cast<size_t>(i)].dtype() == DType::i32 &&
                  a.inputs[static_cast<size_t>(i)].device() == q.device() && a.inputs[static_cast<size_t>(i)].numel() > 0,
              "serve_paged_attention: the step data ({}) must be non-empty i32 tensors on {}",
              describe(a.inputs[static_cast<size_t>(i)]), q.device().str());
  TPU_CHECK(a.inputs[5].numel() == (1 + s.max_units) * codegen::kPagedUnitWords,
            "serve_paged_attention: the unit table has {} words, want {} ({} units)", a.inputs[5].numel(),
            (1 + s.max_units) * codegen::kPagedUnitWords, s.max_units);
  m.out() = {Shape{rows, qrow}, q.dtype(), q.device()};
}

template <class T>
float load(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p;
  else return static_cast<float>(*p);
}
template <class T>
T store(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return T(v);
}

template <class T>
void paged_cpu_typed(const KernelArgs& a, const codegen::PagedAttentionSpec& s) {
  const Tensor q = a.inputs[0].contiguous(), kn = a.inputs[1].contiguous(), vn = a.inputs[2].contiguous();
  const Tensor &kc = a.inputs[3], &vc = a.inputs[4];
  TPU_CHECK(kc.is_contiguous() && vc.is_contiguous(), "serve_paged_attention: the caches must be contiguous");
  const Tensor units = a.inputs[5].contiguous(), pages = a.inputs[6].contiguous(), slots = a.inputs[7].contiguous();
  const int32_t* u = units.data<int32_t>();
  const int32_t* pg = pages.data<int32_t>();
  const int32_t* sl = slots.data<int32_t>();
  const int64_t d = s.head_dim, hq = s.heads, hkv = s.kv_heads, group = hq / hkv, bs = s.block_size;
  const int64_t row = hkv * d, qrow = hq * d, rows = q.numel() / qrow, cache_rows = kc.size(0);
  const int64_t nblocks = cache_rows / bs, npages = pages.numel();
  const int64_t n = u[0], nunits = static_cast<int64_t>(u[1]) + u[2];
  TPU_CHECK(n >= 0 && n <= rows && n <= slots.numel() && u[1] >= 0 && u[2] >= 0 && nunits <= s.max_units,
            "serve_paged_attention: the step names {} tokens and {} + {} units; the operands hold {} rows, {} slots, "
            "{} units",
            n, u[1], u[2], rows, slots.numel(), s.max_units);
  // Every token's position and first page index (through its unit), checked before anything is written.
  std::vector<int64_t> pos(static_cast<size_t>(n), -1), page0(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < nunits; ++i) {
    const int32_t* r = u + (1 + i) * codegen::kPagedUnitWords;
    const int64_t t0 = r[0], nt = r[1], p0 = r[2], steps = r[3], first = r[4];
    const int64_t pps = codegen::paged_pages_per_step(s, i < u[1]);  // decode units come first
    TPU_CHECK(t0 >= 0 && nt >= 1 && t0 + nt <= n && p0 >= 0 && steps >= 1 && first >= 0 &&
                  first + steps * pps <= npages && (p0 + nt) <= steps * pps * bs,
              "serve_paged_attention: unit {} (tokens {}..{}, position {}, {} steps from page {}) is outside the step "
              "({} tokens, {} page entries)",
              i, t0, t0 + nt, p0, steps, first, n, npages);
    // The pages that hold its keys name blocks; the entries past them are -1 (not read) or blocks.
    const int64_t used = (p0 + nt + bs - 1) / bs;
    for (int64_t j = 0; j < steps * pps; ++j)
      TPU_CHECK((pg[first + j] >= 0 || (j >= used && pg[first + j] == -1)) && pg[first + j] < nblocks,
                "serve_paged_attention: unit {} names block {} of {}", i, pg[first + j], nblocks);
    for (int64_t t = t0; t < t0 + nt; ++t) {
      pos[static_cast<size_t>(t)] = p0 + (t - t0);
      page0[static_cast<size_t>(t)] = first;
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    TPU_CHECK(pos[static_cast<size_t>(t)] >= 0, "serve_paged_attention: token {} belongs to no work unit", t);
    TPU_CHECK(sl[t] >= 0 && sl[t] < cache_rows, "serve_paged_attention: token {} names cache slot {} of {}", t, sl[t],
              cache_rows);
  }
  // 1. Cache update.
  const T* kp = kn.data<T>();
  const T* vp = vn.data<T>();
  T* kcp = static_cast<T*>(kc.raw_data());
  T* vcp = static_cast<T*>(vc.raw_data());
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(kcp + sl[t] * row, kp + t * row, static_cast<size_t>(row) * sizeof(T));
    if (vcp != kcp) std::memcpy(vcp + sl[t] * row, vp + t * row, static_cast<size_t>(row) * sizeof(T));
  }
  // 2. Attention per (token, KV head): the `group` query heads sharing the KV head walk the
  // token's positions 0..pos together (each key and value row read once for all of them),
  // page by page through the unit's page list, each with its own online softmax.
  const T* qp = q.data<T>();
  T* op = static_cast<T*>(a.outputs[0].raw_data());
  std::fill(op + n * qrow, op + rows * qrow, store<T>(0.0f));  // bucket padding rows
  const float sc = s.scale, cap = s.softcap;
  const int64_t win = s.window;
  parallel_for(0, n * hkv, 8, [&](int64_t w0, int64_t w1) {
    const auto gs = static_cast<size_t>(group), ds = static_cast<size_t>(d);
    std::vector<float> acc(gs * ds), qf(gs * ds), m(gs), l(gs), dot(gs);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / hkv, kh = w % hkv, p = pos[static_cast<size_t>(t)];
      const int64_t h0 = kh * group;  // query heads h0 .. h0 + group - 1 read this KV head
      const int32_t* tab = pg + page0[static_cast<size_t>(t)];
      for (int64_t i = 0; i < group * d; ++i) qf[static_cast<size_t>(i)] = load(qp + t * qrow + h0 * d + i);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t lo = win > 0 ? std::max<int64_t>(0, p - win + 1) : 0;  // first visible key
      for (int64_t j0 = lo / bs * bs; j0 <= p; j0 += bs) {
        const int64_t base = static_cast<int64_t>(tab[j0 / bs]) * bs * row + kh * d;
        const int64_t cnt = std::min(bs, p + 1 - j0);
        for (int64_t o = std::max<int64_t>(0, lo - j0); o < cnt; ++o) {
          const T* kr = kcp + base + o * row;
          const T* vr = vcp + base + o * row;
          for (size_t g = 0; g < gs; ++g) {
            const float* qv = qf.data() + g * ds;
            float dd = 0;
            for (int64_t e = 0; e < d; ++e) dd += qv[e] * load(kr + e);
            dot[g] = cap > 0 ? cap * std::tanh(dd * sc / cap) : dd * sc;
          }
          for (size_t g = 0; g < gs; ++g) {
            float* ac = acc.data() + g * ds;
            const float sco = dot[g];
            float weight = 1.0f;
            if (sco > m[g]) {
              const float corr = std::exp(m[g] - sco);  // 0 for the first key (m = -inf)
              for (int64_t e = 0; e < d; ++e) ac[e] *= corr;
              l[g] *= corr;
              m[g] = sco;
            } else {
              weight = std::exp(sco - m[g]);
            }
            for (int64_t e = 0; e < d; ++e) ac[e] += weight * load(vr + e);
            l[g] += weight;
          }
        }
      }
      for (size_t g = 0; g < gs; ++g)
        for (int64_t e = 0; e < d; ++e)
          op[t * qrow + (h0 + static_cast<int64_t>(g)) * d + e] = store<T>(acc[g * ds + static_cast<size_t>(e)] / l[g]);
    }
  });
}

void paged_cpu(const KernelArgs& a) {
  const codegen::PagedAttentionSpec s = spec_of(a.attrs, a.inputs[0].dtype());
  if (a.inputs[0].dtype() == DType::bf16) paged_cpu_typed<bf16>(a, s);
  else paged_cpu_typed<float>(a, s);
}

// On a chip: the ragged paged attention program; the header's token count is read by the
// program, so the host passes the largest count the operands allow (for the operand checks).
void paged_chip(const KernelArgs& a) {
  const Device dev = a.inputs[0].device();
  if (!codegen::runs_generated_programs(dev)) {
    fail("serve_paged_attention: {} runs no chip programs (move the model to the cpu or a sim chip)", dev.str());
  }
  const codegen::PagedAttentionSpec s = spec_of(a.attrs, a.inputs[0].dtype());
  const int64_t qrow = s.heads * s.head_dim, rows = a.inputs[0].numel() / qrow;
  TPU_CHECK(rows >= s.tile_tokens, "serve_paged_attention: {} query rows, fewer than a prefill tile of {}", rows,
            s.tile_tokens);
  const Tensor q = a.inputs[0].contiguous(), kn = a.inputs[1].contiguous(), vn = a.inputs[2].contiguous();
  const Tensor units = a.inputs[5].contiguous(), pages = a.inputs[6].contiguous(), slots = a.inputs[7].contiguous();
  const int64_t cap = std::min(rows - s.tile_tokens + 1, slots.numel());
  codegen::run_paged_attention(s, cap, q, kn, vn, a.inputs[3], a.inputs[4], a.outputs[0], units, pages, slots);
}

TPU_DEFINE_OP(paged_attention_op,
              {.name = "serve_paged_attention", .num_inputs = 8, .flags = kNonDifferentiable, .meta = &paged_meta,
               .cpu = &paged_cpu,
               .doc = "ragged paged attention of one serving step: writes the new keys/values into their cache slots "
                      "in place, then attends through the block tables"});

[[maybe_unused]] const bool g_registered = [] {
  paged_attention_op();
  ops::register_kernel("serve_paged_attention", DeviceType::sim, &paged_chip);
  ops::register_kernel("serve_paged_attention", DeviceType::tpu, &paged_chip);
  return true;
}();

}  // namespace

Tensor paged_attention(const codegen::PagedAttentionSpec& s, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                       const Tensor& k_cache, const Tensor& v_cache, const Tensor& units, const Tensor& pages,
                       const Tensor& slots) {
  return ops::call(paged_attention_op(), {q, k_new, v_new, k_cache, v_cache, units, pages, slots},
                   Attrs{{"heads", s.heads},
                         {"kv_heads", s.kv_heads},
                         {"head_dim", s.head_dim},
                         {"block_size", s.block_size},
                         {"pages_per_step", s.pages_per_step},
                         {"decode_pages_per_step", s.decode_pages_per_step},
                         {"tile_tokens", s.tile_tokens},
                         {"max_units", s.max_units},
                         {"scale", static_cast<double>(s.scale)},
                         {"window", s.window},
                         {"softcap", static_cast<double>(s.softcap)}});
}

}  // namespace tpu::serve
