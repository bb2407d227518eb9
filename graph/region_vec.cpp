#include "graph/region_vec.h"

#include <emmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "tpucore/parallel.h"

namespace tpu::graph {
namespace {

using ops::cpu::VecBinary;
using ops::cpu::VecOperand;
using ops::cpu::VecStep;
using ops::cpu::VecStepKind;
using ops::cpu::VecUnary;

bool decode(const Node& n, VecStep& s) {
  const std::string& name = n.op->name;
  auto bin = [&](VecBinary b) {
    s.kind = VecStepKind::binary;
    s.bin = b;
    if (const ops::AttrValue* a = n.attrs.find("alpha")) {
      if (const auto* sc = std::get_if<Scalar>(a)) s.alpha = static_cast<float>(sc->to_double());
      else return false;
    }
    return n.inputs.size() == 2;
  };
  auto un = [&](VecUnary u) {
    s.kind = VecStepKind::unary;
    s.un = u;
    return n.inputs.size() == 1;
  };
  if (name == "add") return bin(VecBinary::add);
  if (name == "sub") return bin(VecBinary::sub);
  if (name == "mul") return bin(VecBinary::mul);
  if (name == "div") return bin(VecBinary::div);
  if (name == "maximum") return bin(VecBinary::maximum);
  if (name == "minimum") return bin(VecBinary::minimum);
  if (name == "exp") return un(VecUnary::exp);
  if (name == "log") return un(VecUnary::log);
  if (name == "tanh") return un(VecUnary::tanh);
  if (name == "sigmoid") return un(VecUnary::sigmoid);
  if (name == "silu") return un(VecUnary::silu);
  if (name == "erf") return un(VecUnary::erf);
  if (name == "relu") return un(VecUnary::relu);
  if (name == "gelu") return un(n.attrs.get_bool("tanh_approx", false) ? VecUnary::gelu_tanh : VecUnary::gelu_erf);
  if (n.inputs.size() != 1) return false;
  if (name == "neg") s.kind = VecStepKind::neg;
  else if (name == "abs") s.kind = VecStepKind::abs;
  else if (name == "sqrt") s.kind = VecStepKind::sqrt;
  else if (name == "rsqrt") s.kind = VecStepKind::rsqrt;
  else if (name == "reciprocal") s.kind = VecStepKind::recip;
  else if (name == "contiguous") s.kind = VecStepKind::copy;
  else return false;
  return true;
}

// Copies a finished chunk to its output with non-temporal stores (no read-for-ownership of
// output lines that are written whole), falling back to memcpy when misaligned.
void stream_out(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  while (i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15u)) {
    dst[i] = src[i];
    ++i;
  }
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// Outputs at least this big are streamed out.
constexpr int64_t kStreamBytes = 4 << 20;

// Where a value's chunk comes from.
struct Src {
  int scratch = -1;          // per-thread chunk buffer index, or -1 (memory)
  int stream = -1;           // a region output computed in a chunk buffer, then streamed out
  bool output = false;       // a region output (memory)
  const Tensor* t = nullptr;  // memory: the tensor
  int64_t size[kMaxDims], stride[kMaxDims];  // aligned to the domain rank
  int64_t base = 0;
};

// Narrow rows: the program runs on several whole rows per call when every memory operand is
// contiguous across rows (offset row * C), the same row for every row (a broadcast bias,
// copied once per thread into a buffer of as many rows) or a single value. Returns false (and
// does nothing) when some operand is laid out otherwise.
bool run_rows_program(const ops::cpu::VecMathTable& vm, const Shape& D, const std::vector<Src>& srcs,
                      const std::vector<VecStep>& prog) {
  enum class Kind : uint8_t { computed, contiguous, repeated, scalar };
  const int dn = D.ndim();
  const int64_t C = D[dn - 1], rows = D.numel() / C;
  std::vector<Kind> kinds(srcs.size(), Kind::computed);
  int nrep = 0;
  for (size_t k = 0; k < srcs.size(); ++k) {
    const Src& s = srcs[k];
    if (s.scratch >= 0 || (!s.output && !s.t)) continue;
    bool contiguous = s.size[dn - 1] == C && s.stride[dn - 1] == 1, one_row = true;
    int64_t expect = C;
    for (int j = dn - 2; j >= 0; --j) {
      if (s.size[j] != 1) one_row = false;
      if (D[j] != 1 && (s.size[j] != D[j] || s.stride[j] != expect)) contiguous = false;
      expect *= D[j];
    }
    if (contiguous) kinds[k] = Kind::contiguous;
    else if (s.output || !one_row) return false;
    else if (s.size[dn - 1] == 1) kinds[k] = Kind::scalar;
    else {
      kinds[k] = Kind::repeated;
      ++nrep;
    }
  }
  const int64_t R = kVecChunk / C, calls = (rows + R - 1) / R;
  const int64_t grain = std::max<int64_t>(1, ops::cpu::kParallelGrain / (R * C));
  parallel_for(0, calls, grain, [&](int64_t cb, int64_t ce) {
    std::vector<float> rep(static_cast<size_t>(nrep * R * C));
    std::vector<VecOperand> operands(srcs.size());
    std::vector<const float*> rep_of(srcs.size(), nullptr);
    int ri = 0;
    for (size_t k = 0; k < srcs.size(); ++k) {
      if (kinds[k] != Kind::repeated) continue;
      const Src& s = srcs[k];
      const float* row = static_cast<const float*>(s.t->storage()->data) + s.base;
      float* dst = rep.data() + static_cast<size_t>(ri++) * static_cast<size_t>(R * C);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) dst[r * C + c] = row[c * s.stride[dn - 1]];
      rep_of[k] = dst;
    }
    for (int64_t ci = cb; ci < ce; ++ci) {
      const int64_t r0 = ci * R, len = std::min(R, rows - r0) * C;
      for (size_t k = 0; k < srcs.size(); ++k) {
        const Src& s = srcs[k];
        VecOperand& o = operands[k];
        o = VecOperand{};
        switch (kinds[k]) {
          case Kind::computed: break;
          case Kind::contiguous: {
            float* p = static_cast<float*>(s.t->storage()->data) + s.base + r0 * C;
            if (s.output) {
              o.out = p;
              o.stream = s.stream >= 0;
            } else {
              o.in = p;
            }
            break;
          }
          case Kind::repeated: o.in = rep_of[k]; break;
          case Kind::scalar:
            o.in = static_cast<const float*>(s.t->storage()->data) + s.base;
            o.scalar = true;
            break;
        }
      }
      vm.program(prog.data(), static_cast<int>(prog.size()), operands.data(), static_cast<int>(operands.size()), len);
    }
  });
  return true;
}

}  // namespace

