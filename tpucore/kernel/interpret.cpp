// The kernel API's checks and its cpu interpreter: the body runs once per grid step on host
// blocks (Pallas' interpret=True). Output blocks stay resident while consecutive steps map to
// the same block index and are written back when it changes (the accumulator pattern); a block
// becoming resident starts as zeros. Elements no output block covers stay zero.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "tpucore/core/error.h"
#include "tpucore/core/hooks.h"
#include "codegen/launch.h"
#include "tpucore/kernel/internal.h"
#include "tpucore/kernel/lower_sim.h"
#include "tpucore/ops.h"

namespace tpu::kernel {

using detail::data_of;
using detail::shape_str;

namespace detail {

std::string spec_name(const BlockSpec& s, const char* kind, size_t i) {
  return s.name.empty() ? fmt::format("{} {}", kind, i) : fmt::format("{} {} ('{}')", kind, i, s.name);
}

// The block shape of a spec over an array (squeezed dims dropped), checked.
std::vector<int64_t> block_shape_of(const KernelDef& k, const BlockSpec& s, const TensorType& t, const std::string& who) {
  const int r = t.shape.ndim();
  if (s.block_shape.empty()) return std::vector<int64_t>(t.shape.begin(), t.shape.end());
  TPU_CHECK(static_cast<int>(s.block_shape.size()) == r,
            "kernel '{}': {} has block shape {} of rank {} for an array {} of rank {}", k.name, who,
            shape_str(s.block_shape), s.block_shape.size(), shape_str({t.shape.begin(), t.shape.end()}), r);
  std::vector<int64_t> b;
  for (int64_t d : s.block_shape) {
    TPU_CHECK(d > 0 || d == squeezed, "kernel '{}': {} has block dim {} in {} (positive, or kernel::squeezed)", k.name,
              who, d, shape_str(s.block_shape));
    if (d != squeezed) b.push_back(d);
  }
  return b;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Where the block of `s` lies at grid index `g` (a tpu::Error for a bad index map).
BlockPlace place_of(const KernelDef& k, const BlockSpec& s, const TensorType& t, const std::string& who,
                    std::span<const int64_t> g, const Scalars* scalars) {
  const int r = t.shape.ndim();
  BlockPlace p;
  p.block = block_shape_of(k, s, t, who);
  if (s.scalar_index_map) {
    TPU_CHECK(scalars != nullptr, "kernel '{}': the index map of {} reads scalar-prefetch arrays, which are not given",
              k.name, who);
    p.block_index = s.scalar_index_map(g, *scalars);
  } else {
    p.block_index = s.index_map ? s.index_map(g) : Index(static_cast<size_t>(r), 0);
  }
  TPU_CHECK(static_cast<int>(p.block_index.size()) == r,
            "kernel '{}': the index map of {} gave {} entries at grid index {} for an array of rank {}", k.name, who,
            p.block_index.size(), shape_str({g.begin(), g.end()}), r);
  for (int d = 0; d < r; ++d) {
    const size_t u = static_cast<size_t>(d);
    const int64_t bs = s.block_shape.empty() ? t.shape[d] : s.block_shape[u];
    const int64_t size = bs == squeezed ? 1 : bs;
    const int64_t blocks = bs == squeezed ? t.shape[d] : std::max<int64_t>(1, ceil_div(t.shape[d], size));
    const int64_t bi = p.block_index[u];
    if (bi < 0 || bi >= blocks) {
      std::vector<int64_t> per_dim;
      for (int e = 0; e < r; ++e) {
        const int64_t b2 = s.block_shape.empty() ? t.shape[e] : s.block_shape[static_cast<size_t>(e)];
        per_dim.push_back(b2 == squeezed ? t.shape[e] : std::max<int64_t>(1, ceil_div(t.shape[e], b2)));
      }
      fail("kernel '{}': the index map of {} gave block index {} at grid index {}, out of range: the array {} in "
           "blocks {} has {} blocks per dim",
           k.name, who, shape_str(p.block_index), shape_str({g.begin(), g.end()}),
           shape_str({t.shape.begin(), t.shape.end()}), shape_str(s.block_shape), shape_str(per_dim));
    }
    p.start.push_back(bi * size);
    p.extent.push_back(size);
    if (bs != squeezed) p.array_dim.push_back(d);
  }
  return p;
}

}  // namespace detail

namespace {

std::vector<double> host_values(const Tensor& t) {
  Tensor c = t.device().type == DeviceType::cpu ? t : t.to(Device());
  c = c.contiguous();
  if (c.dtype() != DType::f32 && c.dtype() != DType::i32) c = c.to(t.dtype() == DType::boolean ? DType::i32 : DType::f32);
  std::vector<double> v(static_cast<size_t>(c.numel()));
  if (c.dtype() == DType::f32) {
    const float* p = c.data<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else {
    const int32_t* p = c.data<int32_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  }
  return v;
}

void write_host(Tensor& out, const std::vector<double>& v) {
  Tensor f = empty_tensor(out.shape(), DType::f32, Device());
  float* p = f.data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
  Tensor src = out.dtype() == DType::f32 ? f : f.to(out.dtype());
  std::memcpy(out.raw_data(), src.contiguous().raw_data(), out.nbytes());
}

void flush_output(KernelContext::State& s, size_t i) {
  if (!s.out_resident[i]) return;
  const auto& blk = s.out_block[i];
  auto& arr = s.out_data[i];
  detail::for_each_block_elem(s.out_place[i], s.out_types[i].shape, [&](int64_t e, int64_t off) {
    if (off >= 0) arr[static_cast<size_t>(off)] = blk[static_cast<size_t>(e)];
  });
  s.out_resident[i] = false;
}

// A new resident output block starts as zeros (not the array's contents: on the chip an output
// block is never read back from HBM).
void make_resident(KernelContext::State& s, size_t i) {
  s.out_block[i].assign(static_cast<size_t>(detail::numel_of(s.out_place[i].block)), 0.0);
  s.out_resident[i] = true;
}

}  // namespace

void detail::read_scalars(KernelContext::State& s, std::span<const Tensor> arrays) {
  for (const Tensor& t : arrays) {
    TPU_CHECK(t.dtype() == DType::i32, "kernel '{}': a scalar-prefetch input has dtype {}; it must be i32", s.def->name,
              dtype_name(t.dtype()));
    std::vector<int64_t> v;
    for (double x : host_values(t)) v.push_back(static_cast<int64_t>(x));
    s.scalars.push_back(std::move(v));
    s.scalar_shapes.push_back(t.shape());
  }
}

void validate(const KernelDef& k, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  detail::validate_with(k, inputs, outputs, nullptr);
}

void detail::validate_with(const KernelDef& k, std::span<const TensorType> all_inputs,
                           std::span<const TensorType> outputs, const Scalars* scalars) {
  TPU_CHECK(static_cast<bool>(k.body), "kernel '{}': no body", k.name);
  TPU_CHECK(k.num_scalar_prefetch >= 0 && static_cast<size_t>(k.num_scalar_prefetch) <= all_inputs.size(),
            "kernel '{}': {} scalar-prefetch array(s) for {} input(s)", k.name, k.num_scalar_prefetch, all_inputs.size());
  TPU_CHECK(k.num_semaphores >= 0, "kernel '{}': {} semaphores", k.name, k.num_semaphores);
  const size_t nsp = static_cast<size_t>(k.num_scalar_prefetch);
  for (size_t i = 0; i < nsp; ++i)
    TPU_CHECK(all_inputs[i].dtype == DType::i32, "kernel '{}': scalar-prefetch input {} has dtype {}; it must be i32",
              k.name, i, dtype_name(all_inputs[i].dtype));
  const std::span<const TensorType> inputs = all_inputs.subspan(nsp);
  TPU_CHECK(k.in_specs.size() == inputs.size(), "kernel '{}': {} input block spec(s) for {} input(s) after {} scalar-prefetch array(s)", k.name,
            k.in_specs.size(), inputs.size(), nsp);
  TPU_CHECK(k.out_specs.size() == outputs.size(), "kernel '{}': {} output block spec(s) for {} output(s)", k.name,
            k.out_specs.size(), outputs.size());
  TPU_CHECK(!outputs.empty(), "kernel '{}': no outputs", k.name);
  for (int64_t g : k.grid) TPU_CHECK(g >= 0, "kernel '{}': negative grid size in {}", k.name, shape_str(k.grid));
  const int64_t budget = k.vmem_budget_bytes > 0 ? k.vmem_budget_bytes : kDefaultVmemBudget;
  struct Use {
    std::string who;
    std::vector<int64_t> shape;
    DType dtype;
    int64_t bytes;
  };
  std::vector<Use> uses;
  auto add_operand = [&](const BlockSpec& s, const TensorType& t, const char* kind, size_t i) {
    const std::string who = detail::spec_name(s, kind, i);
    TPU_CHECK(detail::block_dtype_ok(t.dtype), "kernel '{}': {} has dtype {}; blocks are f32, bf16, i32, i8 or bool",
              k.name, who, dtype_name(t.dtype));
    if (detail::is_any(s)) return;  // left in HBM: no blocks
    std::vector<int64_t> b = detail::block_shape_of(k, s, t, who);
    uses.push_back({who, b, t.dtype, 2 * detail::numel_of(b) * static_cast<int64_t>(dtype_size(t.dtype))});
  };
  for (size_t i = 0; i < inputs.size(); ++i) add_operand(k.in_specs[i], inputs[i], "input", i);
  for (size_t i = 0; i < outputs.size(); ++i) add_operand(k.out_specs[i], outputs[i], "output", i);
  for (size_t i = 0; i < k.scratch.size(); ++i) {
    const ScratchSpec& s = k.scratch[i];
    const std::string who = s.name.empty() ? fmt::format("scratch {}", i) : fmt::format("scratch {} ('{}')", i, s.name);
    TPU_CHECK(detail::block_dtype_ok(s.dtype), "kernel '{}': {} has dtype {}; blocks are f32, bf16, i32, i8 or bool",
              k.name, who, dtype_name(s.dtype));
    for (int64_t d : s.shape) TPU_CHECK(d > 0, "kernel '{}': {} has shape {}", k.name, who, shape_str(s.shape));
    uses.push_back({who, s.shape, s.dtype, detail::numel_of(s.shape) * static_cast<int64_t>(dtype_size(s.dtype))});
  }
  int64_t total = 0;
  for (const Use& u : uses) {
    TPU_CHECK(u.bytes <= budget,
              "kernel '{}': {} block {} {} needs {} bytes of vector memory (double-buffered), more than the budget of "
              "{} bytes; use smaller blocks or raise KernelDef::vmem_budget_bytes",
              k.name, u.who, dtype_name(u.dtype), shape_str(u.shape), u.bytes, budget);
    total += u.bytes;
  }
  if (total > budget) {
    std::string list;
    for (const Use& u : uses) list += fmt::format("{}{} {} {} ({} bytes)", list.empty() ? "" : ", ", u.who,
                                                  dtype_name(u.dtype), shape_str(u.shape), u.bytes);
    fail("kernel '{}': its blocks need {} bytes of vector memory together, more than the budget of {} bytes: {}",
         k.name, total, budget, list);
  }
  auto check_map = [&](const BlockSpec& sp, const TensorType& t, const char* kind, size_t i, std::span<const int64_t> g) {
    if (detail::is_any(sp) || (sp.scalar_index_map && !scalars)) return;
    (void)detail::place_of(k, sp, t, detail::spec_name(sp, kind, i), g, scalars);
  };
  detail::for_each_grid_index(k.grid, [&](std::span<const int64_t> g) {
    for (size_t i = 0; i < inputs.size(); ++i) check_map(k.in_specs[i], inputs[i], "input", i, g);
    for (size_t i = 0; i < outputs.size(); ++i) check_map(k.out_specs[i], outputs[i], "output", i, g);
  });
}

std::vector<Tensor> call(const KernelDef& k, std::span<const Tensor> inputs_in, std::span<const TensorType> outputs) {
  // A tensor of a deferred eager recording (TPU_EAGER=defer) is read as eager would.
  std::vector<Tensor> real(inputs_in.begin(), inputs_in.end());
  for (Tensor& t : real)
    if (t.defined() && t.is_proxy() && tpu::detail::proxy_deferred(t)) t = tpu::detail::materialize_proxy(t, "kernel::call");
  const std::span<const Tensor> inputs = real;
  std::vector<TensorType> in_types;
  // The kernel runs on the device of its block operands; scalar-prefetch arrays may also be on the cpu.
  const size_t first = std::min(inputs.size(), static_cast<size_t>(std::max(0, k.num_scalar_prefetch)));
  const size_t lead = first < inputs.size() ? first : 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TPU_CHECK(inputs[i].defined(), "kernel '{}': input {} is an undefined tensor", k.name, i);
    TPU_CHECK(!inputs[i].is_proxy(), "kernel '{}': kernel::call on a traced tensor; register the kernel with "
              "kernel::register_op to use it inside tpu::compile", k.name);
    TPU_CHECK(inputs[i].device() == inputs[lead].device() || (i < first && inputs[i].device().type == DeviceType::cpu),
              "kernel '{}': inputs on {} and {}", k.name, inputs[lead].device().str(), inputs[i].device().str());
    in_types.push_back({inputs[i].shape(), inputs[i].dtype()});
  }
  if (!inputs.empty() && inputs[lead].device().type != DeviceType::cpu) {
    const Device dev = inputs[lead].device();
    TPU_CHECK(codegen::runs_generated_programs(dev),
              "kernel '{}': inputs on {}, a device that runs no generated programs; kernels run on the cpu "
              "(interpreter) and on chip devices (lowered)", k.name, dev.str());
    std::vector<Tensor> result;
    for (const TensorType& t : outputs) result.push_back(empty_tensor(t.shape, t.dtype, dev));
    // A KernelDef holds functions, so it has no identity to cache its program under: lowered per call.
    static std::atomic<uint64_t> calls{0};
    detail::run_on_chip(k, fmt::format("kernel_call:{}:{}", k.name, calls.fetch_add(1)), inputs, result);
    return result;
  }
  KernelContext::State s;
  s.def = &k;
  TPU_CHECK(k.num_scalar_prefetch >= 0 && static_cast<size_t>(k.num_scalar_prefetch) <= inputs.size(),
            "kernel '{}': {} scalar-prefetch array(s) for {} input(s)", k.name, k.num_scalar_prefetch, inputs.size());
  const size_t nsp = static_cast<size_t>(k.num_scalar_prefetch);
  detail::read_scalars(s, inputs.first(nsp));
  const Scalars scalars(&s.scalars, &s.scalar_shapes, &k.name);
  detail::validate_with(k, in_types, outputs, &scalars);
  s.in_types.assign(in_types.begin() + static_cast<std::ptrdiff_t>(nsp), in_types.end());
  s.out_types.assign(outputs.begin(), outputs.end());
  for (size_t i = nsp; i < inputs.size(); ++i) s.in_data.push_back(host_values(inputs[i]));
  for (const TensorType& t : outputs) s.out_data.emplace_back(static_cast<size_t>(t.shape.numel()), 0.0);
  s.out_block.resize(outputs.size());
  s.out_resident.assign(outputs.size(), false);
  s.out_place.resize(outputs.size());
  s.in_place.resize(s.in_types.size());
  for (const ScratchSpec& sc : k.scratch) s.scratch.push_back(detail::make_value(sc.shape, sc.dtype));
  detail::begin_copies(s);
  KernelContext ctx(&s);
  detail::for_each_grid_index(k.grid, [&](std::span<const int64_t> g) {
    s.grid_index.assign(g.begin(), g.end());
    for (size_t i = 0; i < s.in_types.size(); ++i)
      if (!detail::is_any(k.in_specs[i]))
        s.in_place[i] = detail::place_of(k, k.in_specs[i], s.in_types[i], detail::spec_name(k.in_specs[i], "input", i), g, &scalars);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (detail::is_any(k.out_specs[i])) continue;
      BlockPlace p = detail::place_of(k, k.out_specs[i], outputs[i], detail::spec_name(k.out_specs[i], "output", i), g, &scalars);
      if (s.out_resident[i] && p.block_index == s.out_place[i].block_index) continue;
      flush_output(s, i);
      s.out_place[i] = std::move(p);
      make_resident(s, i);
    }
    k.body(ctx);
  });
  detail::end_copies(s);
  for (size_t i = 0; i < outputs.size(); ++i) flush_output(s, i);
  std::vector<Tensor> result;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor t = empty_tensor(outputs[i].shape, outputs[i].dtype, Device());
    write_host(t, s.out_data[i]);
    result.push_back(std::move(t));
  }
  return result;
}

