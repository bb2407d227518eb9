// Rotary frequencies of every Hugging Face rope_type and the cos / sin tables (nn/rope.h).
#include "tpucore/nn/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tpucore/autograd.h"
#include "tpucore/ops.h"

namespace tpu::nn {

const std::vector<std::string>& supported_rope_types() {
  static const std::vector<std::string> types{"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  return types;
}

int64_t rope_rotary_dim(int64_t head_dim, const RopeScaling& s) {
  TPU_CHECK(s.partial_rotary_factor > 0 && s.partial_rotary_factor <= 1,
            "rope: partial_rotary_factor must be in (0, 1], got {}", s.partial_rotary_factor);
  const auto dim = static_cast<int64_t>(static_cast<double>(head_dim) * s.partial_rotary_factor);
  TPU_CHECK(dim > 0 && dim % 2 == 0,
            "rope: the rotary dimension int(head_dim {} * partial_rotary_factor {}) = {} must be positive and even",
            head_dim, s.partial_rotary_factor, dim);
  return dim;
}

bool rope_depends_on_length(const RopeScaling& s) { return s.type == "dynamic" || s.type == "longrope"; }

namespace {

// theta^(-2i/dim), i < dim / 2.
std::vector<double> base_freqs(int64_t dim, double theta) {
  std::vector<double> f(static_cast<size_t>(dim / 2));
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
  return f;
}

// yarn's magnitude correction 0.1 * m * ln(scale) + 1 (1 for scale <= 1).
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

RopeFrequencies yarn(int64_t dim, double theta, const RopeScaling& s, double max_pos) {
  const double orig = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : max_pos;
  TPU_CHECK(orig > 0, "rope_scaling yarn: original_max_position_embeddings must be positive, got {}", orig);
  // Transformers v5: an explicit factor wins; without one, the ratio of the two contexts.
  const double factor = s.factor > 0 ? s.factor : max_pos / orig;
  TPU_CHECK(factor > 0, "rope_scaling yarn: factor must be positive, got {}", factor);
  TPU_CHECK(s.beta_fast > 0 && s.beta_slow > 0, "rope_scaling yarn: beta_fast ({}) and beta_slow ({}) must be positive",
            s.beta_fast, s.beta_slow);
  RopeFrequencies r;
  if (s.attention_factor > 0) r.attention_scaling = s.attention_factor;
  else if (s.mscale > 0 && s.mscale_all_dim > 0)
    r.attention_scaling = yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim);
  else
    r.attention_scaling = yarn_mscale(factor, 1.0);
  // The dimension whose wavelength makes `rotations` turns over the original context.
  const double d = static_cast<double>(dim);
  auto dim_of = [&](double rotations) {
    return d * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double lo = dim_of(s.beta_fast), hi = dim_of(s.beta_slow);
  if (s.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, d - 1);
  if (lo == hi) hi += 0.001;
  r.inv_freq = base_freqs(dim, theta);
  for (size_t i = 0; i < r.inv_freq.size(); ++i) {
    // ramp 0 below lo (extrapolate: keep the frequency), 1 above hi (interpolate: divide by factor).
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    const double keep = 1.0 - ramp, f = r.inv_freq[i];
    r.inv_freq[i] = f / factor * (1.0 - keep) + f * keep;
  }
  return r;
}

RopeFrequencies longrope(int64_t dim, double theta, const RopeScaling& s, double max_pos, int64_t seq_len) {
  const size_t half = static_cast<size_t>(dim / 2);
  TPU_CHECK(s.short_factor.size() == half && s.long_factor.size() == half,
            "rope_scaling longrope: short_factor and long_factor need {} entries (rotary_dim / 2), got {} and {}",
            half, s.short_factor.size(), s.long_factor.size());
  double orig = max_pos, factor = s.factor;
  if (s.original_max_position_embeddings > 0) {
    orig = s.original_max_position_embeddings;
    factor = max_pos / orig;
  }
  TPU_CHECK(orig > 0 && factor > 0,
            "rope_scaling longrope: factor ({}) and original_max_position_embeddings ({}) must be positive", factor, orig);
  RopeFrequencies r;
  if (s.attention_factor > 0) r.attention_scaling = s.attention_factor;
  else r.attention_scaling = factor <= 1 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(orig));
  const bool is_long = static_cast<double>(seq_len) > orig;
  const auto& ext = is_long ? s.long_factor : s.short_factor;
  r.inv_freq = base_freqs(dim, theta);
  for (size_t i = 0; i < half; ++i) {
    TPU_CHECK(ext[i] > 0, "rope_scaling longrope: {}[{}] must be positive, got {}",
              is_long ? "long_factor" : "short_factor", i, ext[i]);
    r.inv_freq[i] /= ext[i];
  }
  return r;
}

}  // namespace

RopeFrequencies rope_frequencies(int64_t head_dim, double theta, const RopeScaling& s, double max_pos,
                                 int64_t seq_len) {
  TPU_CHECK(head_dim > 0, "rope: head_dim must be positive, got {}", head_dim);
  TPU_CHECK(theta > 0 && std::isfinite(theta), "rope: rope_theta must be positive, got {}", theta);
  const auto& types = supported_rope_types();
  TPU_CHECK(std::find(types.begin(), types.end(), s.type) != types.end(),
            "rope_scaling: unsupported rope_type '{}' (supported: {})", s.type, fmt::join(types, ", "));
  const int64_t dim = rope_rotary_dim(head_dim, s);
  if (s.type == "yarn") return yarn(dim, theta, s, max_pos);
  if (s.type == "longrope") return longrope(dim, theta, s, max_pos, seq_len);
  RopeFrequencies r;
  if (s.type == "default") {
    r.inv_freq = base_freqs(dim, theta);
    return r;
  }
  TPU_CHECK(s.factor > 0 && std::isfinite(s.factor), "rope_scaling {}: factor must be positive, got {}", s.type,
            s.factor);
  if (s.type == "dynamic") {
    TPU_CHECK(max_pos > 0 && dim > 2, "rope_scaling dynamic: needs max_position_embeddings > 0 ({}) and rotary_dim > 2 ({})",
              max_pos, dim);
    const double len = std::max(static_cast<double>(seq_len), max_pos);
    const double d = static_cast<double>(dim);
    r.inv_freq = base_freqs(dim, theta * std::pow(s.factor * len / max_pos - (s.factor - 1.0), d / (d - 2.0)));
    return r;
  }
  r.inv_freq = base_freqs(dim, theta);
  if (s.type == "linear") {
    for (double& v : r.inv_freq) v /= s.factor;
    return r;
  }
  // llama3
  TPU_CHECK(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0 && s.original_max_position_embeddings > 0,
            "rope_scaling llama3: need 0 < low_freq_factor ({}) < high_freq_factor ({}) and a positive "
            "original_max_position_embeddings ({})",
            s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  const double old_len = s.original_max_position_embeddings;
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  for (double& v : r.inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / v;
    if (wavelen > low_wavelen) {
      v /= s.factor;  // low frequencies: fully scaled
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1.0 - smooth) * v / s.factor + smooth * v;
    }  // high frequencies stay
  }
  return r;
}

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  TPU_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim must be positive and even, got {}", head_dim);
  return rope_frequencies(head_dim, theta, s).inv_freq;
}

