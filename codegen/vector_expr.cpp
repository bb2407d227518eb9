#include "codegen/vector_expr.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/isa.h"
#include "tpucore/core/error.h"

namespace tpu::codegen {

using sim::Op;
using B = sim::ProgramBuilder;

VecRef VecExpr::input(int i) {
  if (i >= num_inputs) num_inputs = i + 1;
  return {VecRef::Kind::input, i, 0};
}
VecRef VecExpr::op(Op o, VecRef a) {
  steps.push_back({o, {a, {}, {}}, 1});
  return {VecRef::Kind::temp, int(steps.size()) - 1, 0};
}
VecRef VecExpr::op(Op o, VecRef a, VecRef b) {
  steps.push_back({o, {a, b, {}}, 2});
  return {VecRef::Kind::temp, int(steps.size()) - 1, 0};
}
VecRef VecExpr::op(Op o, VecRef a, VecRef b, VecRef c) {
  steps.push_back({o, {a, b, c}, 3});
  return {VecRef::Kind::temp, int(steps.size()) - 1, 0};
}

VecRef VecExpr::round_bf16(VecRef a) {
  if (a.kind == VecRef::Kind::temp && steps[size_t(a.index)].round_bf16) return a;
  if (a.kind == VecRef::Kind::imm) {
    a.value = sim::round_to_bf16(a.value);
    return a;
  }
  steps.push_back({Op::vmov, {a, {}, {}}, 1, true});
  return {VecRef::Kind::temp, int(steps.size()) - 1, 0};
}

static std::string ref_key(const VecRef& r) {
  switch (r.kind) {
    case VecRef::Kind::input: return fmt::format("i{}", r.index);
    case VecRef::Kind::temp: return fmt::format("t{}", r.index);
    case VecRef::Kind::imm: return fmt::format("#{:a}", r.value);
  }
  return "?";
}

std::string VecExpr::key() const {
  std::string s = fmt::format("n{}:", num_inputs);
  for (const VecStep& st : steps) {
    s += st.round_bf16 ? "round_bf16" : sim::op_info(st.op).name;
    for (int i = 0; i < st.nsrc; ++i) (s += ',') += ref_key(st.src[size_t(i)]);
    s += ";";
  }
  (s += '=') += ref_key(result);
  for (const VecRef& r : extra_results) (s += ',') += ref_key(r);
  return s;
}

VecRef vec_sigmoid(VecExpr& e, VecRef x) {
  VecRef t = e.op(Op::vneg, x);
  t = e.op(Op::vexp, t);
  t = e.op(Op::vadd, t, VecExpr::imm(1.0f));
  return e.op(Op::vrecip, t);
}

VecRef vec_silu(VecExpr& e, VecRef x) { return e.op(Op::vmul, x, vec_sigmoid(e, x)); }

VecRef vec_gelu(VecExpr& e, VecRef x, bool tanh_approx) {
  VecRef inner;
  if (tanh_approx) {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    VecRef x2 = e.op(Op::vmul, x, x);
    VecRef p = e.op(Op::vfma, x2, VecExpr::imm(0.044715f), VecExpr::imm(1.0f));
    VecRef u = e.op(Op::vmul, x, p);
    u = e.op(Op::vmul, u, VecExpr::imm(0.7978845608028654f));
    inner = e.op(Op::vtanh, u);
  } else {
    VecRef u = e.op(Op::vmul, x, VecExpr::imm(0.7071067811865476f));
    inner = e.op(Op::verf, u);
  }
  VecRef h = e.op(Op::vmul, x, VecExpr::imm(0.5f));
  return e.op(Op::vfma, h, inner, h);  // h * inner + h
}

VecRef vec_not(VecExpr& e, VecRef x) { return e.op(Op::vsub, VecExpr::imm(1.0f), x); }

namespace {

// Slot assignment with reuse: slot of each step's result, and of each cast input.
struct SlotPlan {
  std::vector<int> step_slot, input_slot;
  int slots = 0;
};

SlotPlan plan_slots(const VecExpr& e, const std::vector<sim::DType>& input_dtypes) {
  SlotPlan p;
  p.input_slot.assign(size_t(e.num_inputs), -1);
  for (int i = 0; i < e.num_inputs; ++i)
    if (size_t(i) < input_dtypes.size() && !vpu_readable(input_dtypes[size_t(i)])) p.input_slot[size_t(i)] = p.slots++;
  const int n = int(e.steps.size());
  std::vector<int> last(size_t(n), -1);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < e.steps[size_t(i)].nsrc; ++j) {
      const VecRef& r = e.steps[size_t(i)].src[size_t(j)];
      if (r.kind == VecRef::Kind::temp) last[size_t(r.index)] = i;
    }
  if (e.result.kind == VecRef::Kind::temp) last[size_t(e.result.index)] = n;
  for (const VecRef& r : e.extra_results)
    if (r.kind == VecRef::Kind::temp) last[size_t(r.index)] = n;
  std::vector<int> free_slots;
  p.step_slot.assign(size_t(n), -1);
  for (int i = 0; i < n; ++i) {
    // Sources whose last use is this step give their slot back first: elementwise ops may
    // write in place.
    for (int j = 0; j < e.steps[size_t(i)].nsrc; ++j) {
      const VecRef& r = e.steps[size_t(i)].src[size_t(j)];
      if (r.kind == VecRef::Kind::temp && last[size_t(r.index)] == i && p.step_slot[size_t(r.index)] >= 0) {
        free_slots.push_back(p.step_slot[size_t(r.index)]);
        p.step_slot[size_t(r.index)] = -2 - p.step_slot[size_t(r.index)];  // freed, remember it
      }
    }
    if (last[size_t(i)] < 0) continue;  // dead step: not emitted
    if (!free_slots.empty()) {
      p.step_slot[size_t(i)] = free_slots.back();
      free_slots.pop_back();
    } else {
      p.step_slot[size_t(i)] = p.slots++;
    }
  }
  return p;
}

int slot_of(const SlotPlan& p, int step) {
  const int s = p.step_slot[size_t(step)];
  return s >= 0 ? s : -2 - s;
}

}  // namespace

