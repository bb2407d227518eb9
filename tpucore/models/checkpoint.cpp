// Loading and saving Hugging Face checkpoint folders (config.json parsing: config.cpp). Loading
// streams: the model is created without random initialisation in the dtype asked for, and each
// tensor is read from its safetensors file, converted into its parameter and dropped before the
// next one is read, so the peak memory is the model plus about one tensor.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>

#include "tpucore/autograd.h"
#include "tpucore/core/log.h"
#include "tpucore/models/causal_lm.h"
#include "tpucore/models/quant_checkpoint.h"
#include "tpucore/safetensors.h"

namespace tpu::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text(const fs::path& p, const char* what) {
  std::ifstream f(p, std::ios::binary);
  TPU_CHECK(f.good(), "{}: cannot open {}", what, p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The files of the checkpoint with the names each must provide (empty set: every tensor of a
// single model.safetensors).
std::map<std::string, std::set<std::string>> weight_files(const fs::path& root) {
  const fs::path single = root / "model.safetensors", index = root / "model.safetensors.index.json";
  std::map<std::string, std::set<std::string>> by_file;
  if (!fs::exists(index)) {
    TPU_CHECK(fs::exists(single), "load_causal_lm: {} has neither model.safetensors nor model.safetensors.index.json",
              root.string());
    by_file["model.safetensors"];
    return by_file;
  }
  json j;
  try {
    j = json::parse(read_text(index, "load_causal_lm"));
  } catch (const json::exception& e) {
    fail("load_causal_lm: {}: invalid JSON ({})", index.string(), e.what());
  }
  TPU_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
            "load_causal_lm: {}: expected an object with a 'weight_map' object", index.string());
  for (const auto& [name, file] : j["weight_map"].items()) {
    TPU_CHECK(file.is_string(), "load_causal_lm: {}: weight_map['{}'] must be a file name", index.string(), name);
    const std::string f = file.get<std::string>();
    TPU_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find("..") == std::string::npos,
              "load_causal_lm: {}: weight_map['{}'] names '{}', not a file in the folder", index.string(), name, f);
    by_file[f].insert(name);
  }
  return by_file;
}

// The fp8 weights (per-channel or block scales) of the projections in fp8 weight-only linears;
// the other quantized weights stay as their dequantized float (said in the log).
void use_checkpoint_quantization(CausalLM& m, QuantizedCheckpoint& q, const std::string& dir) {
  int64_t kept = 0;
  const auto swap = [&](nn::Module& parent, const std::string& prefix, const char* child,
                        std::shared_ptr<nn::Linear>& slot) {
    auto it = q.fp8_weights.find(prefix + child);
    if (!slot || it == q.fp8_weights.end()) return;
    const Fp8Weight& w = it->second;
    auto ql = std::make_shared<nn::QuantizedLinear>(w.q, w.scale, slot->bias, w.block_n, w.block_k);
    parent.replace_child(child, ql);
    slot = std::move(ql);
    q.fp8_weights.erase(it);
    ++kept;
  };
  if (!m.config.mla())
    for (size_t l = 0; l < m.model->layers.size(); ++l) {
      auto& layer = m.model->layers[l];
      nn::Attention& a = *layer->self_attn;
      const std::string p = fmt::format("model.layers.{}.", l);
      swap(a, p + "self_attn.", "q_proj", a.q_proj);
      swap(a, p + "self_attn.", "k_proj", a.k_proj);
      swap(a, p + "self_attn.", "v_proj", a.v_proj);
      swap(a, p + "self_attn.", "o_proj", a.o_proj);
      if (layer->mlp) {
        nn::GatedMLP& f = *layer->mlp;
        swap(f, p + "mlp.", "gate_proj", f.gate_proj);
        swap(f, p + "mlp.", "up_proj", f.up_proj);
        swap(f, p + "mlp.", "down_proj", f.down_proj);
      }
    }
  if (m.lm_head) swap(m, "", "lm_head", m.lm_head);
  const int64_t floated = q.dequantized + static_cast<int64_t>(q.fp8_weights.size());
  log().info("load_causal_lm ({}): {} checkpoint: {} linear weights kept as fp8 (bytes and scales), {} "
             "dequantized to float at load", dir, q.method, kept, floated);
  if (floated > 0 && (q.method == "gptq" || q.method == "awq"))
    log().info("load_causal_lm ({}): {} int4 weights with per-group zero points run as float weights (the "
               "dequantized values, exactly; no int4 kernel with zero points)", dir, q.method);
}

}  // namespace