std::pair<Tensor, Tensor> rope_tables(const std::vector<int64_t>& pos, int64_t b, const std::vector<double>& inv_freq,
                                      DType dtype, Device device, double scaling) {
  TPU_CHECK(b > 0 && !pos.empty() && pos.size() % static_cast<size_t>(b) == 0,
            "rope_tables: {} positions do not split into batch {}", pos.size(), b);
  const int64_t t = static_cast<int64_t>(pos.size()) / b, half = static_cast<int64_t>(inv_freq.size()), d = 2 * half;
  const auto sc = static_cast<float>(scaling);
  std::vector<float> c(static_cast<size_t>(b * t * d)), s(c.size());
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t i = 0; i < half; ++i) {
      // In f32 like the reference implementations (position * inv_freq rounded once).
      const float ang = static_cast<float>(pos[r]) * static_cast<float>(inv_freq[static_cast<size_t>(i)]);
      for (int64_t k : {i, i + half}) {
        c[r * static_cast<size_t>(d) + static_cast<size_t>(k)] = std::cos(ang) * sc;
        s[r * static_cast<size_t>(d) + static_cast<size_t>(k)] = std::sin(ang) * sc;
      }
    }
  NoGradGuard ng;
  return {from_vector(c, Shape{b, 1, t, d}, TensorOptions(dtype, device)),
          from_vector(s, Shape{b, 1, t, d}, TensorOptions(dtype, device))};
}

}  // namespace tpu::nn
