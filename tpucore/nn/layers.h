/// @file
/// Layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations, Sequential, MLP.
/// Initialization follows PyTorch's defaults (Linear: U(-1/sqrt(in), 1/sqrt(in)); Embedding:
/// N(0, 1); norms: weight 1, bias 0), drawn from the given generator (the global one if null).
#pragma once

#include <functional>
#include <optional>

#include "tpucore/nn/module.h"
#include "tpucore/ops.h"

namespace tpu::nn {

/// y = x W^T + b over the last dim of x (as torch.nn.Linear).
class Linear : public Module {
 public:
  /// Weight [out_features, in_features] and (with `bias`) bias [out_features], f32 on cpu; sizes
  /// must be positive (else a tpu::Error).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  /// x [..., in_features] -> [..., out_features].
  Tensor forward(const Tensor& x) override;
  /// "Linear".
  std::string type_name() const override { return "Linear"; }
  Tensor weight;  ///< [out, in]
  Tensor bias;    ///< [out] (undefined without bias)

 protected:
  /// For subclasses that hold the weight in another form (nn::QuantizedLinear): nothing registered.
  Linear() = default;
};

/// A lookup table of `num_embeddings` vectors of size `dim` (as torch.nn.Embedding).
class Embedding : public Module {
 public:
  /// Weight [num_embeddings, dim], f32 on cpu.
  Embedding(int64_t num_embeddings, int64_t dim, Generator* gen = nullptr);
  /// Integer indices [...] -> [..., dim]; an index out of range is a tpu::Error.
  Tensor forward(const Tensor& indices) override;
  /// "Embedding".
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;  ///< [num, dim]
};

/// Layer normalization over the trailing `normalized_shape` dims (as torch.nn.LayerNorm).
class LayerNorm : public Module {
 public:
  /// With `affine`, a weight (ones) and a bias (zeros) of `normalized_shape`.
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true);
  /// layer_norm(x, normalized_shape, weight, bias, eps).
  Tensor forward(const Tensor& x) override;
  /// "LayerNorm".
  std::string type_name() const override { return "LayerNorm"; }
  /// The trailing dims normalized over.
  Shape normalized_shape;
  /// Added to the variance.
  double eps;
  /// Scale and shift of `normalized_shape` (undefined without affine).
  ///@{
  Tensor weight, bias;
  ///@}
};

/// Root-mean-square normalization over the trailing `normalized_shape` dims (as torch.nn.RMSNorm).
class RMSNorm : public Module {
 public:
  /// With `affine`, a weight (ones) of `normalized_shape`; eps unset means f32's machine epsilon.
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool affine = true);
  /// rms_norm(x, normalized_shape, weight, eps).
  Tensor forward(const Tensor& x) override;
  /// "RMSNorm".
  std::string type_name() const override { return "RMSNorm"; }
  /// The trailing dims normalized over.
  Shape normalized_shape;
  /// Added to the mean square (unset: f32's machine epsilon, as PyTorch for f32).
  std::optional<double> eps;
  /// Scale of `normalized_shape` (undefined without affine).
  Tensor weight;
};

/// Zeroes elements with probability p while training and scales the rest by 1/(1-p).
class Dropout : public Module {
 public:
  /// Dropout with probability `p` in [0, 1] (else a tpu::Error), drawing from `gen`.
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  /// x with dropout applied in training mode; x unchanged in eval mode.
  Tensor forward(const Tensor& x) override;
  /// "Dropout".
  std::string type_name() const override { return "Dropout"; }
  /// Probability of zeroing an element.
  double p;

 private:
  Generator* gen_;
};

/// A module around a tensor function (activations).
class Lambda : public Module {
 public:
  /// A module named `name` (its type_name) computing fn(x).
  Lambda(std::string name, std::function<Tensor(const Tensor&)> fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  /// fn(x).
  Tensor forward(const Tensor& x) override { return fn_(x); }
  /// The name given.
  std::string type_name() const override { return name_; }

 private:
  std::string name_;
  std::function<Tensor(const Tensor&)> fn_;
};
/// Activation modules: relu, gelu (exact or tanh approximation), silu, tanh, sigmoid.
///@{
std::shared_ptr<Module> ReLU();
std::shared_ptr<Module> GELU(bool tanh_approx = false);
std::shared_ptr<Module> SiLU();
std::shared_ptr<Module> Tanh();
std::shared_ptr<Module> Sigmoid();
///@}
/// Activation module by name: relu, gelu, gelu_tanh, silu, tanh, sigmoid.
std::shared_ptr<Module> activation(const std::string& name);

/// Children "0", "1", ... applied in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  /// Children "0", "1", ... from `layers`.
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  /// Appends a child (named by its position).
  void push_back(std::shared_ptr<Module> m);
  /// The children applied in order.
  Tensor forward(const Tensor& x) override;
  /// "Sequential".
  std::string type_name() const override { return "Sequential"; }
  /// Number of children.
  size_t size() const { return layers_.size(); }
  /// Child `i`; out of range is a std::out_of_range.
  Module& operator[](size_t i) const { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

/// Linear layers of sizes dims[0] -> dims[1] -> ... with the activation (and optional dropout)
/// between them, none after the last.
class MLP : public Sequential {
 public:
  /// At least two `dims`; `activation` as activation(); `dropout` after each activation when > 0.
  MLP(const std::vector<int64_t>& dims, const std::string& activation = "relu", double dropout = 0.0,
      Generator* gen = nullptr);
  /// "MLP".
  std::string type_name() const override { return "MLP"; }
};

}  // namespace tpu::nn
