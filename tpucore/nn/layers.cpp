#include "tpucore/nn/layers.h"

#include <cmath>

#include "tpucore/autograd.h"
#include "tpucore/nn/param_init.h"

namespace tpu::nn {
namespace detail {
Tensor uniform_init(const Shape& s, double bound, Generator* gen) {
  if (auto dt = SkipInitGuard::active()) return empty(s, TensorOptions(*dt));
  NoGradGuard ng;
  return sub(mul(rand(s, {}, gen), 2 * bound), bound);
}
}  // namespace detail
using detail::uniform_init;

Linear::Linear(int64_t in, int64_t out, bool has_bias, Generator* gen) {
  TPU_CHECK(in > 0 && out > 0, "Linear: in_features ({}) and out_features ({}) must be positive", in, out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = uniform_init({out, in}, bound, gen);
  register_parameter("weight", weight);
  if (has_bias) {
    bias = uniform_init({out}, bound, gen);
    register_parameter("bias", bias);
  }
}
Tensor Linear::forward(const Tensor& x) {
  TPU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(1),
            "Linear: expected an input with {} features in the last dim, got shape {}", weight.size(1),
            x.defined() ? x.shape().str() : std::string("undefined"));
  return linear(x, weight, bias);
}

Embedding::Embedding(int64_t num, int64_t dim, Generator* gen) {
  TPU_CHECK(num > 0 && dim > 0, "Embedding: num_embeddings ({}) and dim ({}) must be positive", num, dim);
  auto skip = SkipInitGuard::active();
  weight = skip ? empty({num, dim}, TensorOptions(*skip)) : randn({num, dim}, {}, gen);
  register_parameter("weight", weight);
}
Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

LayerNorm::LayerNorm(Shape ns, double e, bool affine) : normalized_shape(ns), eps(e) {
  if (affine) {
    weight = ones(ns);
    bias = zeros(ns);
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
}
Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

RMSNorm::RMSNorm(Shape ns, std::optional<double> e, bool affine) : normalized_shape(ns), eps(e) {
  if (affine) {
    weight = ones(ns);
    register_parameter("weight", weight);
  }
}
Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, normalized_shape, weight, eps); }

Dropout::Dropout(double prob, Generator* gen) : p(prob), gen_(gen) {
  TPU_CHECK(p >= 0 && p <= 1, "Dropout: probability must be in [0, 1], got {}", p);
}
Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  if (p == 1) return mul(x, 0.0);
  Tensor keep;
  {
    NoGradGuard ng;
    keep = ge(rand(x.shape(), TensorOptions(DType::f32, x.device()), gen_), p);
  }
  return where(keep, mul(x, 1.0 / (1.0 - p)), 0.0);
}

std::shared_ptr<Module> ReLU() { return std::make_shared<Lambda>("ReLU", [](const Tensor& x) { return relu(x); }); }
std::shared_ptr<Module> GELU(bool t) {
  return std::make_shared<Lambda>(t ? "GELU(tanh)" : "GELU", [t](const Tensor& x) { return gelu(x, t); });
}
std::shared_ptr<Module> SiLU() { return std::make_shared<Lambda>("SiLU", [](const Tensor& x) { return silu(x); }); }
std::shared_ptr<Module> Tanh() { return std::make_shared<Lambda>("Tanh", [](const Tensor& x) { return tanh(x); }); }
std::shared_ptr<Module> Sigmoid() {
  return std::make_shared<Lambda>("Sigmoid", [](const Tensor& x) { return sigmoid(x); });
}
std::shared_ptr<Module> activation(const std::string& name) {
  if (name == "relu") return ReLU();
  if (name == "gelu") return GELU(false);
  if (name == "gelu_tanh") return GELU(true);
  if (name == "silu") return SiLU();
  if (name == "tanh") return Tanh();
  if (name == "sigmoid") return Sigmoid();
  fail("activation: unknown activation '{}' (expected relu, gelu, gelu_tanh, silu, tanh or sigmoid)", name);
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& m : layers) push_back(std::move(m));
}
void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : layers_) h = m->forward(h);
  return h;
}

MLP::MLP(const std::vector<int64_t>& dims, const std::string& act, double dropout, Generator* gen) {
  TPU_CHECK(dims.size() >= 2, "MLP: expected at least two sizes (input and output), got {}", dims.size());
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    push_back(std::make_shared<Linear>(dims[i], dims[i + 1], true, gen));
    if (i + 2 < dims.size()) {
      push_back(activation(act));
      if (dropout > 0) push_back(std::make_shared<Dropout>(dropout, gen));
    }
  }
}

}  // namespace tpu::nn
