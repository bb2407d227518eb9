#include "graph/region_exec.h"

#include <algorithm>
#include <unordered_map>

#include "ops/cpu/loops.h"
#include "tpucore/core/parallel.h"

namespace tpu::graph {
namespace {

constexpr int64_t kElementwiseTile = 16384;
constexpr int64_t kMatmulTile = 65536;

// A value as seen from the region domain: sizes and strides aligned to the domain's rank
// (missing leading dims have size 1), plus the base element offset.
struct Aligned {
  int rank = 0;  // the value's own rank
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t base = 0;
};

Aligned align(const Shape& shape, const Shape* strides, int64_t base, int dn) {
  Aligned a;
  a.rank = shape.ndim();
  a.base = base;
  const int lead = dn - shape.ndim();
  for (int j = 0; j < dn; ++j) {
    if (j < lead) {
      a.size[j] = 1;
      a.stride[j] = 0;
    } else {
      a.size[j] = shape[j - lead];
      a.stride[j] = strides ? (*strides)[j - lead] : 0;
    }
  }
  return a;
}

}  // namespace

RegionProgram prepare_region(const Graph& g, const Region& r, int64_t target) {
  RegionProgram p;
  p.domain = r.domain;
  const int dn = p.domain.ndim();
  bool has_matmul = false;
  std::unordered_map<ValueId, int32_t> scratch;
  std::vector<char> is_out(g.values.size(), 0);
  for (ValueId o : r.outputs) is_out[static_cast<size_t>(o)] = 1;
  for (int32_t ni : r.nodes) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    FusionInfo fi = classify(g, n);
    has_matmul |= fi.cls == OpClass::matmul;
    RegionStepProgram s;
    s.node = ni;
    for (size_t i = 0; i < n.inputs.size(); ++i) s.inputs.push_back({n.inputs[i], input_mode(fi.cls, i)});
    s.output = n.outputs[0];
    if (!is_out[static_cast<size_t>(s.output)]) {
      s.scratch = static_cast<int32_t>(p.scratch_values.size());
      p.scratch_values.push_back(s.output);
      scratch.emplace(s.output, s.scratch);
    }
    p.steps.push_back(std::move(s));
  }
  if (target <= 0) target = has_matmul ? kMatmulTile : kElementwiseTile;
  // Pick the split dim: the deepest allowed dim, moved outwards while a whole slab is small.
  int k = std::min(r.tile_dim_limit, dn - 1);
  auto rowsize = [&](int d) {
    int64_t s = 1;
    for (int j = d + 1; j < dn; ++j) s *= p.domain[j];
    return s;
  };
  while (k > 0 && p.domain[k] * rowsize(k) <= target) --k;
  p.split_dim = std::max(k, 0);
  const int64_t rs = rowsize(p.split_dim);
  const int64_t dk = dn ? p.domain[p.split_dim] : 1;
  p.tile_len = std::clamp<int64_t>(target / std::max<int64_t>(rs, 1), 1, std::max<int64_t>(dk, 1));
  p.tiles_per_row = (dk + p.tile_len - 1) / p.tile_len;
  int64_t outer = 1;
  for (int j = 0; j < p.split_dim; ++j) outer *= p.domain[j];
  p.num_tiles = outer * p.tiles_per_row;
  p.tile_elems = p.tile_len * rs;
  return p;
}

