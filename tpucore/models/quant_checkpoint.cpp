// Quantized Hub checkpoints (quant_checkpoint.h): the quantization_config of fine-grained FP8,
// compressed-tensors float8, GPTQ and AWQ, and the dequantization of their tensors as each
// format defines it.
#include "tpucore/models/quant_checkpoint.h"

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "tpucore/core/float8.h"
#include "tpucore/ops.h"

namespace tpu::models {

using json = nlohmann::json;

namespace {

// Fields that describe how a checkpoint was made, not how its tensors are read.
const std::set<std::string> kQcInformational = {
    "quant_method", "damp_percent", "damp_auto_increment", "true_sequential", "model_name_or_path",
    "model_file_base_name", "quantizer", "meta", "tokenizer", "dataset", "use_cuda_fp16", "use_exllama",
    "exllama_config", "max_input_length", "cache_block_outputs", "batch_size", "pad_token_id", "model_seqlen",
    "block_name_to_quantize", "module_name_preceding_first_block", "modules_in_block_to_quantize", "backend",
    "static_groups", "lm_head", "mse", "do_fuse", "fuse_max_seq_len", "modules_to_fuse", "dequantize", "version",
    "global_compression_ratio", "quantization_status", "observer", "observer_kwargs", "pack_dtype"};

void qc_check_fields(const json& o, const std::set<std::string>& handled, const std::string& where, const char* what) {
  for (const auto& [k, v] : o.items())
    TPU_CHECK(handled.count(k) || kQcInformational.count(k),
              "{}: {} field '{}' ({}) is not supported by load_causal_lm", where, what, k, v.dump());
}

int64_t qc_int(const json& o, const char* key, const std::string& where, int64_t dflt) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_number_integer(), "{}: quantization_config '{}' must be an integer, got {}", where, key, it->dump());
  return it->get<int64_t>();
}

bool qc_bool(const json& o, const char* key, const std::string& where, bool dflt) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  TPU_CHECK(it->is_boolean(), "{}: quantization_config '{}' must be true or false, got {}", where, key, it->dump());
  return it->get<bool>();
}

std::vector<std::string> qc_names(const json& o, const char* key, const std::string& where) {
  std::vector<std::string> v;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return v;
  TPU_CHECK(it->is_array(), "{}: quantization_config '{}' must be a list of module names", where, key);
  for (const json& e : *it) {
    TPU_CHECK(e.is_string(), "{}: quantization_config '{}' must list names, got {}", where, key, e.dump());
    v.push_back(e.get<std::string>());
  }
  return v;
}

// A block size [rows, columns] of positive integers.
std::vector<int64_t> qc_block(const json& v, const std::string& where, const char* key) {
  std::vector<int64_t> b;
  if (v.is_array())
    for (const json& e : v)
      if (e.is_number_integer() && e.get<int64_t>() > 0) b.push_back(e.get<int64_t>());
  TPU_CHECK(v.is_array() && v.size() == 2 && b.size() == 2,
            "{}: quantization_config '{}' must be two positive integers [rows, columns], got {}", where, key, v.dump());
  return b;
}

// Whether a module is named by a modules_to_not_convert / ignore entry: the same name, a name
// ending in "." + entry, or ("re:" prefix) a regular expression matching from the start.
bool qc_listed(const std::vector<std::string>& list, const std::string& module) {
  for (const std::string& p : list) {
    if (p.starts_with("re:")) {
      if (std::regex_search(module, std::regex("^(?:" + p.substr(3) + ")"))) return true;
    } else if (module == p || module.ends_with("." + p)) {
      return true;
    }
  }
  return false;
}

std::string qc_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The 4-bit field i (0..7) of a packed int32.
inline int32_t qc_nibble(int32_t w, int i) { return static_cast<int32_t>((static_cast<uint32_t>(w) >> (4 * i)) & 0xFu); }

}  // namespace

