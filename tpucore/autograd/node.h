// Internal autograd data: the node recorded for one op call, the per-tensor autograd metadata,
// and saved tensors with the storage version they were saved at.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "tpucore/autograd.h"

namespace tpu {

struct Node;

// Where the gradient of one op input goes: a node's output slot, or a leaf's accumulator.
struct Edge {
  std::shared_ptr<Node> node;          // set for tensors with history
  int output_nr = 0;
  std::shared_ptr<AutogradMeta> leaf;  // set for leaves that require grad
  bool valid() const { return node || leaf; }
};

struct AutogradMeta {
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;
  bool retains_grad = false;
  bool is_view = false;       // output of a recorded view op (in-place writes to it are refused)
  std::string nondiff_op;     // set when a non-differentiable op made this tensor from ones requiring grad
  std::weak_ptr<TensorImpl> owner;  // the tensor this metadata was made for (traced .grad write-back)
  // Leaves: called with .grad() once per backward pass, after its last contribution (hooks.cpp).
  std::vector<std::pair<int, std::function<void(const Tensor&)>>> post_accumulate_hooks;
};

// A tensor kept for backward: a detached alias (no history, so no reference cycle through the
// node) plus the version of its storage at save time.
struct SavedTensor {
  Tensor data;
  uint64_t version = 0;
  bool is_output = false;
  int output_nr = 0;
  std::shared_ptr<AutogradMeta> input_meta;  // history of a saved input (for create_graph)
};

struct Node {
  const ops::OpDef* op = nullptr;
  ops::Attrs attrs;
  std::vector<ops::TensorMeta> input_meta;
  std::vector<Edge> next;                 // one per input
  std::vector<SavedTensor> saved_inputs;  // one per input (data undefined when not saved)
  std::vector<SavedTensor> saved_outputs;
  std::vector<ops::TensorMeta> output_meta;
  std::vector<std::weak_ptr<AutogradMeta>> retained;  // per output: non-leaf metas that keep .grad()
  uint32_t needs = 0;
  bool saved_any = false;
  bool freed = false;
  uint64_t seq = 0;  // creation order (later nodes run first among the ready ones)
  // Set on nodes of custom functions (tpucore/nn/parallel: collectives with their own backward):
  // called instead of op->backward.fn, dropped with the saved tensors after the node ran.
  std::function<void(const ops::BackwardArgs&, std::span<Tensor>)> custom;
  std::string name() const { return op ? op->name : "?"; }
};

namespace autograd::detail {
// The next node creation number (for nodes made outside the op registry's recording).
uint64_t next_node_seq();
// A view of t's storage without history.
Tensor alias(const Tensor& t);
// Sums a gradient over broadcast dims down to `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);
// Version of t's data: its storage's, or for a traced proxy its trace value's (both bumped by
// in-place writes).
uint64_t data_version(const Tensor& t);
}  // namespace autograd::detail

}  // namespace tpu
