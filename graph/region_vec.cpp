#include "graph/region_vec.h"

#include <algorithm>

#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "tpucore/core/error.h"
#include "tpucore/core/parallel.h"

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

// Outputs at least this big are written with non-temporal stores.
constexpr int64_t kStreamBytes = 4 << 20;

// A program operand: an external input or a region output in memory (sizes and strides
// aligned to the domain rank, broadcast dims with stride 0), or a value computed per block.
struct Src {
  bool computed = false;
  bool output = false;
  bool stream = false;
  const Tensor* t = nullptr;
  int64_t size[kMaxDims], stride[kMaxDims];
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
    if (s.computed && !s.output) continue;
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
              o.stream = s.stream;
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
      ops::cpu::run_vec_program(vm, prog.data(), static_cast<int>(prog.size()), operands.data(),
                                static_cast<int>(operands.size()), len);
    }
  });
  return true;
}

}  // namespace

bool vec_region_supported(const Graph& g, const Region& r) {
  if (r.kind != RegionKind::elementwise) return false;
  std::vector<ValueId> operands;
  for (int32_t ni : r.nodes) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    VecStep s;
    if (!decode(n, s) || g.meta(n.outputs[0]).dtype != DType::f32 || g.meta(n.outputs[0]).shape != r.domain) return false;
    for (ValueId in : n.inputs) {
      if (g.meta(in).dtype != DType::f32 || !g.meta(in).device.is_cpu()) return false;
      operands.push_back(in);
    }
    operands.push_back(n.outputs[0]);
  }
  std::sort(operands.begin(), operands.end());
  const auto distinct = std::unique(operands.begin(), operands.end()) - operands.begin();
  return distinct <= ops::cpu::kVecProgramMaxOperands;
}

void run_region_vec(const Graph& g, const Region& r, std::vector<Tensor>& vals) {
  const auto& vm = ops::cpu::vec_math();
  const Shape& D = r.domain;
  const int dn = D.ndim();
  const int64_t C = dn ? D[dn - 1] : 1;
  const int64_t rows = C ? D.numel() / C : 0;
  if (rows == 0 || C == 0) return;

  // The program: one operand per external input, region output and computed value.
  std::vector<VecStep> prog;
  std::vector<int32_t> slot(g.values.size(), -1);  // value -> operand
  std::vector<Src> srcs;
  std::vector<char> is_out(g.values.size(), 0);
  for (ValueId o : r.outputs) is_out[static_cast<size_t>(o)] = 1;
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
  auto operand = [&](ValueId v) { return static_cast<int16_t>(slot[static_cast<size_t>(v)]); };
  for (int32_t ni : r.nodes) {
    const Node& n = g.nodes[static_cast<size_t>(ni)];
    VecStep s;
    decode(n, s);
    for (ValueId in : n.inputs)
      if (slot[static_cast<size_t>(in)] < 0) {
        slot[static_cast<size_t>(in)] = static_cast<int32_t>(srcs.size());
        srcs.push_back(mem_src(in));
      }
    const ValueId o = n.outputs[0];
    slot[static_cast<size_t>(o)] = static_cast<int32_t>(srcs.size());
    Src d;
    if (is_out[static_cast<size_t>(o)]) {
      d = mem_src(o);
      TPU_CHECK(d.t->is_contiguous(), "internal: region output {} is not contiguous", o);
      d.output = true;
      d.stream = d.t->nbytes() >= static_cast<size_t>(kStreamBytes);
    }
    d.computed = true;
    srcs.push_back(d);
    s.in0 = operand(n.inputs[0]);
    if (n.inputs.size() > 1) s.in1 = operand(n.inputs[1]);
    s.out = operand(o);
    prog.push_back(s);
  }

  if (dn >= 2 && rows > 1 && 2 * C <= kVecChunk && run_rows_program(vm, D, srcs, prog)) return;

  // Otherwise one call per row piece, strided inputs gathered into per-thread buffers (outputs
  // are the executor's fresh contiguous buffers). Pieces are at most kVecChunk values when an
  // input needs gathering, else up to kVecChunkLong: fewer calls, so less per-call setup.
  bool gathers = false;
  for (const Src& s : srcs)
    if (!s.computed && dn && s.size[dn - 1] != 1 && s.stride[dn - 1] != 1) gathers = true;
  const int64_t chunk = gathers ? kVecChunk : kVecChunkLong;
  const int64_t pieces = (C + chunk - 1) / chunk;
  const int64_t items = rows * pieces;
  const int64_t grain = std::max<int64_t>(1, ops::cpu::kParallelGrain / std::min<int64_t>(C, chunk));
  parallel_for(0, items, grain, [&](int64_t ib, int64_t ie) {
    std::vector<float> buf(gathers ? srcs.size() * static_cast<size_t>(kVecChunk) : 0);
    std::vector<VecOperand> operands(srcs.size());
    int64_t idx[kMaxDims];
    for (int64_t it = ib; it < ie; ++it) {
      const int64_t row = it / pieces, c0 = (it % pieces) * chunk, len = std::min<int64_t>(chunk, C - c0);
      int64_t rest = row;
      for (int j = dn - 2; j >= 0; --j) {
        idx[j] = rest % D[j];
        rest /= D[j];
      }
      for (size_t k = 0; k < srcs.size(); ++k) {
        const Src& s = srcs[k];
        VecOperand& o = operands[k];
        o = VecOperand{};
        if (s.computed && !s.output) continue;
        int64_t off = s.base;
        for (int j = 0; j < dn - 1; ++j) off += idx[j] * s.stride[j];
        float* base = static_cast<float*>(s.t->storage()->data) + off;
        const int64_t ls = dn ? s.stride[dn - 1] : 0;
        if (s.output) {
          o.out = dn == 0 || s.size[dn - 1] == 1 ? base : base + c0;
          o.stream = s.stream;
        } else if (dn == 0 || s.size[dn - 1] == 1) {
          o.in = base;
          o.scalar = true;
        } else if (ls == 1) {
          o.in = base + c0;
        } else {
          float* tmp = buf.data() + k * static_cast<size_t>(kVecChunk);  // gathers: chunk == kVecChunk
          for (int64_t i = 0; i < len; ++i) tmp[i] = base[(c0 + i) * ls];
          o.in = tmp;
        }
      }
      ops::cpu::run_vec_program(vm, prog.data(), static_cast<int>(prog.size()), operands.data(),
                                static_cast<int>(operands.size()), len);
    }
  });
}

}  // namespace tpu::graph