// A tensor name of Gemma3ForConditionalGeneration as the text model's: the language model under
// `language_model.model.` (Transformers before 4.52) or `model.language_model.` (since), the
// head at `language_model.lm_head.` or `lm_head.`; "" for the vision tower and projector.
std::string gemma3_text_name(const std::string& n) {
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (n.starts_with(p)) return "model." + n.substr(std::string(p).size());
  if (n.starts_with("language_model.lm_head.")) return n.substr(std::string("language_model.").size());
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
    if (n.starts_with(p)) return {};
  return n;
}

std::vector<ExpertSlice> expert_slices(const CausalLM& m) {
  std::vector<ExpertSlice> v;
  const bool mixtral = m.config.model_type == "mixtral";
  for (size_t l = 0; l < m.model->layers.size(); ++l) {
    const auto& moe = m.model->layers[l]->moe;
    if (!moe) continue;
    const std::string p = fmt::format("model.layers.{}.{}.experts.", l, mixtral ? "block_sparse_moe" : "mlp");
    const int64_t f = moe->cfg.intermediate, h = moe->cfg.hidden;
    for (int64_t e = 0; e < moe->cfg.num_experts; ++e) {
      const std::string q = p + std::to_string(e) + ".";
      v.push_back({q + (mixtral ? "w1" : "gate_proj") + ".weight", p + "gate_up_proj", e, 0, f});
      v.push_back({q + (mixtral ? "w3" : "up_proj") + ".weight", p + "gate_up_proj", e, f, f});
      v.push_back({q + (mixtral ? "w2" : "down_proj") + ".weight", p + "down_proj", e, 0, h});
    }
  }
  return v;
}

void quantize_causal_lm(CausalLM& m, nn::WeightQuant kind, int64_t group, bool lm_head) {
  if (kind == nn::WeightQuant::none) return;
  TPU_CHECK(m.device().is_cpu(), "quantize_causal_lm: the model must be on the cpu (it is on {})", m.device().str());
  TPU_CHECK(!m.config.mla(), "quantize_causal_lm: weight quantization of multi-head latent attention (MLA, "
            "model_type '{}') is not supported", m.config.model_type);
  for (auto& layer : m.model->layers) {
    nn::Attention& a = *layer->self_attn;
    nn::quantize_linear(a, "q_proj", a.q_proj, kind, group);
    nn::quantize_linear(a, "k_proj", a.k_proj, kind, group);
    nn::quantize_linear(a, "v_proj", a.v_proj, kind, group);
    nn::quantize_linear(a, "o_proj", a.o_proj, kind, group);
    if (layer->mlp) {
      nn::GatedMLP& f = *layer->mlp;
      nn::quantize_linear(f, "gate_proj", f.gate_proj, kind, group);
      nn::quantize_linear(f, "up_proj", f.up_proj, kind, group);
      nn::quantize_linear(f, "down_proj", f.down_proj, kind, group);
    }
  }
  if (lm_head && m.lm_head) nn::quantize_linear(m, "lm_head", m.lm_head, kind, group);
  pack_quantized_projections(m);
}

void pack_quantized_projections(CausalLM& m) {
  if (m.config.mla()) return;
  for (auto& layer : m.model->layers) {
    nn::Attention& a = *layer->self_attn;
    if (!a.qkv_pack)
      if (auto p = nn::pack_projections({a.q_proj.get(), a.k_proj.get(), a.v_proj.get()}); p.defined())
        a.qkv_pack = std::make_shared<nn::PackedProjections>(std::move(p));
    if (layer->mlp && !layer->mlp->gate_up_pack)
      if (auto p = nn::pack_projections({layer->mlp->gate_proj.get(), layer->mlp->up_proj.get()}); p.defined())
        layer->mlp->gate_up_pack = std::make_shared<nn::PackedProjections>(std::move(p));
  }
}

std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, Device device, std::optional<DType> dtype) {
  LoadOptions o;
  o.device = device;
  o.dtype = dtype;
  return load_causal_lm(dir, o);
}

