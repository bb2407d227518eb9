// Row helpers of the quantized KV caches read in place on the cpu (nn::KVCache and the serving
// engine's paged cache): one head's key or value row of d elements, stored as int8 or OCP fp8
// e4m3fn bytes with one f32 scale per row. Each helper picks AVX-512, AVX2 (with F16C) or
// portable code at run time (TPU_CPU_FEATURES as for every kernel).
#pragma once

#include <cstdint>

namespace tpu::kernels {

/// Quantizes x[0, d) into q and returns the row's scale: scale = max |x| / 127 (e4m3: / 448; 1
/// for a zero row) and q = x / scale rounded half to even (e4m3: the OCP conversion), clamped
/// to +-127 (+-448). A row holding a NaN or an infinity gets a NaN scale and zero bytes, so it
/// reads back as NaN.
float kv_quantize_row(const float* x, int64_t d, bool fp8, uint8_t* q);

/// dots[g] = sum over e of q_g[e] * k[e] for the `group` query rows q_g = q + g * q_stride, where
/// k[e] is the stored byte e of one key row as f32 (int8, or the e4m3fn value, NaN kept); the
/// row's scale is not applied. The row is widened in registers once per four query rows.
void kv_key_dots(const uint8_t* k, bool fp8, int64_t d, const float* q, int64_t q_stride, int64_t group, float* dots);

/// out_g[e] = sum over c < count of w[c * group + g] * v_c[e] for the `group` output rows
/// out_g = out + g * out_stride, where v_c is the value row at position pos[c] (bytes v + pos[c] *
/// d, widened as kv_key_dots widens keys; fold each row's scale into its weights). The sums stay
/// in registers across the positions, each row widened once per four output rows.
void kv_weighted_values(const uint8_t* v, bool fp8, int64_t d, const int64_t* pos, int64_t count, const float* w,
                        int64_t group, float* out, int64_t out_stride);

}  // namespace tpu::kernels
