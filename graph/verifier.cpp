// The verifier: structural invariants plus a re-run of every node's meta function on proxy
// inputs built from the recorded metas, so a pass that breaks shapes or dtypes is caught at
// the pass that did it.
#include <algorithm>

#include "graph/passes/passes.h"
#include "graph/tracer.h"

namespace tpu::graph {
namespace {

Tensor fake_proxy(const ValueMeta& m) {
  static const auto tv = std::make_shared<TraceValue>();
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = m.shape;
  impl->strides = contiguous_strides(m.shape);
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->wrapped_number = m.wrapped;
  impl->trace = tv;
  return Tensor(std::move(impl));
}

}  // namespace

void verify(const Graph& g, const std::string& when) {
  auto bad = [&](const std::string& what) { fail("graph verifier ({}): {}", when, what); };
  const auto nv = static_cast<ValueId>(g.values.size());
  std::vector<char> defined(g.values.size(), 0);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    ValueId v = g.inputs[i];
    if (v < 0 || v >= nv) bad(fmt::format("input {} has id %{} out of range", i, v));
    const Value& val = g.value(v);
    if (val.kind != ValueKind::input || val.producer != static_cast<int32_t>(i))
      bad(fmt::format("input {} (%{}) is not marked as input {}", i, v, i));
    defined[static_cast<size_t>(v)] = 1;
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (val.kind == ValueKind::constant) {
      if (!val.constant.defined() || val.constant.is_proxy() || val.constant.shape() != val.meta.shape ||
          val.constant.dtype() != val.meta.dtype)
        bad(fmt::format("constant %{} does not match its meta {}", v, meta_str(val.meta)));
      defined[v] = 1;
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.dead) continue;
    if (!n.op) bad(fmt::format("node {} has no op", i));
    const std::string where = fmt::format("node {} ({})", i, n.op->name);
    if (!n.op->has(ops::kVariadic) && static_cast<int>(n.inputs.size()) != n.op->num_inputs)
      bad(fmt::format("{} has {} inputs, the op takes {}", where, n.inputs.size(), n.op->num_inputs));
    std::vector<Tensor> fakes;
    for (ValueId in : n.inputs) {
      if (in < 0 || in >= nv) bad(fmt::format("{} reads %{}, out of range", where, in));
      if (!defined[static_cast<size_t>(in)]) bad(fmt::format("{} reads %{} before it is defined (dangling)", where, in));
      fakes.push_back(fake_proxy(g.meta(in)));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId o = n.outputs[k];
      if (o < 0 || o >= nv) bad(fmt::format("{} writes %{}, out of range", where, o));
      const Value& val = g.value(o);
      if (val.kind != ValueKind::node || val.producer != static_cast<int32_t>(i) || val.out_index != static_cast<int32_t>(k))
        bad(fmt::format("{} output %{} does not point back to the node", where, o));
      if (defined[static_cast<size_t>(o)]) bad(fmt::format("{} redefines %{}", where, o));
      defined[static_cast<size_t>(o)] = 1;
    }
    ops::MetaResult m;
    try {
      n.op->meta(ops::MetaArgs{*n.op, fakes, n.attrs}, m);
    } catch (const Error& e) {
      bad(fmt::format("{}: its meta function rejects the inputs: {}", where, e.what()));
    }
    if (m.num_outputs != static_cast<int>(n.outputs.size()))
      bad(fmt::format("{} has {} outputs, its meta function says {}", where, n.outputs.size(), m.num_outputs));
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ValueMeta& have = g.meta(n.outputs[k]);
      const ops::TensorMeta& want = m.outputs[k];
      if (have.shape != want.shape || have.dtype != want.dtype || have.device != want.device)
        bad(fmt::format("{} output %{} is {} but its inputs give {}", where, n.outputs[k], meta_str(have),
                        meta_str({want.shape, want.dtype, want.device, false})));
    }
    if (n.region >= static_cast<int32_t>(g.regions.size())) bad(fmt::format("{} is in region {} of {}", where, n.region, g.regions.size()));
  }
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    ValueId o = g.outputs[i];
    if (o < 0 || o >= nv || !defined[static_cast<size_t>(o)]) bad(fmt::format("graph output {} (%{}) is not defined", i, o));
  }
  for (size_t r = 0; r < g.regions.size(); ++r) {
    for (int32_t ni : g.regions[r].nodes) {
      if (ni < 0 || static_cast<size_t>(ni) >= g.nodes.size() || g.nodes[static_cast<size_t>(ni)].dead ||
          g.nodes[static_cast<size_t>(ni)].region != static_cast<int32_t>(r))
        bad(fmt::format("region {} lists node {} that is not in it", r, ni));
    }
  }
  if (g.plan.valid && g.plan.slot_of.size() != g.values.size()) bad("the buffer plan does not cover every value");
}

PassReport optimize(Graph& g, const PassOptions& o) {
  PassReport rep;
  g.emulate_precision_casts = o.emulate_precision_casts;
  auto run = [&](const char* name, auto&& fn) {
    int c = fn();
    rep.changes.emplace_back(name, c);
    if (o.verify) verify(g, std::string("after ") + name);
    return c;
  };
  if (o.verify) verify(g, "as traced");
  run("dce", [&] { return dce(g); });
  for (int iter = 0; iter < 4; ++iter) {
    int c = 0;
    if (o.simplify) c += run("simplify", [&] { return simplify(g); });
    if (o.fold) c += run("fold", [&] { return fold_constants(g); });
    if (o.cse) c += run("cse", [&] { return cse(g); });
    c += run("dce", [&] { return dce(g); });
    if (c == 0) break;
  }
  if (o.fuse) run("fuse_moe", [&] { return fuse_moe(g); });
  if (o.fuse) run("fuse", [&] { return fuse(g); });
  if (o.plan) run("plan_buffers", [&] { return plan_buffers(g); });
  return rep;
}

}  // namespace tpu::graph