std::shared_ptr<CausalLM> load_causal_lm(const std::string& dir, const LoadOptions& options) {
  const Device device = options.device;
  const std::optional<DType> dtype = options.dtype;
  TPU_CHECK(!options.quantize_lm_head || options.quantize != nn::WeightQuant::none,
            "load_causal_lm: quantize_lm_head needs a quantization format (quantize = int8 or int4)");
  const fs::path root(dir);
  const fs::path cfg_path = root / "config.json";
  const std::string cfg_text = read_text(cfg_path, "load_causal_lm");
  // A quantized checkpoint: its quantization_config describes the tensors read below (the model
  // itself is built in float, so from_json, which refuses the field, reads the rest).
  std::optional<QuantizedCheckpoint> quant;
  std::string model_cfg_text = cfg_text;
  json cfg_json;
  try {
    cfg_json = json::parse(cfg_text);
  } catch (const json::exception&) {
    cfg_json = json();  // from_json names the error
  }
  if (cfg_json.is_object() && cfg_json.contains("quantization_config") && !cfg_json["quantization_config"].is_null()) {
    quant.emplace(cfg_json["quantization_config"].dump(), cfg_path.string());
    cfg_json.erase("quantization_config");
    model_cfg_text = cfg_json.dump();
  }
  ModelConfig cfg = ModelConfig::from_json(model_cfg_text, cfg_path.string());
  // Gemma3ForConditionalGeneration (model_type gemma3, read as its text model by from_json): the
  // language model's tensors under its prefix, the vision tower's skipped.
  const bool gemma3_multimodal = cfg_json.value("model_type", "") == "gemma3";
  std::shared_ptr<CausalLM> m;
  {
    // Uninitialised parameters in the target dtype: every one is overwritten below.
    nn::SkipInitGuard skip(dtype.value_or(DType::f32));
    m = std::make_shared<CausalLM>(cfg);
  }
  m->to(dtype.value_or(DType::f32));  // the norms (created as ones in f32); the rest already is
  std::map<std::string, Tensor*> slots;
  for (auto& [name, slot] : m->parameter_slots()) slots[name] = slot;
  for (auto& [name, slot] : m->buffer_slots()) slots[name] = slot;
  std::set<std::string> loaded, unexpected;
  // Per-expert tensors of sparse layers fill rows of the stacked expert parameters.
  const std::vector<ExpertSlice> slices = expert_slices(*m);
  std::map<std::string, const ExpertSlice*> slice_of;
  std::map<std::string, size_t> slices_left;  // per stacked parameter
  for (const ExpertSlice& s : slices) {
    slice_of[s.name] = &s;
    ++slices_left[s.param];
  }
  const std::map<std::string, size_t> slices_total = slices_left;
  std::set<std::string> loaded_slices;
  int64_t vision_skipped = 0;
  // Puts one checkpoint tensor (read from `path`) into its parameter or expert slice.
  const auto place = [&](const std::string& name, const Tensor& t, const fs::path& path) {
      // Buffers some checkpoints carry that this model recomputes; the tied head is the embedding.
      if (name.ends_with("rotary_emb.inv_freq") || (cfg.tie_word_embeddings && name == "lm_head.weight")) return;
      auto it = slots.find(name);
      if (auto sl = slice_of.find(name); it == slots.end() && sl != slice_of.end()) {
        const ExpertSlice& s = *sl->second;
        Tensor dst = narrow(select(*slots.at(s.param), 0, s.expert), 0, s.row, s.rows);
        TPU_CHECK(t.shape() == dst.shape(), "load_causal_lm: '{}' has shape {} in {} but expert {} of '{}' takes {}",
                  name, t.shape().str(), path.string(), s.expert, s.param, dst.shape().str());
        TPU_CHECK(loaded_slices.insert(name).second, "load_causal_lm: '{}' is in more than one file ({})", name,
                  path.string());
        TPU_CHECK(!loaded.count(s.param), "load_causal_lm: '{}' is given both stacked and per expert ('{}')", s.param,
                  name);
        NoGradGuard ng;
        dst.copy_(t);
        if (--slices_left[s.param] == 0) loaded.insert(s.param);
        return;
      }
      if (it == slots.end()) {
        unexpected.insert(name);
        return;
      }
      if (auto st = slices_total.find(name); st != slices_total.end())
        TPU_CHECK(slices_left[name] == st->second, "load_causal_lm: '{}' is given both stacked and per expert", name);
      TPU_CHECK(t.shape() == it->second->shape(),
                "load_causal_lm: '{}' has shape {} in {} but {} in the model", name, t.shape().str(), path.string(),
                it->second->shape().str());
      TPU_CHECK(loaded.insert(name).second, "load_causal_lm: '{}' is in more than one file ({})", name, path.string());
      NoGradGuard ng;
      it->second->copy_(t);  // converted to the parameter's dtype in place
  };
  for (const auto& [file, listed] : weight_files(root)) {
    const fs::path path = root / file;
    const auto& names = listed;  // a plain reference: clang-14 lambdas cannot capture a structured binding
    std::set<std::string> seen;
    for_each_safetensor(path.string(), [&](const std::string& stored, const Tensor& t) {
      if (!names.empty() && !names.count(stored)) return;  // in the shard but listed elsewhere
      seen.insert(stored);
      const std::string name = gemma3_multimodal ? gemma3_text_name(stored) : stored;
      if (name.empty()) {  // the vision tower or projector of a multimodal Gemma 3
        ++vision_skipped;
        return;
      }
      if (quant && quant->take(name, t)) return;  // a part of a quantized weight: placed below
      place(name, t, path);
    });
    for (const auto& n : names)
      TPU_CHECK(seen.count(n), "load_causal_lm: the index lists '{}' in {}, which does not hold it", n, file);
  }
  if (quant) quant->finish([&](const std::string& name, const Tensor& w) { place(name, w, root / "(dequantized)"); });
  std::vector<std::string> missing;
  for (const auto& [name, slot] : slots) {
    if (loaded.count(name)) continue;
    if (!slices_total.count(name)) {
      missing.push_back(name);
      continue;
    }
    for (const ExpertSlice& s : slices)  // a stacked expert parameter: the per-expert tensors it lacks
      if (s.param == name && !loaded_slices.count(s.name)) missing.push_back(s.name);
  }
  if (!missing.empty() || !unexpected.empty())
    fail("load_causal_lm ({}): missing keys [{}], unexpected keys [{}]", dir, fmt::join(missing, ", "),
         fmt::join(unexpected, ", "));
  if (gemma3_multimodal)
    log().warn("load_causal_lm ({}): a multimodal Gemma 3 checkpoint runs as its text-only language model; {} "
                 "vision tensors (vision tower, projector) are not loaded and image inputs are not supported",
                 dir, vision_skipped);
  if (quant) use_checkpoint_quantization(*m, *quant, dir);
  quantize_causal_lm(*m, options.quantize, options.group, options.quantize_lm_head);
  pack_quantized_projections(*m);  // the checkpoint's fp8 projections (quantize_causal_lm packs its own)
  m->int8_kv_cache = options.int8_kv_cache;
  m->kv_cache_dtype = options.kv_cache_dtype;
  m->to(device);
  m->eval();
  return m;
}

