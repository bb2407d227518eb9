// run_paged_attention: checks the operands and launches the cached program (paged_attention.h).
#include "codegen/launch.h"
#include "codegen/paged_attention.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

void run_paged_attention(const PagedAttentionSpec& spec, int64_t num_tokens, const Tensor& q, const Tensor& k_new,
                         const Tensor& v_new, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                         const Tensor& units, const Tensor& pages, const Tensor& slots) {
  const Device dev = out.device();
  TPU_CHECK(runs_generated_programs(dev), "paged_attention: {} runs no chip programs", dev.str());
  const DType dt = spec.dtype == sim::DType::bf16 ? DType::bf16 : DType::f32;
  TPU_CHECK(spec.dtype == sim::DType::bf16 || spec.dtype == sim::DType::f32,
            "paged_attention: dtype {} (want f32 or bf16)", sim::dtype_name(spec.dtype));
  const int64_t row = spec.kv_heads * spec.head_dim, qrow = spec.heads * spec.head_dim;
  struct Want {
    const char* name;
    const Tensor* t;
    DType dtype;
    int64_t min_numel, multiple;
  };
  const Want wants[] = {{"q", &q, dt, num_tokens * qrow, qrow},
                        {"k_new", &k_new, dt, num_tokens * row, row},
                        {"v_new", &v_new, dt, num_tokens * row, row},
                        {"k_cache", &k_cache, dt, spec.block_size * row, spec.block_size * row},
                        {"v_cache", &v_cache, dt, k_cache.numel(), spec.block_size * row},
                        {"out", &out, dt, num_tokens * qrow, qrow},
                        {"units", &units, DType::i32, (1 + spec.max_units) * kPagedUnitWords, 1},
                        {"pages", &pages, DType::i32, 1, 1},
                        {"slots", &slots, DType::i32, num_tokens, 1}};
  for (const Want& w : wants) {
    TPU_CHECK(w.t->device() == dev && w.t->is_contiguous() && w.t->dtype() == w.dtype && w.t->numel() >= w.min_numel &&
                  w.t->numel() % w.multiple == 0,
              "paged_attention: {} must be a contiguous {} tensor on {} with at least {} elements (a multiple of {}); "
              "got {} {} elements on {}",
              w.name, dtype_name(w.dtype), dev.str(), w.min_numel, w.multiple, dtype_name(w.t->dtype()), w.t->numel(),
              w.t->device().str());
  }
  const sim::ChipConfig& cfg = chip_config(dev);
  const LoadedProgram p =
      cached_program(dev, paged_attention_key(spec), [&] { return make_paged_attention_program(cfg, spec); });
  launch(dev, p, "paged_attention",
         {hbm_address(q), hbm_address(k_new), hbm_address(v_new), hbm_address(k_cache), hbm_address(v_cache),
          hbm_address(out), hbm_address(units), hbm_address(pages), hbm_address(slots)});
}

}  // namespace tpu::codegen
