// GGUF files (the model format of llama.cpp / ggml, version 3) from tpucore models.
//
// Writer: a header ("GGUF", version 3, tensor count, key-value count), typed key-value metadata,
// the tensor infos (name, dimensions innermost first, ggml type, offset into the data section),
// then the tensor data, every tensor starting at a multiple of the alignment (32 bytes unless
// general.alignment says otherwise). Tensor types: F32, F16, BF16 and the block formats Q8_0
// (32 values: an f16 scale max|x| / 127, 32 int8) and Q4_0 (32 values: an f16 scale d = m / -8
// with m the value of largest magnitude, 16 bytes of 4-bit codes q, value (q - 8) * d; the low
// nibbles hold values 0-15, the high nibbles 16-31).
//
// write_llama_gguf writes a Llama-layout CausalLM (RMSNorm, SiLU-gated MLP, rotary attention
// without biases) as architecture `llama`: the hyperparameters under `llama.*`, the tensors under
// llama.cpp's names (token_embd, blk.N.attn_q, ..., output_norm, output), the query and key
// projections' rows permuted from the half-split rotary layout of the Hub checkpoints to the
// interleaved-pair layout of llama.cpp's `llama` architecture, and a placeholder SentencePiece
// vocabulary (tokenizer.ggml.model "llama": <unk>, <s>, </s>, the 256 byte tokens, then one
// piece per remaining id), enough for llama.cpp to load the model and run it on token ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpu::models {
class CausalLM;
}

namespace tpu::gguf {

/// ggml tensor types written here (the numbers are ggml's).
enum class TensorType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, bf16 = 30 };

/// "f32", "f16", "bf16", "q8_0", "q4_0".
const char* type_name(TensorType t);
/// The inverse of type_name; anything else is a tpu::Error naming the accepted types.
TensorType parse_type(const std::string& name);
/// Bytes of n values (n a multiple of 32 for the block types, else a tpu::Error).
size_t type_bytes(TensorType t, int64_t n);

/// One 34-byte Q8_0 block per 32 values of x (n a multiple of 32).
std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n);
/// One 18-byte Q4_0 block per 32 values of x (n a multiple of 32).
std::vector<uint8_t> quantize_q4_0(const float* x, int64_t n);

/// Builds a GGUF file in memory, then writes it.
class Writer {
 public:
  explicit Writer(uint32_t alignment = 32);
  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  /// A tensor of row-major shape `shape` (outermost first, as tpucore's) stored as `type`;
  /// `values` holds its numel() floats. The GGUF dimensions are written innermost first.
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type, const float* values);
  /// Writes the file (a tpu::Error when it cannot).
  void write(const std::string& path) const;

 private:
  struct TensorInfo {
    std::string name;
    std::vector<int64_t> shape;
    TensorType type;
    uint64_t offset;
  };
  uint32_t alignment_;
  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<uint8_t> data_;
};

struct LlamaOptions {
  TensorType type = TensorType::f32;        ///< the decoder's projections and the output head
  TensorType embed_type = TensorType::f32;  ///< token_embd (the head too when the model ties them)
  std::string name = "tpucore-llama";       ///< general.name
};

/// Writes a Llama-layout model (see the file comment); any other layout (biases, Gemma norms,
/// sparse layers, rope scaling, a non-SiLU activation) is a tpu::Error naming what is missing.
void write_llama_gguf(const models::CausalLM& m, const std::string& path, const LlamaOptions& o = {});

}  // namespace tpu::gguf