QuantizedCheckpoint::QuantizedCheckpoint(const std::string& text, const std::string& where) : where_(where) {
  json q;
  try {
    q = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: quantization_config: invalid JSON ({})", where, e.what());
  }
  TPU_CHECK(q.is_object() && q.contains("quant_method") && q["quant_method"].is_string(),
            "{}: quantization_config must be an object with a 'quant_method' string, got {}", where, q.dump());
  method = q["quant_method"].get<std::string>();
  if (method == "fp8") {
    qc_check_fields(q, {"activation_scheme", "weight_block_size", "modules_to_not_convert", "fmt"}, where,
                    "quantization_config (fp8)");
    const std::string act = q.value("activation_scheme", std::string("dynamic"));
    TPU_CHECK(act == "dynamic", "{}: fp8 activation_scheme '{}' (static activation scales, input_scale) is not "
              "supported; only 'dynamic' checkpoints load (their weights, with activations kept in float)", where, act);
    const std::string fmt_name = q.value("fmt", std::string("e4m3"));
    TPU_CHECK(fmt_name == "e4m3", "{}: fp8 fmt '{}' is not supported (only e4m3)", where, fmt_name);
    TPU_CHECK(q.contains("weight_block_size") && !q["weight_block_size"].is_null(),
              "{}: fp8 quantization_config without weight_block_size (per-tensor fine-grained fp8) is not supported",
              where);
    block_ = qc_block(q["weight_block_size"], where, "weight_block_size");
    not_converted_ = qc_names(q, "modules_to_not_convert", where);
  } else if (method == "compressed-tensors") {
    qc_check_fields(q, {"format", "config_groups", "ignore", "kv_cache_scheme", "sparsity_config", "transform_config"},
                    where, "quantization_config (compressed-tensors)");
    for (const char* k : {"kv_cache_scheme", "sparsity_config", "transform_config"})
      TPU_CHECK(!q.contains(k) || q[k].is_null() || (q[k].is_object() && q[k].empty()),
                "{}: compressed-tensors '{}' ({}) is not supported", where, k, q[k].dump());
    const std::string status = q.value("quantization_status", std::string("compressed"));
    TPU_CHECK(status == "compressed" || status == "frozen", "{}: compressed-tensors quantization_status '{}' is not "
              "supported (expected compressed)", where, status);
    std::string format = q.value("format", std::string("float-quantized"));
    TPU_CHECK(q.contains("config_groups") && q["config_groups"].is_object() && q["config_groups"].size() == 1,
              "{}: compressed-tensors needs exactly one entry in config_groups, got {}", where,
              q.value("config_groups", json()).dump());
    const json& g = q["config_groups"].begin().value();
    TPU_CHECK(g.is_object(), "{}: compressed-tensors config group must be an object", where);
    qc_check_fields(g, {"targets", "weights", "input_activations", "output_activations", "format"}, where,
                    "compressed-tensors config group");
    if (g.contains("format") && g["format"].is_string()) format = g["format"].get<std::string>();
    TPU_CHECK(format == "float-quantized", "{}: compressed-tensors format '{}' is not supported (only float-quantized "
              "fp8 weights)", where, format);
    TPU_CHECK(!g.contains("output_activations") || g["output_activations"].is_null(),
              "{}: compressed-tensors output_activations quantization is not supported", where);
    if (g.contains("input_activations") && !g["input_activations"].is_null()) {
      const json& a = g["input_activations"];
      TPU_CHECK(a.is_object() && a.value("dynamic", json(false)) == json(true),
                "{}: compressed-tensors static input_activations quantization (input_scale, dynamic {}) is not "
                "supported; dynamic per-token activations load with activations kept in float",
                where, a.is_object() ? a.value("dynamic", json()).dump() : a.dump());
    }
    TPU_CHECK(g.contains("weights") && g["weights"].is_object(), "{}: compressed-tensors config group without weights",
              where);
    const json& w = g["weights"];
    qc_check_fields(w, {"num_bits", "type", "symmetric", "strategy", "group_size", "block_structure", "dynamic",
                        "actorder", "scale_dtype", "zp_dtype"}, where, "compressed-tensors weights");
    TPU_CHECK(qc_int(w, "num_bits", where, 8) == 8 && w.value("type", std::string()) == "float",
              "{}: compressed-tensors weights num_bits {} type {} are not supported (only 8-bit float)", where,
              w.value("num_bits", json()).dump(), w.value("type", json()).dump());
    TPU_CHECK(qc_bool(w, "symmetric", where, true), "{}: compressed-tensors asymmetric fp8 weights (symmetric false) "
              "are not supported", where);
    TPU_CHECK(w.value("dynamic", json(false)) == json(false), "{}: compressed-tensors dynamic weight quantization is "
              "not supported", where);
    TPU_CHECK(!w.contains("actorder") || w["actorder"].is_null() || w["actorder"] == json(false),
              "{}: compressed-tensors weights actorder {} is not supported", where, w.value("actorder", json()).dump());
    ct_strategy_ = w.value("strategy", std::string());
    TPU_CHECK(ct_strategy_ == "channel" || ct_strategy_ == "tensor" || ct_strategy_ == "block",
              "{}: compressed-tensors weight strategy '{}' is not supported (channel, tensor, block)", where,
              ct_strategy_);
    if (ct_strategy_ == "block") {
      json bs = w.value("block_structure", json());
      if (bs.is_string()) {  // older files: "128x128"
        const std::string s = bs.get<std::string>();
        const auto x = s.find('x');
        if (x != std::string::npos) bs = json::array({std::atoll(s.substr(0, x).c_str()), std::atoll(s.substr(x + 1).c_str())});
      }
      block_ = qc_block(bs, where, "block_structure");
    }
    not_converted_ = qc_names(q, "ignore", where);
  } else if (method == "gptq" || method == "awq") {
    const bool gptq = method == "gptq";
    if (gptq)
      qc_check_fields(q, {"bits", "group_size", "desc_act", "sym", "checkpoint_format", "format"}, where,
                      "quantization_config (gptq)");
    else
      qc_check_fields(q, {"bits", "group_size", "zero_point", "version", "modules_to_not_convert"}, where,
                      "quantization_config (awq)");
    const int64_t bits = qc_int(q, "bits", where, 4);
    TPU_CHECK(bits == 4, "{}: {} bits {} is not supported (only 4-bit weights)", where, method, bits);
    group_ = qc_int(q, "group_size", where, 128);
    TPU_CHECK(group_ > 0 || (gptq && group_ == -1), "{}: {} group_size {} is not supported", where, method, group_);
    if (group_ < 0) group_ = 0;
    if (gptq) {
      desc_act_ = qc_bool(q, "desc_act", where, false);
      (void)qc_bool(q, "sym", where, true);  // the zero points are stored either way
      std::string cf = q.value("checkpoint_format", q.value("format", std::string("gptq")));
      TPU_CHECK(cf == "gptq" || cf == "gptq_v2", "{}: gptq checkpoint_format '{}' is not supported (gptq, gptq_v2)",
                where, cf);
      zero_offset_ = cf == "gptq" ? 1 : 0;
    } else {
      TPU_CHECK(qc_bool(q, "zero_point", where, true), "{}: awq zero_point false is not supported", where);
      const std::string v = qc_lower(q.value("version", std::string("gemm")));
      TPU_CHECK(v == "gemm", "{}: awq version '{}' is not supported (only gemm's packing)", where, v);
      not_converted_ = qc_names(q, "modules_to_not_convert", where);
    }
  } else {
    fail("{}: quantization_config quant_method '{}' is not supported (supported: fp8, compressed-tensors, gptq, awq)",
         where, method);
  }
}