bool vec_region_supported(const Graph& g, const Region& r) {
  if (r.kind != RegionKind::elementwise) return false;
  for (int32_t ni : r.nodes) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    VecStep s;
    if (!decode(n, s) || g.meta(n.outputs[0]).dtype != DType::f32 || g.meta(n.outputs[0]).shape != r.domain) return false;
    for (ValueId in : n.inputs)
      if (g.meta(in).dtype != DType::f32 || !g.meta(in).device.is_cpu()) return false;
  }
  return true;
}

void run_region_vec(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const auto& vm = ops::cpu::vec_math();
  const Shape& D = r.domain;
  const int dn = D.ndim();
  const int64_t C = dn ? D[dn - 1] : 1;
  const int64_t rows = C ? D.numel() / C : 0;
  const int64_t pieces = (C + kVecChunk - 1) / kVecChunk;
  if (rows == 0 || C == 0) return;

  // Sources: region outputs and external inputs in memory, other values in scratch.
  std::vector<VecStep> steps;
  std::vector<int32_t> slot(g.values.size(), -1);  // index into srcs
  std::vector<Src> srcs;
  std::vector<char> is_out(g.values.size(), 0);
  for (ValueId o : r.outputs) is_out[static_cast<size_t>(o)] = 1;
  int nscratch = 0;
  auto mem_src = [&](ValueId v) {
    Src s;
    s.t = &vals[static_cast<size_t>(v)];
    const Shape& sh = s.t->shape();
    const Shape& st = s.t->strides();
    const int lead = dn - sh.ndim();
    for (int j = 0; j < dn; ++j) {
      s.size[j] = j < lead ? 1 : sh[j - lead];
      s.stride[j] = (j < lead || s.size[j] == 1) ? 0 : st[j - lead];
    }
    s.base = s.t->offset();
    return s;
  };
  for (int32_t ni : r.nodes) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    VecStep s;
    decode(n, s);
    steps.push_back(s);
    for (ValueId in : n.inputs)
      if (slot[static_cast<size_t>(in)] < 0) {
        slot[static_cast<size_t>(in)] = static_cast<int32_t>(srcs.size());
        srcs.push_back(mem_src(in));
      }
    const ValueId o = n.outputs[0];
    slot[static_cast<size_t>(o)] = static_cast<int32_t>(srcs.size());
    if (is_out[static_cast<size_t>(o)]) {
      Src m = mem_src(o);
      m.output = true;
      const bool contiguous_rows = dn == 0 || m.stride[dn - 1] == 1;
      if (contiguous_rows && m.t->nbytes() >= static_cast<size_t>(kStreamBytes)) m.stream = nscratch++;
      srcs.push_back(m);
    } else {
      Src sc;
      sc.scratch = nscratch++;
      srcs.push_back(sc);
    }
  }

  // The fused path (when the math table has one): every step per block of a few vectors, the
  // outputs written straight from the block. Needs outputs with contiguous rows.
  std::vector<VecStep> prog;
  bool use_program = vm.program != nullptr && srcs.size() <= static_cast<size_t>(ops::cpu::kVecProgramMaxOperands);
  for (const Src& s : srcs)
    if (s.output && dn > 0 && s.size[dn - 1] != 1 && s.stride[dn - 1] != 1) use_program = false;
  if (use_program) {
    for (size_t si = 0; si < steps.size(); ++si) {
      const Node& n = g.nodes[static_cast<size_t>(r.nodes[si])];
      VecStep ps = steps[si];
      ps.in0 = static_cast<int16_t>(slot[static_cast<size_t>(n.inputs[0])]);
      if (n.inputs.size() > 1) ps.in1 = static_cast<int16_t>(slot[static_cast<size_t>(n.inputs[1])]);
      ps.out = static_cast<int16_t>(slot[static_cast<size_t>(n.outputs[0])]);
      prog.push_back(ps);
    }
  }

  if (use_program && dn >= 2 && rows > 1 && 2 * C <= kVecChunk && run_rows_program(vm, D, srcs, prog)) return;

  const int64_t items = rows * pieces;
  const int64_t grain = std::max<int64_t>(1, ops::cpu::kParallelGrain / std::min<int64_t>(C, kVecChunk));
  parallel_for(0, items, grain, [&](int64_t ib, int64_t ie) {
    // Chunk buffers: one per scratch value, 3 temporaries for scalar operands, and one per
    // source for gathering strided rows.
    std::vector<float> scratch(static_cast<size_t>((nscratch + 3) * kVecChunk) + srcs.size() * kVecChunk);
    float* tmp = scratch.data() + static_cast<size_t>(nscratch) * kVecChunk;
    float* gather = tmp + 3 * kVecChunk;
    std::vector<float*> ptr(srcs.size());
    std::vector<char> scalar(srcs.size());
    std::vector<VecOperand> operands(use_program ? srcs.size() : 0);
    int64_t idx[kMaxDims];
    for (int64_t it = ib; it < ie; ++it) {
      const int64_t row = it / pieces, c0 = (it % pieces) * kVecChunk, len = std::min<int64_t>(kVecChunk, C - c0);
      int64_t rest = row;
      for (int j = dn - 2; j >= 0; --j) {
        idx[j] = rest % D[j];
        rest /= D[j];
      }
      int ntmp = 0;
      // Pointers for memory sources (gathering strided rows into temporaries).
      auto resolve = [&](size_t k) {
        Src& s = srcs[k];
        if (s.stream >= 0) {
          ptr[k] = scratch.data() + static_cast<size_t>(s.stream) * kVecChunk;
          scalar[k] = 0;
          return;
        }
        if (s.scratch >= 0) {
          ptr[k] = scratch.data() + static_cast<size_t>(s.scratch) * kVecChunk;
          scalar[k] = 0;
          return;
        }
        int64_t off = s.base;
        for (int j = 0; j < dn - 1; ++j) off += idx[j] * s.stride[j];
        float* base = static_cast<float*>(s.t->storage()->data) + off;
        const int64_t ls = dn ? s.stride[dn - 1] : 0;
        if (dn == 0 || s.size[dn - 1] == 1) {
          ptr[k] = base;
          scalar[k] = 1;
        } else if (ls == 1) {
          ptr[k] = base + c0;
          scalar[k] = 0;
        } else {
          float* t = gather + k * kVecChunk;
          for (int64_t i = 0; i < len; ++i) t[i] = base[(c0 + i) * ls];
          ptr[k] = t;
          scalar[k] = 0;
        }
      };
      if (use_program) {
        for (size_t k = 0; k < srcs.size(); ++k) {
          const Src& s = srcs[k];
          VecOperand& o = operands[k];
          o = VecOperand{};
          if (s.output) {
            int64_t off = s.base + (dn && s.size[dn - 1] != 1 ? c0 : 0);
            for (int j = 0; j < dn - 1; ++j) off += idx[j] * s.stride[j];
            o.out = static_cast<float*>(s.t->storage()->data) + off;
            o.stream = s.stream >= 0;
          } else if (s.scratch < 0) {
            resolve(k);
            o.in = ptr[k];
            o.scalar = scalar[k] != 0;
          }
        }
        vm.program(prog.data(), static_cast<int>(prog.size()), operands.data(), static_cast<int>(operands.size()), len);
        continue;
      }
      for (size_t k = 0; k < srcs.size(); ++k) resolve(k);
      for (size_t si = 0; si < steps.size(); ++si) {
        const Node& n = g.nodes[static_cast<size_t>(r.nodes[si])];
        const VecStep& s = steps[si];
        const size_t ok = static_cast<size_t>(slot[static_cast<size_t>(n.outputs[0])]);
        float* out = ptr[ok];
        auto vec_in = [&](ValueId v) -> const float* {  // a scalar operand expanded to a chunk
          const size_t k = static_cast<size_t>(slot[static_cast<size_t>(v)]);
          if (!scalar[k]) return ptr[k];
          float* t = tmp + static_cast<size_t>(ntmp++ % 3) * kVecChunk;
          std::fill(t, t + len, *ptr[k]);
          return t;
        };
        if (s.kind == VecStepKind::binary) {
          const size_t ky = static_cast<size_t>(slot[static_cast<size_t>(n.inputs[1])]);
          const float* x = vec_in(n.inputs[0]);
          const bool ys = scalar[ky] != 0;
          vm.get(s.bin)(out, x, ptr[ky], ys, s.alpha, len);
        } else {
          const float* x = vec_in(n.inputs[0]);
          switch (s.kind) {
            case VecStepKind::unary: vm.get(s.un)(out, x, len); break;
            case VecStepKind::neg: for (int64_t i = 0; i < len; ++i) out[i] = -x[i]; break;
            case VecStepKind::abs: for (int64_t i = 0; i < len; ++i) out[i] = std::fabs(x[i]); break;
            case VecStepKind::sqrt: for (int64_t i = 0; i < len; ++i) out[i] = std::sqrt(x[i]); break;
            case VecStepKind::rsqrt: for (int64_t i = 0; i < len; ++i) out[i] = 1.0f / std::sqrt(x[i]); break;
            case VecStepKind::recip: for (int64_t i = 0; i < len; ++i) out[i] = 1.0f / x[i]; break;
            default: std::copy(x, x + len, out); break;
          }
        }
      }
      for (size_t k = 0; k < srcs.size(); ++k) {
        const Src& s = srcs[k];
        if (s.stream < 0) continue;
        int64_t off = s.base + c0;
        for (int j = 0; j < dn - 1; ++j) off += idx[j] * s.stride[j];
        stream_out(static_cast<float*>(s.t->storage()->data) + off, ptr[k], len);
      }
    }
    _mm_sfence();
  });
}

}  // namespace tpu::graph