void run_region(const Graph& g, const RegionProgram& p, std::vector<Tensor>& vals) {
  const int dn = p.domain.ndim();
  const int k = p.split_dim;
  // Aligned views of every non-scratch value the region touches.
  std::unordered_map<ValueId, Aligned> ext;
  std::vector<char> scratch_flag(g.values.size(), 0);
  for (ValueId v : p.scratch_values) scratch_flag[static_cast<size_t>(v)] = 1;
  for (const auto& s : p.steps) {
    for (const auto& a : s.inputs) {
      if (scratch_flag[static_cast<size_t>(a.value)] || a.mode == InputMode::full) continue;  // scratch or whole
      const Tensor& t = vals[static_cast<size_t>(a.value)];
      ext.emplace(a.value, align(t.shape(), &t.strides(), t.offset(), dn));
    }
    if (s.scratch < 0) {
      const Tensor& t = vals[static_cast<size_t>(s.output)];
      ext.emplace(s.output, align(t.shape(), &t.strides(), t.offset(), dn));
    }
  }
  std::vector<Aligned> scratch_al;
  for (ValueId v : p.scratch_values) scratch_al.push_back(align(g.meta(v).shape, nullptr, 0, dn));

  const int64_t grain = std::max<int64_t>(1, ops::cpu::kParallelGrain / std::max<int64_t>(p.tile_elems, 1));
  parallel_for(0, p.num_tiles, grain, [&](int64_t tb, int64_t te) {
    // Per-thread scratch and reusable tensor handles.
    std::vector<Tensor> scratch;
    for (ValueId v : p.scratch_values) {
      int64_t n = 1;
      const Aligned al = align(g.meta(v).shape, nullptr, 0, dn);
      for (int j = 0; j < dn; ++j) n *= j < k ? 1 : (j == k ? std::min(al.size[j], p.tile_len) : al.size[j]);
      scratch.push_back(ops::empty_tensor(Shape{n}, g.meta(v).dtype, Device()));
    }
    auto make_handle = [&](const Tensor& src, DType dt) {
      auto impl = std::make_shared<TensorImpl>();
      impl->storage = src.storage();
      impl->dtype = dt;
      impl->device = Device();
      return Tensor(std::move(impl));
    };
    std::vector<std::vector<Tensor>> in_h(p.steps.size());
    std::vector<Tensor> out_h(p.steps.size());
    for (size_t si = 0; si < p.steps.size(); ++si) {
      const auto& s = p.steps[si];
      for (const auto& a : s.inputs) {
        if (a.mode == InputMode::full && !scratch_flag[static_cast<size_t>(a.value)]) {
          in_h[si].push_back(vals[static_cast<size_t>(a.value)]);
          continue;
        }
        const Tensor& src = scratch_flag[static_cast<size_t>(a.value)]
                                ? scratch[static_cast<size_t>(std::find(p.scratch_values.begin(), p.scratch_values.end(), a.value) - p.scratch_values.begin())]
                                : vals[static_cast<size_t>(a.value)];
        in_h[si].push_back(make_handle(src, g.meta(a.value).dtype));
      }
      const Tensor& dst = s.scratch >= 0 ? scratch[static_cast<size_t>(s.scratch)] : vals[static_cast<size_t>(s.output)];
      out_h[si] = make_handle(dst, g.meta(s.output).dtype);
    }
    std::vector<int32_t> scratch_idx(g.values.size(), -1);
    for (size_t i = 0; i < p.scratch_values.size(); ++i) scratch_idx[static_cast<size_t>(p.scratch_values[i])] = static_cast<int32_t>(i);

    int64_t idx[kMaxDims];
    for (int64_t t = tb; t < te; ++t) {
      int64_t rest = t / p.tiles_per_row;
      const int64_t a0 = (t % p.tiles_per_row) * p.tile_len;
      const int64_t len = std::min(p.tile_len, (dn ? p.domain[k] : 1) - a0);
      for (int j = k - 1; j >= 0; --j) {
        idx[j] = rest % p.domain[j];
        rest /= p.domain[j];
      }
      // Fills a handle with the tile view of a value. target: node output tile (broadcast
      // mode) or nullptr (own shape).
      auto set_view = [&](Tensor& h, ValueId v, const int64_t* target) -> void {
        TensorImpl& im = h.impl();
        const int32_t si = scratch_idx[static_cast<size_t>(v)];
        const Aligned& al = si >= 0 ? scratch_al[static_cast<size_t>(si)] : ext.at(v);
        int64_t tile[kMaxDims], st[kMaxDims];
        for (int j = 0; j < dn; ++j) tile[j] = j < k ? 1 : (j == k ? (al.size[j] == 1 ? 1 : len) : al.size[j]);
        int64_t off = al.base;
        if (si >= 0) {
          int64_t acc = 1;
          for (int j = dn - 1; j >= 0; --j) {
            st[j] = acc;
            acc *= tile[j];
          }
          off = 0;
        } else {
          for (int j = 0; j < dn; ++j) st[j] = al.stride[j];
          for (int j = 0; j < k; ++j)
            if (al.size[j] != 1) off += idx[j] * al.stride[j];
          if (dn && al.size[k] != 1) off += a0 * al.stride[k];
        }
        const int r = target ? dn : al.rank;
        im.shape.resize(r);
        im.strides.resize(r);
        for (int q = 0; q < r; ++q) {
          const int j = q + dn - r;
          if (target) {
            im.shape[q] = target[j];
            im.strides[q] = (al.size[j] == 1 && target[j] != 1) ? 0 : st[j];
          } else {
            im.shape[q] = tile[j];
            im.strides[q] = st[j];
          }
        }
        im.offset = off;
        im.recompute_contiguous();
      };
      for (size_t si = 0; si < p.steps.size(); ++si) {
        const auto& s = p.steps[si];
        const Node& n = g.nodes[static_cast<size_t>(s.node)];
        // Output tile shape first (it is the broadcast target of the inputs).
        int64_t target[kMaxDims];
        {
          const int32_t sc = scratch_idx[static_cast<size_t>(s.output)];
          const Aligned& al = sc >= 0 ? scratch_al[static_cast<size_t>(sc)] : ext.at(s.output);
          for (int j = 0; j < dn; ++j) target[j] = j < k ? 1 : (j == k ? (al.size[j] == 1 ? 1 : len) : al.size[j]);
        }
        set_view(out_h[si], s.output, nullptr);
        for (size_t i = 0; i < s.inputs.size(); ++i) {
          const auto& a = s.inputs[i];
          // A full-mode input computed inside the region is a placeholder (an absent weight
          // passed as x): its own tile stands in for it.
          if (a.mode == InputMode::full && !scratch_flag[static_cast<size_t>(a.value)]) continue;
          set_view(in_h[si][i], a.value, a.mode == InputMode::broadcast ? target : nullptr);
        }
        ops::KernelFn kf = n.op->kernels[static_cast<int>(DeviceType::cpu)];
        if (!kf) kf = n.op->cpu;
        kf(ops::KernelArgs{*n.op, in_h[si], std::span<Tensor>(&out_h[si], 1), n.attrs});
      }
    }
  });
}

}  // namespace tpu::graph
