// GGUF writer (see gguf_writer.h).
#include "gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tpucore/core/error.h"
#include "tpucore/core/half.h"
#include "tpucore/models/causal_lm.h"

namespace tpu::gguf {

namespace {

// GGUF metadata value types.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof v);
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}
void pad_to(std::vector<uint8_t>& out, uint64_t base, uint32_t alignment) {
  while ((base + out.size()) % alignment != 0) out.push_back(0);
}

}  // namespace

const char* type_name(TensorType t) {
  switch (t) {
    case TensorType::f32: return "f32";
    case TensorType::f16: return "f16";
    case TensorType::bf16: return "bf16";
    case TensorType::q8_0: return "q8_0";
    case TensorType::q4_0: return "q4_0";
  }
  return "?";
}

TensorType parse_type(const std::string& name) {
  for (TensorType t : {TensorType::f32, TensorType::f16, TensorType::bf16, TensorType::q8_0, TensorType::q4_0})
    if (name == type_name(t)) return t;
  fail("gguf: unknown tensor type '{}' (f32, f16, bf16, q8_0 or q4_0)", name);
}

size_t type_bytes(TensorType t, int64_t n) {
  TPU_CHECK(n >= 0, "gguf: negative element count {}", n);
  const auto un = static_cast<size_t>(n);
  if (t == TensorType::f32) return 4 * un;
  if (t == TensorType::f16 || t == TensorType::bf16) return 2 * un;
  TPU_CHECK(n % 32 == 0, "gguf: {} needs a multiple of 32 values per row, got {}", type_name(t), n);
  return (un / 32) * (t == TensorType::q8_0 ? 34 : 18);
}

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n) {
  std::vector<uint8_t> out(type_bytes(TensorType::q8_0, n));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * 34;
    const uint16_t dh = f16::from_f32(d);
    std::memcpy(blk, &dh, 2);
    for (int i = 0; i < 32; ++i) {
      const auto q = static_cast<int8_t>(std::lround(v[i] * id));
      std::memcpy(blk + 2 + i, &q, 1);
    }
  }
  return out;
}

std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n) {
  std::vector<uint8_t> out(type_bytes(TensorType::q4_0, n));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0, m = 0;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), m = v[i];
    const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * 18;
    const uint16_t dh = f16::from_f32(d);
    std::memcpy(blk, &dh, 2);
    auto code = [&](float f) { return static_cast<uint8_t>(std::min(15, static_cast<int>(f * id + 8.5f))); };
    for (int i = 0; i < 16; ++i) blk[2 + i] = static_cast<uint8_t>(code(v[i]) | (code(v[i + 16]) << 4));
  }
  return out;
}

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  TPU_CHECK(alignment >= 8 && (alignment & (alignment - 1)) == 0, "gguf: alignment {} is not a power of two >= 8",
            alignment);
  if (alignment != 32) add_u32("general.alignment", alignment);
}

void Writer::add_string(const std::string& key, const std::string& v) {
  put_str(kv_, key), put(kv_, kString), put_str(kv_, v), ++kv_count_;
}
void Writer::add_u32(const std::string& key, uint32_t v) { put_str(kv_, key), put(kv_, kU32), put(kv_, v), ++kv_count_; }
void Writer::add_i32(const std::string& key, int32_t v) { put_str(kv_, key), put(kv_, kI32), put(kv_, v), ++kv_count_; }
void Writer::add_f32(const std::string& key, float v) { put_str(kv_, key), put(kv_, kF32), put(kv_, v), ++kv_count_; }
void Writer::add_bool(const std::string& key, bool v) {
  put_str(kv_, key), put(kv_, kBool), put<uint8_t>(kv_, v ? 1 : 0), ++kv_count_;
}
void Writer::add_strings(const std::string& key, const std::vector<std::string>& v) {
  put_str(kv_, key), put(kv_, kArray), put(kv_, kString), put<uint64_t>(kv_, v.size());
  for (const auto& s : v) put_str(kv_, s);
  ++kv_count_;
}
void Writer::add_f32s(const std::string& key, const std::vector<float>& v) {
  put_str(kv_, key), put(kv_, kArray), put(kv_, kF32), put<uint64_t>(kv_, v.size());
  put_bytes(kv_, v.data(), 4 * v.size()), ++kv_count_;
}
void Writer::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  put_str(kv_, key), put(kv_, kArray), put(kv_, kI32), put<uint64_t>(kv_, v.size());
  put_bytes(kv_, v.data(), 4 * v.size()), ++kv_count_;
}

void Writer::add_tensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type,
                        const float* values) {
  TPU_CHECK(!shape.empty() && shape.size() <= 4, "gguf: tensor '{}' has {} dimensions (1 to 4)", name, shape.size());
  int64_t n = 1;
  for (int64_t d : shape) {
    TPU_CHECK(d > 0, "gguf: tensor '{}' has a dimension of {}", name, d);
    n *= d;
  }
  for (const auto& t : tensors_) TPU_CHECK(t.name != name, "gguf: tensor '{}' added twice", name);
  (void)type_bytes(type, shape.back());  // rows of whole blocks
  pad_to(data_, 0, alignment_);
  tensors_.push_back({name, shape, type, data_.size()});
  if (type == TensorType::f32) {
    put_bytes(data_, values, 4 * static_cast<size_t>(n));
  } else if (type == TensorType::f16 || type == TensorType::bf16) {
    for (int64_t i = 0; i < n; ++i)
      put<uint16_t>(data_, type == TensorType::f16 ? f16::from_f32(values[i]) : bf16::from_f32(values[i]));
  } else {
    const auto q = type == TensorType::q8_0 ? quantize_q8_0(values, n) : quantize_q4_0(values, n);
    put_bytes(data_, q.data(), q.size());
  }
}

