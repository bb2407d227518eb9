// Rotary position embeddings of the Hugging Face decoder families: the inverse frequencies of
// every rope_type Transformers defines (default, linear, dynamic NTK, yarn, longrope, llama3),
// partial rotary dimensions, the attention scaling some types apply to cos and sin, and the cos /
// sin tables of a batch of positions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::nn {

/// A config's rope_scaling / rope_parameters entry (Transformers' names and defaults).
/// - "linear": every frequency divided by `factor`;
/// - "dynamic": NTK-aware, the base grows to theta * (factor * L / max_pos - (factor - 1))^(d/(d-2))
///   once the sequence length L (largest position + 1) passes max_position_embeddings;
/// - "yarn": frequencies blended between theta^(-2i/d) / factor and theta^(-2i/d) by a linear
///   ramp over dims [low, high] found from beta_fast / beta_slow rotations over the original
///   context; cos and sin scaled by attention_factor (default 0.1 ln(factor) + 1, or the ratio of
///   the mscale / mscale_all_dim terms);
/// - "longrope": theta^(-2i/d) / short_factor[i] while L <= original context, else / long_factor[i];
///   cos and sin scaled by attention_factor (default sqrt(1 + ln(s) / ln(original)), s =
///   max_position_embeddings / original);
/// - "llama3": low frequencies (wavelength above original / low_freq_factor) divided by factor,
///   high ones (wavelength below original / high_freq_factor) kept, a smooth blend between.
struct RopeScaling {
  std::string type = "default";   ///< default, linear, dynamic, yarn, longrope, llama3
  double factor = 1.0;            ///< the scaling factor (0: unset, for yarn and longrope)
  double low_freq_factor = 1.0;   ///< llama3
  double high_freq_factor = 4.0;  ///< llama3
  double original_max_position_embeddings = 8192;  ///< llama3, yarn, longrope: the original context (0: unset)
  double beta_fast = 32.0;          ///< yarn: rotations at the high end of the ramp
  double beta_slow = 1.0;           ///< yarn: rotations at the low end of the ramp
  double mscale = 0.0;              ///< yarn: DeepSeek's mscale (0: unset)
  double mscale_all_dim = 0.0;      ///< yarn: DeepSeek's mscale_all_dim (0: unset)
  double attention_factor = 0.0;    ///< yarn, longrope: scale of cos and sin (0: the type's default)
  bool truncate = true;             ///< yarn: round the ramp's ends to whole dims
  std::vector<double> short_factor{};  ///< longrope: per-frequency divisors within the original context
  std::vector<double> long_factor{};   ///< longrope: per-frequency divisors beyond it
  double partial_rotary_factor = 1.0;  ///< the fraction of head_dim that rotates (the rest passes)
};

/// The rope types rope_frequencies implements.
const std::vector<std::string>& supported_rope_types();

/// Inverse frequencies (one per rotated pair) and the scale applied to cos and sin.
struct RopeFrequencies {
  std::vector<double> inv_freq;    ///< rotary_dim / 2 frequencies
  double attention_scaling = 1.0;  ///< multiplies cos and sin (yarn, longrope)
};

/// The rotary dimension of a head: int(head_dim * partial_rotary_factor), even and positive.
int64_t rope_rotary_dim(int64_t head_dim, const RopeScaling& scaling);

/// Frequencies of `scaling` for heads of head_dim (rotary_dim = rope_rotary_dim), base theta.
/// max_position_embeddings: the config's; seq_len: the largest position + 1 of the forward (the
/// sequence-length-dependent types dynamic and longrope; 0: the config's context). A parameter
/// out of range, or an unknown type, is a tpu::Error naming it.
RopeFrequencies rope_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling,
                                 double max_position_embeddings = 2048, int64_t seq_len = 0);

/// Whether the frequencies of `scaling` depend on the sequence length (dynamic, longrope).
bool rope_depends_on_length(const RopeScaling& scaling);

/// The inverse frequencies alone (rope_frequencies with the default context).
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});

/// cos and sin tables for positions [B, T] (a host vector of B * T positions): [B, 1, T, 2 *
/// inv_freq.size()] with column k using inv_freq[k mod half] (the rotate-half layout of
/// tpu::rotary_embedding), multiplied by attention_scaling, computed in f32 and stored in dtype
/// on device.
std::pair<Tensor, Tensor> rope_tables(const std::vector<int64_t>& positions, int64_t batch,
                                      const std::vector<double>& inv_freq, DType dtype, Device device,
                                      double attention_scaling = 1.0);

}  // namespace tpu::nn