void save_causal_lm(CausalLM& m, const std::string& dir) {
  for (const auto& [name, mod] : m.named_modules())
    TPU_CHECK(!dynamic_cast<const nn::QuantizedLinear*>(mod.get()),
              "save_causal_lm: '{}' is quantized; a quantized model cannot be saved as a float checkpoint", name);
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  TPU_CHECK(!ec, "save_causal_lm: cannot create {}: {}", dir, ec.message());
  ModelConfig c = m.config;
  const DType t = m.dtype();
  c.torch_dtype = t == DType::bf16 ? "bfloat16" : t == DType::f16 ? "float16" : "float32";
  {
    std::ofstream f(root / "config.json", std::ios::binary);
    f << c.to_json() << "\n";
    TPU_CHECK(f.good(), "save_causal_lm: cannot write {}", (root / "config.json").string());
  }
  std::map<std::string, std::vector<ExpertSlice>> per_expert;  // stacked parameters, written per expert
  for (ExpertSlice& s : expert_slices(m)) per_expert[s.param].push_back(std::move(s));
  TensorList list;
  for (auto& [name, tensor] : m.named_parameters()) {
    auto it = per_expert.find(name);
    if (it == per_expert.end()) {
      list.emplace_back(name, tensor.detach());
      continue;
    }
    NoGradGuard ng;
    for (const ExpertSlice& s : it->second)
      list.emplace_back(s.name, contiguous(narrow(select(tensor.detach(), 0, s.expert), 0, s.row, s.rows)));
  }
  save_safetensors((root / "model.safetensors").string(), list, {{"format", "pt"}});
}

}  // namespace tpu::models
