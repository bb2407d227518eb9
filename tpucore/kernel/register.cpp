// Kernel ops: a kernel registered in the op registry. One shared meta function, cpu kernel and
// backward formula serve every kernel op; each looks its OpSpec up by the op's name. The call's
// compile-time parameters travel as the attribute "params" ("name=value;..."), so the tracer
// records, hashes and compares them like any attribute.
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "graph/stablehlo.h"
#include "ops/registry.h"
#include "tpucore/core/error.h"
#include "codegen/launch.h"
#include "codegen/precision.h"
#include "codegen/sim_tensors.h"
#include "tpucore/kernel/internal.h"
#include "tpucore/kernel/lower_sim.h"
#include "tpucore/ops.h"

namespace tpu::kernel {
namespace {

struct SpecTable {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const OpSpec>> by_name;
};
SpecTable& table() {
  static SpecTable* t = new SpecTable();
  return *t;
}

const OpSpec& spec_of(const ops::OpDef& op) {
  SpecTable& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  auto it = t.by_name.find(op.name);
  TPU_CHECK(it != t.by_name.end(), "internal: kernel op '{}' has no spec", op.name);
  return *it->second;
}

std::string encode(const Params& p) {
  std::string s;
  for (const auto& [k, v] : p) {
    TPU_CHECK(!k.empty() && k.find_first_of("=;") == std::string::npos,
              "kernel op: parameter name '{}' is empty or contains '=' or ';'", k);
    s += fmt::format("{}{}={}", s.empty() ? "" : ";", k, v);
  }
  return s;
}

Params decode(const ops::Attrs& attrs) {
  Params p;
  if (!attrs.has("params")) return p;
  const std::string& s = attrs.get_string("params");
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(';', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    const size_t eq = item.find('=');
    TPU_CHECK(eq != std::string::npos, "kernel op: malformed parameter '{}'", item);
    p[item.substr(0, eq)] = std::stoll(item.substr(eq + 1));
    pos = end + 1;
  }
  return p;
}

std::vector<TensorType> types_of(std::span<const Tensor> ts) {
  std::vector<TensorType> v;
  for (const Tensor& t : ts) v.push_back({t.shape(), t.dtype()});
  return v;
}

void kernel_meta(const ops::MetaArgs& a, ops::MetaResult& m) {
  const OpSpec& spec = spec_of(a.op);
  const std::vector<TensorType> in = types_of(a.inputs);
  const std::vector<TensorType> out = spec.output_types(in, decode(a.attrs));
  TPU_CHECK(!out.empty() && out.size() <= static_cast<size_t>(ops::kMaxOutputs),
            "kernel op '{}': its shape rule gave {} outputs (1 to {})", a.op.name, out.size(), ops::kMaxOutputs);
  m.num_outputs = static_cast<int>(out.size());
  for (size_t i = 0; i < out.size(); ++i) m.out(static_cast<int>(i)) = {out[i].shape, out[i].dtype, a.inputs[0].device()};
}

// The kernel an op call runs: the spec's builder over the call's operand types and parameters.
struct BuiltKernel {
  Params params;
  std::vector<TensorType> in, out;
  KernelDef def;
};
BuiltKernel build_kernel(const ops::KernelArgs& a) {
  BuiltKernel b;
  b.params = decode(a.attrs);
  b.in = types_of(a.inputs);
  for (const Tensor& t : a.outputs) b.out.push_back({t.shape(), t.dtype()});
  b.def = spec_of(a.op).kernel(b.in, b.out, b.params);
  if (b.def.name.empty()) b.def.name = a.op.name;
  return b;
}

void kernel_cpu(const ops::KernelArgs& a) {
  const BuiltKernel b = build_kernel(a);
  std::vector<Tensor> res = call(b.def, a.inputs, b.out);
  for (size_t i = 0; i < res.size(); ++i) std::memcpy(a.outputs[i].raw_data(), res[i].raw_data(), res[i].nbytes());
}

// Chip devices: the kernel lowered to a program, cached per op, operand types, parameters and
// f32 matmul precision.
void kernel_sim(const ops::KernelArgs& a) {
  const BuiltKernel b = build_kernel(a);
  std::string key = fmt::format("kernel_op:{}:{}:{}", a.op.name, encode(b.params), float32_matmul_precision());
  for (const TensorType& t : b.in) key += fmt::format(":{}{}", dtype_name(t.dtype), t.shape);
  for (const TensorType& t : b.out) key += fmt::format(":{}{}", dtype_name(t.dtype), t.shape);
  detail::run_on_chip(b.def, key, a.inputs, a.outputs);
}

void kernel_backward(const ops::BackwardArgs& a, std::span<Tensor> grad_inputs) {
  const OpSpec& spec = spec_of(a.op);
  const Params params = decode(a.attrs);
  std::vector<Tensor> grads;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    const Tensor& g = a.grad_outputs[i];
    grads.push_back(g.defined() ? g
                                : zeros(a.outputs[i].shape(), TensorOptions(a.outputs[i].dtype(), a.outputs[i].device())));
  }
  BackwardContext ctx{a.inputs, a.outputs, grads, params, a.needs};
  std::vector<Tensor> gi = spec.backward(ctx);
  TPU_CHECK(gi.size() == a.inputs.size(), "kernel op '{}': its backward gave {} gradient(s) for {} input(s)",
            a.op.name, gi.size(), a.inputs.size());
  for (size_t i = 0; i < gi.size(); ++i) {
    if (!a.needs_grad(i) || !gi[i].defined()) continue;
    TPU_CHECK(gi[i].shape() == a.input_meta[i].shape,
              "kernel op '{}': its backward gave a gradient of shape {} for input {} of shape {}", a.op.name,
              gi[i].shape(), i, a.input_meta[i].shape);
    grad_inputs[i] = gi[i];
  }
}

}  // namespace

