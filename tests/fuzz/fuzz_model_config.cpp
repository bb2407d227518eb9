// Fuzzes the config.json reader of the decoder family (tpu::models::ModelConfig::from_json) and
// the rope frequencies of an accepted config. An accepted config must write back (to_json) into
// text that reads again into the same layer kinds, rope type and sizes, and its rope frequencies
// are finite and positive or a tpu::Error.
#include <cmath>
#include <string>

#include "tpucore/core/error.h"
#include "tpucore/models.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tpu::models::ModelConfig c;
  try {
    c = tpu::models::ModelConfig::from_json(text, "fuzz");
  } catch (const tpu::Error&) {
    return 0;
  }
  tpu::models::ModelConfig back;
  try {
    back = tpu::models::ModelConfig::from_json(c.to_json(), "fuzz round trip");
  } catch (const tpu::Error&) {
    tpu_fuzz::finding("an accepted config does not read back from to_json");
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (back.is_sliding(i) != c.is_sliding(i)) tpu_fuzz::finding("to_json -> from_json changed a layer kind");
  if (back.model_type != c.model_type || back.sliding_window != c.sliding_window || back.rope_scaling.type != c.rope_scaling.type ||
      back.hidden_size != c.hidden_size || back.num_hidden_layers != c.num_hidden_layers ||
      back.rope_theta != c.rope_theta)
    tpu_fuzz::finding("to_json -> from_json changed the config");
  try {
    const int64_t d = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
    if (d > 0 && d <= 4096) {
      const auto f = tpu::nn::rope_frequencies(d, c.rope_theta, c.rope_scaling,
                                               static_cast<double>(c.max_position_embeddings), 1 << 20);
      for (double v : f.inv_freq)
        if (!(v >= 0) || std::isinf(v)) tpu_fuzz::finding("rope_frequencies gave a negative, infinite or NaN frequency");
    }
  } catch (const tpu::Error&) {
  }
  return 0;
}