std::vector<Tensor> call(const KernelDef& k, std::initializer_list<Tensor> inputs,
                         std::initializer_list<TensorType> outputs) {
  return call(k, std::span<const Tensor>(inputs.begin(), inputs.size()),
              std::span<const TensorType>(outputs.begin(), outputs.size()));
}

// ---- the body's view ----

int64_t KernelContext::program_id(int axis) const {
  const int r = static_cast<int>(s_->grid_index.size());
  TPU_CHECK(axis >= 0 && axis < r, "kernel '{}': program_id({}) of a grid of rank {}", s_->def->name, axis, r);
  return s_->grid_index[static_cast<size_t>(axis)];
}

int64_t KernelContext::num_programs(int axis) const {
  const int r = static_cast<int>(s_->def->grid.size());
  TPU_CHECK(axis >= 0 && axis < r, "kernel '{}': num_programs({}) of a grid of rank {}", s_->def->name, axis, r);
  return s_->def->grid[static_cast<size_t>(axis)];
}

Ref KernelContext::in(int i) {
  TPU_CHECK(i >= 0 && static_cast<size_t>(i) < s_->in_types.size(), "kernel '{}': in({}) of {} input(s)",
            s_->def->name, i, s_->in_types.size());
  return Ref(this, Ref::Kind::input, i);
}

Ref KernelContext::out(int i) {
  TPU_CHECK(i >= 0 && static_cast<size_t>(i) < s_->out_types.size(), "kernel '{}': out({}) of {} output(s)",
            s_->def->name, i, s_->out_types.size());
  return Ref(this, Ref::Kind::output, i);
}

Ref KernelContext::scratch(int i) {
  TPU_CHECK(i >= 0 && static_cast<size_t>(i) < s_->scratch.size(), "kernel '{}': scratch({}) of {} scratch buffer(s)",
            s_->def->name, i, s_->scratch.size());
  return Ref(this, Ref::Kind::scratch, i);
}

int64_t KernelContext::param(const std::string& name) const {
  auto it = s_->def->params.find(name);
  TPU_CHECK(it != s_->def->params.end(), "kernel '{}': no compile-time parameter '{}'", s_->def->name, name);
  return it->second;
}

const KernelDef& KernelContext::def() const { return *s_->def; }

}  // namespace tpu::kernel