int vec_temp_slots(const VecExpr& e, const std::vector<sim::DType>& input_dtypes) {
  return std::max(1, plan_slots(e, input_dtypes).slots);
}

void emit_vec_expr(sim::ProgramBuilder& b, const VecExpr& e, const std::vector<sim::Operand>& inputs,
                   const sim::Operand& dst, const TempArena& arena, int64_t rows, int64_t cols) {
  emit_vec_expr(b, e, inputs, std::vector<sim::Operand>{dst}, arena, rows, cols);
}

void emit_vec_expr(sim::ProgramBuilder& b, const VecExpr& e, const std::vector<sim::Operand>& inputs,
                   const std::vector<sim::Operand>& dsts, const TempArena& arena, int64_t rows, int64_t cols) {
  std::vector<VecRef> results{e.result};
  results.insert(results.end(), e.extra_results.begin(), e.extra_results.end());
  TPU_CHECK(dsts.size() == results.size(), "internal: codegen: expression has {} results, {} destinations",
            results.size(), dsts.size());
  std::vector<sim::DType> dts;
  for (const sim::Operand& o : inputs) dts.push_back(o.dtype);
  const SlotPlan p = plan_slots(e, dts);
  TPU_CHECK(p.slots <= arena.slots, "internal: codegen: expression needs {} temporaries, {} planned", p.slots, arena.slots);
  auto slot = [&](int s) {
    sim::Operand o = B::vmem(B::at(arena.base + s * arena.slot_bytes), sim::DType::f32, arena.ld);
    return o;
  };
  std::vector<sim::Operand> ins = inputs;
  for (int i = 0; i < e.num_inputs; ++i)
    if (p.input_slot[size_t(i)] >= 0) {
      b.unary(Op::vcast, slot(p.input_slot[size_t(i)]), inputs[size_t(i)], rows, cols);
      ins[size_t(i)] = slot(p.input_slot[size_t(i)]);
    }
  const int n = int(e.steps.size());
  // Which result destination each step writes directly (-1: its temporary).
  std::vector<int> read_after(size_t(n), -1);  // last live step reading temp i
  for (int i = 0; i < n; ++i)
    if (p.step_slot[size_t(i)] != -1)
      for (int j = 0; j < e.steps[size_t(i)].nsrc; ++j) {
        const VecRef& r = e.steps[size_t(i)].src[size_t(j)];
        if (r.kind == VecRef::Kind::temp) read_after[size_t(r.index)] = i;
      }
  std::vector<int> direct_to(size_t(n), -1);
  for (size_t k = 0; k < results.size(); ++k) {
    const VecRef& r = results[k];
    if (r.kind != VecRef::Kind::temp || direct_to[size_t(r.index)] >= 0 || !vpu_readable(dsts[k].dtype)) continue;
    if (dsts[k].dtype == sim::DType::f32 || read_after[size_t(r.index)] < 0) direct_to[size_t(r.index)] = int(k);
  }
  auto operand = [&](const VecRef& r) -> sim::Operand {
    switch (r.kind) {
      case VecRef::Kind::input: return ins[size_t(r.index)];
      case VecRef::Kind::temp:
        if (direct_to[size_t(r.index)] >= 0) return dsts[size_t(direct_to[size_t(r.index)])];  // f32 (or not read)
        return slot(slot_of(p, r.index));
      case VecRef::Kind::imm: return B::imm(r.value);
    }
    return B::imm(0);
  };
  for (int i = 0; i < n; ++i) {
    if (p.step_slot[size_t(i)] == -1) continue;
    const VecStep& st = e.steps[size_t(i)];
    const sim::Operand d = operand({VecRef::Kind::temp, i, 0});
    if (st.round_bf16) {
      // Stored into a bf16 destination, the store rounds. Else through a bf16 view of the
      // destination itself (each element's two bytes inside its own four, so the narrowing
      // and the widening both run in place), then back to f32.
      if (d.dtype == sim::DType::bf16) {
        b.unary(Op::vmov, d, operand(st.src[0]), rows, cols);
        continue;
      }
      sim::Operand half = d;
      half.dtype = sim::DType::bf16;
      half.row_stride = (d.row_stride < 0 ? cols : d.row_stride) * 2;
      half.col_stride *= 2;
      b.unary(Op::vmov, half, operand(st.src[0]), rows, cols);
      b.unary(Op::vmov, d, half, rows, cols);
      continue;
    }
    if (st.nsrc == 1) b.unary(st.op, d, operand(st.src[0]), rows, cols);
    else if (st.nsrc == 2) b.binary(st.op, d, operand(st.src[0]), operand(st.src[1]), rows, cols);
    else b.ternary(st.op, d, operand(st.src[0]), operand(st.src[1]), operand(st.src[2]), rows, cols);
  }
  // Results not written by their step: copies (converted) first, then immediates (which may
  // go through slot 0).
  for (size_t k = 0; k < results.size(); ++k) {
    const VecRef& r = results[k];
    if (r.kind == VecRef::Kind::imm || (r.kind == VecRef::Kind::temp && direct_to[size_t(r.index)] == int(k))) continue;
    const sim::Operand src = operand(r);
    const bool direct = vpu_readable(dsts[k].dtype);
    b.unary(src.dtype == dsts[k].dtype && direct ? Op::vmov : Op::vcast, dsts[k], src, rows, cols);
  }
  for (size_t k = 0; k < results.size(); ++k) {
    const VecRef& r = results[k];
    if (r.kind != VecRef::Kind::imm) continue;
    if (vpu_readable(dsts[k].dtype)) {
      b.fill(dsts[k], r.value, rows, cols);
      continue;
    }
    b.fill(slot(0), r.value, rows, cols);
    b.unary(Op::vcast, dsts[k], slot(0), rows, cols);
  }
}

}  // namespace tpu::codegen