bool QuantizedCheckpoint::take(const std::string& name, const Tensor& t) {
  static const char* const kParts[] = {"weight_scale_inv", "weight_scale", "input_scale", "qweight",
                                       "qzeros",           "scales",       "g_idx",       "weight"};
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string part = name.substr(dot + 1), module = name.substr(0, dot);
  bool known = false;
  for (const char* p : kParts) known = known || part == p;
  if (!known) return false;
  if (part == "weight" && !is_float8(t.dtype())) return false;  // an ordinary float weight
  TPU_CHECK(!parts_[module].count(part), "load_causal_lm: '{}' is given twice", name);
  parts_[module][part] = t;
  return true;
}

void QuantizedCheckpoint::finish(const std::function<void(const std::string&, const Tensor&)>& place) {
  for (auto& entry : parts_) {  // not a structured binding: clang-14 lambdas cannot capture one
    const std::string& module = entry.first;
    const std::map<std::string, Tensor>& parts = entry.second;
    const auto has = [&](const char* p) { return parts.count(p) > 0; };
    const auto need = [&](const char* p) -> const Tensor& {
      auto it = parts.find(p);
      TPU_CHECK(it != parts.end(), "load_causal_lm: {} weight '{}' lacks '{}.{}'", method, module, module, p);
      return it->second;
    };
    TPU_CHECK(!qc_listed(not_converted_, module), "load_causal_lm: '{}' is stored quantized but the quantization_config "
              "lists it as not converted", module);
    std::set<std::string> allowed;
    Tensor w;
    if (method == "fp8" || method == "compressed-tensors") {
      const char* scale_name = method == "fp8" ? "weight_scale_inv" : "weight_scale";
      TPU_CHECK(!has("input_scale"), "load_causal_lm: '{}.input_scale': static activation quantization is not "
                "supported", module);
      allowed = {"weight", scale_name};
      const Tensor& q = need("weight");
      const Tensor& s = need(scale_name);
      TPU_CHECK(q.dtype() == DType::f8e4m3 && q.dim() == 2, "load_causal_lm: '{}.weight' must be a 2-D F8_E4M3 tensor "
                "for {}, got {} {}", module, method, dtype_name(q.dtype()), q.shape().str());
      TPU_CHECK(is_floating(s.dtype()), "load_causal_lm: '{}.{}' must be a float tensor, got {}", module, scale_name,
                dtype_name(s.dtype()));
      const int64_t n = q.size(0), k = q.size(1);
      const std::vector<float> qv = q.to_vector<float>(), sv = s.to_vector<float>();
      std::vector<float> out(static_cast<size_t>(n * k));
      const bool blocked = method == "fp8" || ct_strategy_ == "block";
      // The bytes themselves, for the fp8 weight-only linear.
      const auto bytes = [&] {
        const std::vector<f8e4m3> bits = q.to_vector<f8e4m3>();
        std::vector<uint8_t> b(bits.size());
        for (size_t e = 0; e < bits.size(); ++e) b[e] = bits[e].bits;
        return from_vector(b, Shape{n, k});
      };
      if (blocked) {
        const int64_t br = block_[0], bc = block_[1], nr = (n + br - 1) / br, nc = (k + bc - 1) / bc;
        TPU_CHECK(s.dim() == 2 && s.size(0) == nr && s.size(1) == nc, "load_causal_lm: '{}.{}' has shape {}; blocks "
                  "of {}x{} over the {}x{} weight '{}.weight' need scales of shape [{}, {}]", module, scale_name,
                  s.shape().str(), br, bc, n, k, module, nr, nc);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < k; ++j)
            out[i * k + j] = qv[i * k + j] * sv[(i / br) * nc + j / bc];
        fp8_weights[module] = {bytes(), from_vector(sv, Shape{nr, nc}), br, bc};
      } else {
        const int64_t want = ct_strategy_ == "channel" ? n : 1;
        TPU_CHECK(s.numel() == want, "load_causal_lm: '{}.{}' has shape {}; strategy '{}' over {} rows needs {} "
                  "scale(s)", module, scale_name, s.shape().str(), ct_strategy_, n, want);
        std::vector<float> rows(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) rows[i] = sv[want == 1 ? 0 : i];
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < k; ++j) out[i * k + j] = qv[i * k + j] * rows[i];
        fp8_weights[module] = {bytes(), from_vector(rows, Shape{n})};
      }
      w = from_vector(out, Shape{n, k});
    } else {  // gptq, awq
      const bool gptq = method == "gptq";
      allowed = {"qweight", "qzeros", "scales", "g_idx"};
      const Tensor& qw = need("qweight");
      const Tensor& qz = need("qzeros");
      const Tensor& sc = need("scales");
      TPU_CHECK(!has("g_idx") || gptq, "load_causal_lm: awq weight '{}' has a g_idx", module);
      TPU_CHECK(!desc_act_ || has("g_idx"), "load_causal_lm: gptq desc_act (act-order) weight '{}' lacks '{}.g_idx'",
                module, module);
      for (const auto* p : {&qw, &qz})
        TPU_CHECK(p->dtype() == DType::i32 && p->dim() == 2, "load_causal_lm: {} '{}' packed tensors must be 2-D I32, "
                  "got {} {}", method, module, dtype_name(p->dtype()), p->shape().str());
      TPU_CHECK(is_floating(sc.dtype()) && sc.dim() == 2, "load_causal_lm: {} '{}.scales' must be a 2-D float tensor",
                method, module);
      // GPTQ: qweight [K / 8, N] packs 8 input rows per int32; AWQ: [K, N / 8] packs 8 columns.
      const int64_t k = gptq ? qw.size(0) * 8 : qw.size(0), n = gptq ? qw.size(1) : qw.size(1) * 8;
      const int64_t groups = sc.size(0);
      const int64_t gs = group_ > 0 ? group_ : k;
      TPU_CHECK(sc.size(1) == n && qz.size(0) == groups && qz.size(1) * 8 == n,
                "load_causal_lm: {} '{}': qweight {}, qzeros {} and scales {} do not fit one weight", method, module,
                qw.shape().str(), qz.shape().str(), sc.shape().str());
      std::vector<int64_t> gi(static_cast<size_t>(k));
      if (has("g_idx")) {
        const Tensor& g = parts.at("g_idx");
        TPU_CHECK(g.numel() == k && !is_floating(g.dtype()), "load_causal_lm: '{}.g_idx' must hold {} integers, got "
                  "{} {}", module, k, dtype_name(g.dtype()), g.shape().str());
        gi = g.to_vector<int64_t>();
      } else {
        for (int64_t r = 0; r < k; ++r) gi[r] = r / gs;
      }
      TPU_CHECK(has("g_idx") || groups == (k + gs - 1) / gs, "load_causal_lm: {} '{}.scales' has {} groups; {} input "
                "rows in groups of {} need {}", method, module, groups, k, gs, (k + gs - 1) / gs);
      for (int64_t r = 0; r < k; ++r)
        TPU_CHECK(gi[r] >= 0 && gi[r] < groups, "load_causal_lm: '{}.g_idx'[{}] = {} is not a group (0..{})", module, r,
                  gi[r], groups - 1);
      const std::vector<int32_t> qv = qw.to_vector<int32_t>(), zv = qz.to_vector<int32_t>();
      const std::vector<float> sv = sc.to_vector<float>();
      static constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds column 8c + kAwqOrder[i]
      std::vector<int32_t> codes(static_cast<size_t>(k * n)), zeros(static_cast<size_t>(groups * n));
      const int64_t pc = n / 8;
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t c = 0; c < pc; ++c)
          for (int i = 0; i < 8; ++i)
            zeros[g * n + c * 8 + (gptq ? i : kAwqOrder[i])] = qc_nibble(zv[g * pc + c], i) + (gptq ? zero_offset_ : 0);
      if (gptq) {
        for (int64_t r = 0; r < k / 8; ++r)
          for (int64_t c = 0; c < n; ++c)
            for (int i = 0; i < 8; ++i) codes[(r * 8 + i) * n + c] = qc_nibble(qv[r * n + c], i);
      } else {
        for (int64_t r = 0; r < k; ++r)
          for (int64_t c = 0; c < pc; ++c)
            for (int i = 0; i < 8; ++i) codes[r * n + c * 8 + kAwqOrder[i]] = qc_nibble(qv[r * pc + c], i);
      }
      std::vector<float> out(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < k; ++r) {
        const int64_t g = gi[r];
        for (int64_t c = 0; c < n; ++c)
          out[c * k + r] = static_cast<float>(codes[r * n + c] - zeros[g * n + c]) * sv[g * n + c];
      }
      w = from_vector(out, Shape{n, k});
    }
    for (const auto& [p, t] : parts)
      TPU_CHECK(allowed.count(p), "load_causal_lm: '{}.{}' is not a part of a {} weight", module, p, method);
    if (!fp8_weights.count(module)) ++dequantized;
    place(module + ".weight", w);
  }
  parts_.clear();
}

}  // namespace tpu::models