void Writer::write(const std::string& path) const {
  std::vector<uint8_t> head;
  put_bytes(head, "GGUF", 4);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_count_);
  put_bytes(head, kv_.data(), kv_.size());
  for (const auto& t : tensors_) {
    put_str(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(head, static_cast<uint64_t>(*it));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, t.offset);
  }
  pad_to(head, 0, alignment_);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  TPU_CHECK(f != nullptr, "gguf: cannot open '{}' for writing", path);
  bool ok = std::fwrite(head.data(), 1, head.size(), f.get()) == head.size();
  ok = ok && std::fwrite(data_.data(), 1, data_.size(), f.get()) == data_.size();
  ok = std::fflush(f.get()) == 0 && ok;
  TPU_CHECK(ok, "gguf: writing '{}' failed", path);
}

namespace {

// The rows of a [heads * head_dim, K] projection from the half-split rotary layout (the first
// head_dim / 2 rows of a head pair with the second half) to interleaved pairs (rows 2i, 2i + 1).
std::vector<float> interleave_rotary_rows(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t k) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t i = 0; i < half; ++i)
        std::copy_n(w.data() + ((h * head_dim) + part * half + i) * k, k,
                    out.data() + ((h * head_dim) + 2 * i + part) * k);
  return out;
}

std::vector<float> float_values(const Tensor& t) {
  const Tensor c = t.to(Device{}).to(DType::f32).contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

}  // namespace

void write_llama_gguf(const models::CausalLM& m, const std::string& path, const LlamaOptions& o) {
  const models::ModelConfig& c = m.config;
  TPU_CHECK(!c.gemma && !c.attention_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && c.num_experts == 0 &&
                c.sliding_window == 0 && c.hidden_act == "silu" && c.rope_scaling.type == "default",
            "gguf: write_llama_gguf takes a Llama-layout model (model_type '{}' has biases, Gemma norms, q/k norms, "
            "experts, sliding windows, rope scaling or a non-SiLU activation)",
            c.model_type);
  TPU_CHECK(c.head_dim % 2 == 0, "gguf: head_dim {} is odd", c.head_dim);
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", o.name);
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.add_u32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.add_u32("llama.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.add_u32("llama.attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.add_u32("llama.attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w.add_f32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  // The placeholder vocabulary: <unk>, <s>, </s>, the byte tokens, then one piece per id.
  TPU_CHECK(c.vocab_size >= 259, "gguf: a vocabulary of {} ids is smaller than the 259 special and byte tokens",
            c.vocab_size);
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<int32_t> kinds{2, 3, 3};  // unknown, control, control
  for (int b = 0; b < 256; ++b) tokens.push_back(fmt::format("<0x{:02X}>", b)), kinds.push_back(6);  // byte
  for (int64_t i = 259; i < c.vocab_size; ++i) tokens.push_back(fmt::format("\xe2\x96\x81t{}", i)), kinds.push_back(1);
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", kinds);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", false);

  std::vector<std::pair<std::string, Tensor>> params = m.named_parameters();
  auto find = [&](const std::string& name) -> const Tensor& {
    for (const auto& [n, t] : params)
      if (n == name) return t;
    fail("gguf: the model has no parameter '{}' (a quantized model cannot be written: write the float model)", name);
  };
  auto add = [&](const std::string& gname, const std::string& pname, TensorType type, int64_t rotary_heads = 0) {
    const Tensor& t = find(pname);
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    std::vector<float> v = float_values(t);
    if (rotary_heads > 0) v = interleave_rotary_rows(v, rotary_heads, c.head_dim, shape.back());
    w.add_tensor(gname, shape, type, v.data());
  };
  add("token_embd.weight", "model.embed_tokens.weight", o.embed_type);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l), b = fmt::format("blk.{}.", l);
    add(b + "attn_norm.weight", p + "input_layernorm.weight", TensorType::f32);
    add(b + "attn_q.weight", p + "self_attn.q_proj.weight", o.type, c.num_attention_heads);
    add(b + "attn_k.weight", p + "self_attn.k_proj.weight", o.type, c.num_key_value_heads);
    add(b + "attn_v.weight", p + "self_attn.v_proj.weight", o.type);
    add(b + "attn_output.weight", p + "self_attn.o_proj.weight", o.type);
    add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", TensorType::f32);
    add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", o.type);
    add(b + "ffn_up.weight", p + "mlp.up_proj.weight", o.type);
    add(b + "ffn_down.weight", p + "mlp.down_proj.weight", o.type);
  }
  add("output_norm.weight", "model.norm.weight", TensorType::f32);
  if (!c.tie_word_embeddings) add("output.weight", "lm_head.weight", o.type);
  w.write(path);
}

}  // namespace tpu::gguf
