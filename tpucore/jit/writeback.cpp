// Write-back of functionalized in-place writes: a compiled function that wrote a graph input in
// place (an argument, a captured weight, an optimizer buffer) computes the new value as a graph
// output; after the run it is copied into the real tensor, so callers see eager semantics. When
// nothing else refers to either buffer, the input takes over the output's buffer (no copy).
#include "ops/meta_util.h"
#include "tpucore/autograd.h"
#include "tpucore/autograd/node.h"
#include "tpucore/jit/internal.h"
#include "tpucore/ops.h"

namespace tpu::jit::detail {
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
    const Tensor& src = outs[static_cast<size_t>(w.output)];
    const TensorImpl &d = dst.impl(), &s = src.impl();
    if (d.storage && s.storage && d.storage.use_count() == 1 && s.storage.use_count() == 1 && d.contiguous &&
        s.contiguous && d.offset == 0 && s.offset == 0 && d.dtype == s.dtype && d.shape == s.shape &&
        d.device == s.device && d.storage->nbytes == s.storage->nbytes) {
      // Nothing else sees either buffer (no view, no saved tensor): the input takes the
      // output's buffer instead of a copy (buffer donation).
      dst.impl().storage = s.storage;
      dst.impl().bump_version();
      continue;
    }
    tpu::copy_(dst, src);
  }
  outs.resize(user_outputs);
  for (const graph::Tracer::OutputAlias& a : aliases) {
    Tensor t = ins[static_cast<size_t>(a.input)];
    for (const graph::ViewStep& s : a.chain) t = graph::apply_view_step(t, s);
    outs[static_cast<size_t>(a.output)] = t;
  }
}

}  // namespace tpu::jit::detail

namespace tpu::jit::detail {

void unalias_outputs(std::span<const Tensor> ins, std::vector<Tensor>& outs, const std::vector<char>& fresh,
                     const graph::Graph* g) {
  auto shared = [&](const Tensor& out) {
    for (const Tensor& in : ins)
      if (in.storage() == out.storage()) return true;
    if (g)
      for (const graph::Value& v : g->values)
        if (v.kind == graph::ValueKind::constant && v.constant.storage() == out.storage()) return true;
    return false;
  };
  for (size_t i = 0; i < fresh.size() && i < outs.size(); ++i) {
    if (!fresh[i] || !outs[i].storage()) continue;
    if (shared(outs[i])) {
      NoGradGuard ng;
      outs[i] = tpu::clone(outs[i]);
    }
  }
}

std::string check_guards(const std::vector<GradGuard>& guards) {
  for (const GradGuard& g : guards) {
    std::shared_ptr<TensorImpl> o = g.owner.lock();
    if (!o || o->autograd.get() != g.meta) return fmt::format("captured tensor {} was destroyed or lost its autograd state", g.what);
    const Tensor& now = o->autograd->grad;
    if (now.impl_ptr() == g.initial.impl_ptr()) continue;
    if (!g.initial.defined()) return fmt::format("captured tensor {}: .grad undefined -> defined", g.what);
    if (!now.defined()) return fmt::format("captured tensor {}: .grad defined -> undefined", g.what);
    return fmt::format("captured tensor {}: .grad replaced by another tensor", g.what);
  }
  return "";
}

void apply_grads(std::span<const Tensor> ins, const std::vector<Tensor>& outs, const std::vector<GradAction>& grads) {
  for (size_t k = 0; k < grads.size(); ++k) {
    const GradAction& a = grads[k];
    switch (a.kind) {
      case GradAction::Kind::arg_output: {
        // As eager backward does: accumulated into the argument's .grad (a fresh tensor).
        NoGradGuard ng;
        Tensor arg = ins[static_cast<size_t>(a.input)];
        const Tensor& g = outs[static_cast<size_t>(a.output)];
        const Tensor old = arg.grad();
        arg.set_grad(old.defined() ? tpu::add(old, g) : tpu::clone(g));
        break;
      }
      case GradAction::Kind::clear: a.meta->grad = Tensor(); break;
      case GradAction::Kind::tensor: a.meta->grad = a.tensor; break;
      case GradAction::Kind::output: {
        Tensor g = outs[static_cast<size_t>(a.output)];
        bool shared = !g.storage();
        for (const Tensor& t : ins) shared = shared || t.storage() == g.storage();
        for (size_t j = 0; j < outs.size() && !shared; ++j)
          shared = static_cast<int>(j) != a.output && outs[j].storage() == g.storage();
        if (shared) {
          NoGradGuard ng;
          g = tpu::clone(g);
        }
        a.meta->grad = std::move(g);
        break;
      }
    }
  }
}

}  // namespace tpu::jit::detail
