// nn::Module: a tree of named parameters, buffers and submodules (as torch.nn.Module).
//
//   struct Block : tpu::nn::Module {
//     std::shared_ptr<tpu::nn::Linear> fc = register_module("fc", std::make_shared<tpu::nn::Linear>(8, 8));
//     tpu::Tensor scale = tpu::ones({8});
//     Block() { register_parameter("scale", scale); }
//     tpu::Tensor forward(const tpu::Tensor& x) override { return fc->forward(x) * scale; }
//   };
//
// A module registers its parameter members by reference, so to(), load_state_dict() and
// optimizers see the same tensors; modules are therefore neither copyable nor movable and live
// in shared_ptrs. Names are dotted paths ("layers.0.weight").
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::nn {

using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-tensor forward of layers; modules with other signatures define their own.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string type_name() const { return "Module"; }

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;

  // Parameters and buffers by dotted name (detached; the live tensors stay in the module).
  StateDict state_dict() const;
  // Copies values into the module's tensors (converted to their dtype and device). Missing or
  // unexpected keys (when strict) and shape mismatches are a tpu::Error naming them.
  void load_state_dict(const StateDict& sd, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves (or converts) every parameter and buffer; parameters stay leaves that require grad.
  // Create optimizers after moving (they hold the parameter tensors).
  void to(Device d);
  void to(DType t);
  void zero_grad();

  // The registered member tensors themselves (not copies), by dotted name: for wrappers that
  // replace parameters while a forward runs (nn::parallel::fully_shard, tensor parallelism).
  std::vector<std::pair<std::string, Tensor*>> parameter_slots(bool recurse = true);

 protected:
  // Registers a member tensor by reference (it must outlive the module's use of it: a member).
  void register_parameter(const std::string& name, Tensor& param, bool requires_grad = true);
  void register_buffer(const std::string& name, Tensor& buffer);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_name(const std::string& name) const;
  template <class F>
  void visit(const std::string& prefix, bool recurse, bool buffers, F&& f) const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tpu::nn
