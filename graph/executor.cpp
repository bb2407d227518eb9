#include "graph/executor.h"

#include "graph/region_vec.h"
#include "tpucore/ops.h"

namespace tpu::graph {
namespace {

bool graph_on_cpu(const Graph& g) {
  for (const Value& v : g.values)
    if (!v.meta.device.is_cpu()) return false;
  return true;
}

Tensor slot_view(const StoragePtr& st, const ValueMeta& m) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->shape = m.shape;
  impl->strides = contiguous_strides(m.shape);
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->contiguous = true;
  return Tensor(std::move(impl));
}

}  // namespace

void run_node_eager(const Node& n, std::span<const Tensor> ins, std::span<Tensor> outs) {
  if (n.op->name == "view") {
    outs[0] = tpu::reshape(ins[0], Shape(n.attrs.get_ints("shape")));
    return;
  }
  ops::call(*n.op, ins, n.attrs, outs);
}

Executable::Executable(Graph g, RegionRunner device_regions) : g_(std::move(g)), device_regions_(device_regions) {
  steps_ = schedule(g_);
  on_cpu_ = graph_on_cpu(g_);
  is_output_.assign(g_.values.size(), 0);
  for (ValueId o : g_.outputs) is_output_[static_cast<size_t>(o)] = 1;
  // Last step that reads each value (through views: the alias root stays alive too).
  std::vector<int32_t> last(g_.values.size(), -1);
  auto touch = [&](ValueId v, int32_t s) {
    for (ValueId x = v;;) {
      last[static_cast<size_t>(x)] = std::max(last[static_cast<size_t>(x)], s);
      const Node* p = g_.producer(x);
      if (!p || !p->op->has(ops::kView) || p->inputs.empty()) break;
      x = p->inputs[0];
    }
  };
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& st = steps_[s];
    auto visit = [&](const Node& n) {
      for (ValueId in : n.inputs) touch(in, static_cast<int32_t>(s));
      for (ValueId o : n.outputs) touch(o, static_cast<int32_t>(s));
    };
    if (st.region >= 0) {
      for (int32_t ni : g_.regions[static_cast<size_t>(st.region)].nodes) visit(g_.nodes[static_cast<size_t>(ni)]);
    } else {
      visit(g_.nodes[static_cast<size_t>(st.node)]);
    }
  }
  release_.assign(steps_.size(), {});
  for (size_t v = 0; v < g_.values.size(); ++v) {
    if (is_output_[v] || last[v] < 0) continue;
    if (g_.values[v].kind != ValueKind::node) continue;
    release_[static_cast<size_t>(last[v])].push_back(static_cast<ValueId>(v));
  }
  if (on_cpu_)
    for (const Region& r : g_.regions) {
      programs_.push_back(prepare_region(g_, r));
      vec_ok_.push_back(vec_region_supported(g_, r) ? 1 : 0);
    }
}

void Executable::run(std::span<const Tensor> inputs, std::vector<Tensor>& outputs) const {
  TPU_CHECK(inputs.size() == g_.inputs.size(), "internal: compiled graph expects {} inputs, got {}", g_.inputs.size(),
            inputs.size());
  std::vector<Tensor> vals(g_.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) vals[static_cast<size_t>(g_.inputs[i])] = inputs[i];
  for (size_t v = 0; v < g_.values.size(); ++v)
    if (g_.values[v].kind == ValueKind::constant) vals[v] = g_.values[v].constant;

  // Planned slots (cpu only): one storage per slot for this call.
  std::vector<StoragePtr> slots;
  const bool planned = on_cpu_ && g_.plan.valid;
  if (planned) {
    slots.reserve(g_.plan.slot_bytes.size());
    for (int64_t b : g_.plan.slot_bytes)
      slots.push_back(ops::empty_tensor(Shape{b}, DType::u8, Device()).storage());
  }
  auto alloc = [&](ValueId v) -> Tensor {
    const ValueMeta& m = g_.meta(v);
    if (planned) {
      int32_t s = g_.plan.slot_of[static_cast<size_t>(v)];
      if (s >= 0) return slot_view(slots[static_cast<size_t>(s)], m);
    }
    return ops::empty_tensor(m.shape, m.dtype, m.device);
  };

  std::vector<Tensor> ins, outs;
  for (size_t si = 0; si < steps_.size(); ++si) {
    const Step& st = steps_[si];
    if (st.region >= 0 && on_cpu_) {
      const Region& r = g_.regions[static_cast<size_t>(st.region)];
      for (ValueId o : r.outputs) vals[static_cast<size_t>(o)] = alloc(o);
      if (vec_ok_[static_cast<size_t>(st.region)]) run_region_vec(g_, r, vals);
      else run_region(g_, programs_[static_cast<size_t>(st.region)], vals);
    } else if (st.region >= 0 && device_regions_ &&
               device_regions_(g_, g_.regions[static_cast<size_t>(st.region)], vals)) {
      // run by the device's region runner
    } else {
      auto run_one = [&](const Node& n) {
        ins.clear();
        for (ValueId i : n.inputs) ins.push_back(vals[static_cast<size_t>(i)]);
        outs.assign(std::max<size_t>(n.outputs.size(), 1), Tensor());
        if (n.op->has(ops::kView)) {
          if (n.op->name == "view" && !ins[0].is_contiguous()) {
            run_node_eager(n, ins, outs);
          } else {
            ops::TensorMeta om{g_.meta(n.outputs[0]).shape, g_.meta(n.outputs[0]).dtype, g_.meta(n.outputs[0]).device};
            outs[0] = n.op->view(ins[0], n.attrs, om);
          }
        } else if (on_cpu_ && n.op->cpu) {
          for (size_t k = 0; k < n.outputs.size(); ++k) outs[k] = alloc(n.outputs[k]);
          ops::KernelFn k = n.op->kernels[static_cast<int>(DeviceType::cpu)];
          if (!k) k = n.op->cpu;
          k(ops::KernelArgs{*n.op, ins, std::span<Tensor>(outs.data(), n.outputs.size()), n.attrs});
        } else {
          run_node_eager(n, ins, outs);
        }
        for (size_t k = 0; k < n.outputs.size(); ++k) {
          if (g_.meta(n.outputs[k]).wrapped && outs[k].defined()) outs[k].impl().wrapped_number = true;
          vals[static_cast<size_t>(n.outputs[k])] = std::move(outs[k]);
        }
      };
      if (st.region >= 0) {
        for (int32_t ni : g_.regions[static_cast<size_t>(st.region)].nodes) run_one(g_.nodes[static_cast<size_t>(ni)]);
      } else {
        run_one(g_.nodes[static_cast<size_t>(st.node)]);
      }
    }
    for (ValueId v : release_[si]) vals[static_cast<size_t>(v)] = Tensor();
  }
  outputs.resize(g_.outputs.size());
  for (size_t i = 0; i < g_.outputs.size(); ++i) outputs[i] = vals[static_cast<size_t>(g_.outputs[i])];
}

}  // namespace tpu::graph
