// Write-back of functionalized in-place writes: a compiled function that wrote a graph input in
// place (an argument, a captured weight, an optimizer buffer) computes the new value as a graph
// output; after the run it is copied into the real tensor, so callers see eager semantics.
#include "ops/meta_util.h"
#include "tpucore/autograd.h"
#include "tpucore/jit_internal.h"
#include "tpucore/ops.h"

namespace tpu::jit::detail {
namespace {

Tensor apply_view(const Tensor& x, const graph::ViewStep& s) {
  if (s.op->name == "view") return tpu::reshape(x, s.out.shape);
  Tensor out[ops::kMaxOutputs];
  Tensor in[1] = {x};
  ops::call(*s.op, in, s.attrs, out);
  return out[0];
}

}  // namespace

void apply_writes(std::span<const Tensor> ins, std::vector<Tensor>& outs, const std::vector<WriteBack>& writes,
                  size_t user_outputs, const std::vector<graph::Tracer::OutputAlias>& aliases) {
  if (writes.empty()) return;
  NoGradGuard ng;  // the write-back is the function's own in-place write, already differentiated
  for (const WriteBack& w : writes) {
    const Tensor& dst = ins[static_cast<size_t>(w.input)];
    for (size_t j = 0; j < ins.size(); ++j)
      if (static_cast<int>(j) != w.input && dst.storage() && ins[j].storage() == dst.storage())
        fail("compile: input {} ({}) is written in place by the compiled function but shares its memory with input {} "
             "({}) in this call; in-place writes through aliasing inputs are not supported",
             w.input, ops::describe(dst), j, ops::describe(ins[j]));
  }
  for (const WriteBack& w : writes) {
    Tensor& src = outs[static_cast<size_t>(w.output)];
    for (const WriteBack& o : writes)
      if (src.storage() && src.storage() == ins[static_cast<size_t>(o.input)].storage()) {
        src = tpu::clone(src);
        break;
      }
  }
  for (const WriteBack& w : writes) {
    Tensor dst = ins[static_cast<size_t>(w.input)];
    tpu::copy_(dst, outs[static_cast<size_t>(w.output)]);
  }
  outs.resize(user_outputs);
  for (const graph::Tracer::OutputAlias& a : aliases) {
    Tensor t = ins[static_cast<size_t>(a.input)];
    for (const graph::ViewStep& s : a.chain) t = apply_view(t, s);
    outs[static_cast<size_t>(a.output)] = t;
  }
}

}  // namespace tpu::jit::detail
