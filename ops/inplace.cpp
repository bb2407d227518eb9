// In-place elementwise forms: add_, sub_, mul_, div_, relu_ and the Tensor methods add_,
// sub_, mul_, div_. The result is computed in the promoted dtype (the op's own meta rule)
// and written back in self's dtype; PyTorch's casting rule applies (a float result cannot
// go into an integer tensor, a non-bool result cannot go into a bool tensor), and self must
// already have the broadcast shape.
//
// Fast path: a contiguous cpu self whose dtype is the compute dtype, with the other operand
// not partially overlapping it, runs the op's kernel straight into self (one pass, no
// temporary). Otherwise the op runs out of place and copy_ writes the result back.
// Autograd sees every in-place op first through the in-place hook (ops/registry.h): it refuses
// writes to leaves that require grad and records differentiable in-place ops itself.
#include "ops/binary_common.h"

namespace tpu {
namespace {
using namespace ops;
using namespace ops::elementwise;

const OpDef& op_named(const char* name) {
  const OpDef* d = find_op(name);
  if (!d) fail("internal: op '{}' is not registered", name);
  return *d;
}
const OpDef& add_def() { static const OpDef& d = op_named("add"); return d; }
const OpDef& sub_def() { static const OpDef& d = op_named("sub"); return d; }
const OpDef& mul_def() { static const OpDef& d = op_named("mul"); return d; }
const OpDef& div_def() { static const OpDef& d = op_named("div"); return d; }
const OpDef& relu_def() { static const OpDef& d = op_named("relu"); return d; }

std::string inplace_name(const OpDef& op) { return op.name + "_"; }

// True when writing self elementwise while reading `other` is safe: no shared storage, or
// exactly the same view (each element is read before it is written, at the same index).
bool safe_alias(const Tensor& self, const Tensor& other) {
  if (!other.storage() || other.storage() != self.storage()) return true;
  return other.offset() == self.offset() && other.shape() == self.shape() && other.strides() == self.strides();
}

Tensor& run_inplace(Tensor& self, std::span<const Tensor> inputs, const OpDef& op, const Attrs& attrs) {
  const std::string name = inplace_name(op);
  for (size_t i = 0; i < inputs.size(); ++i) TPU_CHECK(inputs[i].defined(), "{}: input {} is an undefined tensor", name, i);
  if (InplaceHook h = inplace_hook(); h && h(name.c_str(), &op, self, inputs, attrs)) return self;
  for (int d = 0; d < self.dim(); ++d)
    TPU_CHECK(self.shape()[d] <= 1 || self.strides()[d] != 0,
              "{}: self ({}, strides {}) is an expanded view in which several elements share one memory location; "
              "call contiguous() first",
              name, describe(self), self.strides().str());
  MetaResult m;
  op.meta(MetaArgs{op, inputs, attrs}, m);
  const TensorMeta& out = m.out();
  if (out.shape != self.shape()) {
    TPU_CHECK(inputs.size() > 1, "internal: {}: output shape {} differs from self {}", name, out.shape.str(), self.shape().str());
    fail("{}: the result has the broadcast shape {} of self {} and other {}, which does not match self's shape {}", name,
         out.shape.str(), self.shape().str(), inputs[1].shape().str(), self.shape().str());
  }
  TPU_CHECK(dtype_category(out.dtype) <= dtype_category(self.dtype()),
            "{}: the result type {} cannot be cast to the dtype {} of self (in-place ops keep self's dtype)", name,
            dtype_name(out.dtype), dtype_name(self.dtype()));

  bool direct = self.device().is_cpu() && self.is_contiguous() && !self.is_proxy() && interceptor() == nullptr &&
                self.dtype() == out.dtype && (m.cast_mask == 0 || m.cast_to == out.dtype);
  for (size_t i = 1; i < inputs.size() && direct; ++i) {
    const Tensor& o = inputs[i];
    if (o.is_proxy() || !safe_alias(self, o)) direct = false;
    if (o.device() != self.device()) {
      TPU_CHECK(o.impl().wrapped_number, "{}: expected all tensors on the same device, got {} and {}", name,
                self.device().str(), o.device().str());
      direct = direct && o.device().is_cpu();
    }
  }
  if (!direct) {
    Tensor result[kMaxOutputs];
    ops::call(op, inputs, attrs, result);
    copy_(self, result[0]);  // converts to self's dtype and bumps the version
    return self;
  }
  std::array<Tensor, 3> ins;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins[i] = (i > 0 && ((m.cast_mask >> i) & 1u) && inputs[i].dtype() != m.cast_to) ? to(inputs[i], m.cast_to) : inputs[i];
  ins[0] = self;
  Tensor outs[1] = {self};
  op.cpu(KernelArgs{op, std::span<const Tensor>(ins.data(), inputs.size()), outs, attrs});
  self.impl().bump_version();
  return self;
}

Tensor& inplace_binary(Tensor& self, const Tensor& other, const OpDef& op, const Attrs& attrs) {
  TPU_CHECK(self.defined(), "{}: self is an undefined tensor", inplace_name(op));
  Tensor ins[2] = {self, other};
  return run_inplace(self, ins, op, attrs);
}

Attrs alpha_attrs(Scalar alpha) {
  if (!alpha.is_floating() && !alpha.is_bool() && alpha.to_int() == 1) return {};
  return Attrs{{"alpha", alpha}};
}

Tensor scalar_for(const Tensor& self, Scalar s) {
  TPU_CHECK(self.defined(), "in-place op: self is an undefined tensor");
  return wrapped_scalar_as(s, scalar_result_type(self, s));
}

}  // namespace

Tensor& add_(Tensor& self, const Tensor& b, Scalar alpha) { return inplace_binary(self, b, add_def(), alpha_attrs(alpha)); }
Tensor& sub_(Tensor& self, const Tensor& b, Scalar alpha) { return inplace_binary(self, b, sub_def(), alpha_attrs(alpha)); }
Tensor& mul_(Tensor& self, const Tensor& b) { return inplace_binary(self, b, mul_def(), {}); }
Tensor& div_(Tensor& self, const Tensor& b) { return inplace_binary(self, b, div_def(), {}); }
Tensor& relu_(Tensor& x) {
  TPU_CHECK(x.defined(), "relu_: self is an undefined tensor");
  Tensor ins[1] = {x};
  return run_inplace(x, ins, relu_def(), {});
}

Tensor& Tensor::add_(const Tensor& o) { return tpu::add_(*this, o); }
Tensor& Tensor::add_(Scalar s) { return tpu::add_(*this, scalar_for(*this, s)); }
Tensor& Tensor::sub_(const Tensor& o) { return tpu::sub_(*this, o); }
Tensor& Tensor::mul_(const Tensor& o) { return tpu::mul_(*this, o); }
Tensor& Tensor::mul_(Scalar s) { return tpu::mul_(*this, scalar_for(*this, s)); }
Tensor& Tensor::div_(const Tensor& o) { return tpu::div_(*this, o); }

}  // namespace tpu
