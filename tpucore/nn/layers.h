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

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  Tensor weight;  ///< [out, in]
  Tensor bias;    ///< [out] (undefined without bias)
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;  ///< [num, dim]
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool affine = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RMSNorm"; }
  Shape normalized_shape;
  std::optional<double> eps;
  Tensor weight;
};

/// Zeroes elements with probability p while training and scales the rest by 1/(1-p).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  double p;

 private:
  Generator* gen_;
};

/// A module around a tensor function (activations).
class Lambda : public Module {
 public:
  Lambda(std::string name, std::function<Tensor(const Tensor&)> fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  Tensor forward(const Tensor& x) override { return fn_(x); }
  std::string type_name() const override { return name_; }

 private:
  std::string name_;
  std::function<Tensor(const Tensor&)> fn_;
};
std::shared_ptr<Module> ReLU();
std::shared_ptr<Module> GELU(bool tanh_approx = false);
std::shared_ptr<Module> SiLU();
std::shared_ptr<Module> Tanh();
std::shared_ptr<Module> Sigmoid();
/// Activation module by name: relu, gelu, gelu_tanh, silu, tanh, sigmoid.
std::shared_ptr<Module> activation(const std::string& name);

/// Children "0", "1", ... applied in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i) const { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

/// Linear layers of sizes dims[0] -> dims[1] -> ... with the activation (and optional dropout)
/// between them, none after the last.
class MLP : public Sequential {
 public:
  MLP(const std::vector<int64_t>& dims, const std::string& activation = "relu", double dropout = 0.0,
      Generator* gen = nullptr);
  std::string type_name() const override { return "MLP"; }
};

}  // namespace tpu::nn