Op register_op(OpSpec spec) {
  TPU_CHECK(!spec.name.empty(), "kernel::register_op: the op needs a name");
  TPU_CHECK(spec.num_inputs >= 1, "kernel::register_op '{}': num_inputs must be at least 1, got {}", spec.name,
            spec.num_inputs);
  TPU_CHECK(static_cast<bool>(spec.output_types), "kernel::register_op '{}': no shape rule (output_types)", spec.name);
  TPU_CHECK(static_cast<bool>(spec.kernel), "kernel::register_op '{}': no kernel builder", spec.name);
  TPU_CHECK(ops::find_op(spec.name) == nullptr, "kernel::register_op: an op named '{}' is already registered",
            spec.name);
  const std::string name = spec.name;
  const bool differentiable = static_cast<bool>(spec.backward);
  ops::OpDef def;
  def.name = name;
  def.num_inputs = spec.num_inputs;
  def.flags = differentiable ? ops::kNone : ops::kNonDifferentiable;
  def.meta = &kernel_meta;
  def.cpu = &kernel_cpu;
  def.doc = spec.doc.empty() ? "user kernel" : spec.doc;
  {
    SpecTable& t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    t.by_name[name] = std::make_shared<const OpSpec>(std::move(spec));
  }
  ops::define(std::move(def));
  ops::register_kernel(name, DeviceType::sim, &kernel_sim);
  // The StableHLO export writes the op as a custom_call to its name with its parameters.
  graph::register_custom_call(name, [](const ops::Attrs& attrs) {
    const Params p = decode(attrs);
    return std::vector<std::pair<std::string, int64_t>>(p.begin(), p.end());
  });
  if (differentiable) ops::set_backward(name, ops::BackwardDef{.fn = &kernel_backward, .save_inputs = ~0u, .save_outputs = ~0u});
  return Op(name);
}

bool is_kernel_op(std::string_view name) {
  SpecTable& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  return t.by_name.count(std::string(name)) > 0;
}

int kernel_op_num_inputs(std::string_view name) {
  SpecTable& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  auto it = t.by_name.find(std::string(name));
  return it == t.by_name.end() ? -1 : it->second->num_inputs;
}

std::vector<Tensor> Op::call(std::span<const Tensor> inputs, const Params& params) const {
  const ops::OpDef* d = ops::find_op(name_);
  TPU_CHECK(d != nullptr, "kernel op '{}' is not registered", name_);
  ops::Attrs attrs;
  if (!params.empty()) attrs.set("params", encode(params));
  Tensor out[ops::kMaxOutputs];
  ops::call(*d, inputs, attrs, out);
  std::vector<Tensor> v;
  for (Tensor& t : out)
    if (t.defined()) v.push_back(std::move(t));
  return v;
}

Tensor Op::operator()(std::initializer_list<Tensor> inputs, const Params& params) const {
  return call(std::span<const Tensor>(inputs.begin(), inputs.size()), params)[0];
}

}  // namespace tpu::kernel

namespace tpu::kernel::detail {

void run_on_chip(const KernelDef& k, const std::string& cache_key, std::span<const Tensor> inputs,
                 std::span<Tensor> outputs) {
  const Device dev = outputs[0].device();
  std::vector<TensorType> it, ot;
  std::vector<Tensor> keep;
  std::vector<int64_t> args;
  const size_t nsp = std::min(inputs.size(), static_cast<size_t>(std::max(0, k.num_scalar_prefetch)));
  std::string key = cache_key;
  if (nsp > 0) {  // the grid is unrolled at build time: the program holds the scalars' values
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < nsp; ++i) {
      const Tensor c = inputs[i].to(Device()).contiguous();
      TPU_CHECK(c.dtype() == DType::i32, "kernel '{}': scalar-prefetch input {} has dtype {}; it must be i32", k.name, i,
                dtype_name(c.dtype()));
      for (int64_t e = 0; e < c.numel(); ++e) h = (h ^ static_cast<uint32_t>(c.data<int32_t>()[e])) * 1099511628211ull;
      key += fmt::format(":{}", c.shape());
    }
    key += fmt::format(":sp{:x}", h);
  }
  for (size_t n = 0; n < inputs.size(); ++n) {
    const Tensor& t = inputs[n];
    it.push_back({t.shape(), t.dtype()});
    if (n < nsp) continue;
    std::optional<Tensor> c = codegen::device_operand(t, dev);
    TPU_CHECK(c.has_value(), "kernel '{}': an input view of shape {} cannot be made contiguous on {}", k.name, t.shape(), dev.str());
    keep.push_back(*c);
    args.push_back(codegen::hbm_address(*c));
  }
  for (const Tensor& t : outputs) {
    ot.push_back({t.shape(), t.dtype()});
    args.push_back(codegen::hbm_address(t));
  }
  const sim::ChipConfig& cfg = codegen::chip_config(dev);
  const codegen::LoadedProgram p = codegen::cached_program(dev, key, [&] { return lower_to_chip(k, it, ot, cfg, inputs.first(nsp)); });
  codegen::launch(dev, p, k.name, std::move(args));
}

}  // namespace tpu::kernel::detail
