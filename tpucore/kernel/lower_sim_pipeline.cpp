// The block pipeline of the chip lowering: input blocks come in by DMA into a ring of VMEM
// slots, the copies of the next steps' blocks issued ahead so the DMA latency overlaps the
// compute of the steps before; output blocks stay resident and go back by DMA when their block
// index changes, waited on only when their buffer is reused. Then the program's scheduler
// (schedule_kernel_program): peepholes and a list scheduler that interleaves the dependent
// chains of independent grid steps on the chip's units.
#include "tpucore/kernel/lower_sim_impl.h"

#include <cmath>

#include "sim/region.h"

namespace tpu::kernel::detail::chip_lowering {

// One DMA of a block's part inside its array, between HBM (the operand's register + offset) and VMEM.
void SimLowerer::dma_block(bool to_hbm, int operand_reg, const BlockPlace& p, const TensorType& t, int64_t vmem, int sem,
                           int64_t vmem_cols) {
  const int64_t es = psize(t.dtype);
  const std::vector<int64_t> st = strides_of(t.shape);
  int64_t off = 0;
  for (size_t d = 0; d < p.start.size(); ++d) off += p.start[d] * st[d];
  const size_t r = p.block.size();
  const Dims2 bd = dims2(p.block, k_.name);
  const int64_t vstride = (vmem_cols > 0 ? vmem_cols : bd.cols) * es;  // VMEM bytes per block row
  int64_t vrows = 1, vcols = 1, row_stride = bd.cols;
  if (r >= 1) {
    const int cd = p.array_dim[r - 1];
    TPU_CHECK(st[static_cast<size_t>(cd)] == 1, "kernel '{}': a block whose last dim is not the array's last dim is not lowered", k_.name);
    vcols = std::min(bd.cols, t.shape[cd] - p.start[static_cast<size_t>(cd)]);
  }
  if (r == 2) {
    const int rd = p.array_dim[0];
    vrows = std::min(bd.rows, t.shape[rd] - p.start[static_cast<size_t>(rd)]);
    row_stride = st[static_cast<size_t>(rd)];
  }
  const sim::DmaShape shape{.planes = 1, .rows = vrows, .row_bytes = vcols * es,
                            .dst_plane_stride = -1, .dst_row_stride = to_hbm ? row_stride * es : vstride,
                            .src_plane_stride = -1, .src_row_stride = to_hbm ? vstride : row_stride * es};
  const sim::Operand h = B::hbm_at(B::at(off * es, {{static_cast<int16_t>(operand_reg), 1}}));
  const sim::Operand v = B::vmem_at(B::at(vmem));
  const int queue = operand_reg % std::max(1, cfg_.dma.engines);
  if (to_hbm) b_.dma(h, v, shape, queue, sem);
  else b_.dma(v, h, shape, queue, sem);
}

Value SimLowerer::load(Ref::Kind kind, int index, double fill) {
  settle();
  const size_t i = static_cast<size_t>(index);
  if (kind == Ref::Kind::scratch) return scr_[i].value;
  if (kind == Ref::Kind::output) {
    const OutputState& o = outs_[i];
    const TensorType& t = s_.out_types[i];
    Value v = make(o.place.block, t.dtype);
    const Dims2 d = dims2(o.place.block, k_.name);
    b_.unary(Op::vmov, dst(v), dst_at(o.slot[o.cur], t.dtype, d), d.rows, d.cols);
    return v;
  }
  InputState& in = ins_[i];
  const BlockPlace& p = s_.in_place[i];
  in.used = true;
  if (in.cur >= 0 && in.index == p.block_index && in.fill == fill) return in.value;
  end_body();  // deferred dots read their blocks before a DMA may reuse a slot
  // An input's first load: the copy of its next block goes out before this one is waited for
  // (the rest after the step, in step order with the other inputs').
  if (in.cur < 0) {
    size_t k = 0;
    while (k < in.pend.size() && !(in.pend[k].index == p.block_index && in.pend[k].fill == fill)) ++k;
    if (k < in.pend.size()) look_ahead(i, steps_after(s_.grid_index), p.block_index, k + 1, fill, 1);
  }
  end_body();  // deferred dots read their blocks before a DMA may reuse a slot
  int slot = -1;
  while (slot < 0 && !in.pend.empty()) {  // prefetched blocks in order: this step's, or ones the body skipped
    const InputState::Pending e = in.pend.front();
    in.pend.pop_front();
    b_.wait(index);
    if (e.index == p.block_index && e.fill == fill) slot = e.slot;
  }
  if (slot < 0) {
    slot = free_input_slot(i);
    issue_load(i, slot, p, fill);
    b_.wait(index);
  }
  auto impl = std::make_shared<Value::Impl>();
  impl->vmem = in.slot[static_cast<size_t>(slot)];
  in.value = Value(p.block, s_.in_types[i].dtype, std::move(impl));
  in.cur = slot;
  in.index = p.block_index;
  in.fill = fill;
  return in.value;
}

// A slot of input i neither holding the current block nor written by a pending DMA (-1 if none),
// taken round the ring so the slot reused is the one read longest ago.
int SimLowerer::free_input_slot(size_t i) {
  InputState& in = ins_[i];
  const int n = static_cast<int>(in.slot.size());
  for (int t = 0; t < n; ++t) {
    const int s = (in.next + t) % n;
    if (s == in.cur) continue;
    bool busy = false;
    for (const auto& e : in.pend) busy |= e.slot == s;
    if (busy) continue;
    in.next = (s + 1) % n;
    return s;
  }
  return -1;
}

// The block at `p` into input i's `slot` (filled first where it is ragged), on its semaphore.
void SimLowerer::issue_load(size_t i, int slot, const BlockPlace& p, double fill) {
  const TensorType& t = s_.in_types[i];
  const int64_t at = ins_[i].slot[static_cast<size_t>(slot)];
  const Dims2 d = dims2(p.block, k_.name);
  bool ragged = false;
  for (size_t a = 0; a < p.block.size(); ++a) {
    const int ad = p.array_dim[a];
    ragged |= p.start[static_cast<size_t>(ad)] + p.block[a] > t.shape[ad];
  }
  if (ragged && t.dtype == DType::i8) unsupported("a ragged i8 block");
  if (ragged) b_.fill(dst_at(at, t.dtype, d), static_cast<float>(round_to(t.dtype, fill)), d.rows, d.cols);
  dma_block(false, static_cast<int>(i), p, t, at, static_cast<int>(i));
}

// After step g: the blocks the next steps read of the inputs the body loads, up to depth - 1
// blocks ahead of the current one, each into a free slot of the ring, so their DMAs (latency and
// transfer) overlap the compute of the steps before them (Pallas' pipelining, deeper).
void SimLowerer::prefetch(std::span<const int64_t> g) {
  const std::vector<Index> steps = steps_after(g);
  // One block more per input and round: the copies go out in the order the steps need them
  // (DMAs take HBM bandwidth in issue order).
  for (int round = 1; round < depth_; ++round)
    for (size_t i = 0; i < ins_.size(); ++i) {
      InputState& in = ins_[i];
      if (in.used && in.cur >= 0) look_ahead(i, steps, in.index, 0, in.fill, 1);
    }
}

std::vector<Index> SimLowerer::steps_after(std::span<const int64_t> g) const {
  std::vector<Index> steps;
  Index next(g.begin(), g.end());
  for (int w = 0; w < kMaxLookahead; ++w) {
    size_t d = next.size();
    while (d-- > 0) {
      if (++next[d] < k_.grid[d]) break;
      next[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) break;  // past the last step
    steps.push_back(next);
  }
  return steps;
}

// Input i's blocks of `steps` after the block `last` (the pending copies from the k-th on are
// the ones still to be matched), up to depth - 1 blocks ahead, each into a free slot.
void SimLowerer::look_ahead(size_t i, const std::vector<Index>& steps, Index last, size_t k, double fill, int max_new) {
  InputState& in = ins_[i];
  int issued = 0;
  const std::string who = spec_name(k_.in_specs[i], "input", i);
  for (const Index& st : steps) {
    if (k + 1 >= static_cast<size_t>(depth_)) break;
    BlockPlace p = place_of(k_, k_.in_specs[i], s_.in_types[i], who, st, &sc_);
    if (p.block_index == last) continue;
    last = p.block_index;
    if (k < in.pend.size()) {
      if (in.pend[k].index != p.block_index || in.pend[k].fill != fill) break;  // not the order foreseen
      ++k;
      continue;
    }
    if (issued >= max_new) break;
    const int slot = free_input_slot(i);
    if (slot < 0) break;
    issue_load(i, slot, p, fill);
    in.pend.push_back({slot, p.block_index, fill});
    ++k;
    ++issued;
  }
}

void SimLowerer::flush(size_t i) {
  OutputState& o = outs_[i];
  if (!o.resident) return;
  const int sem = static_cast<int>(s_.in_types.size() + i);
  dma_block(true, static_cast<int>(s_.in_types.size() + i), o.place, s_.out_types[i], o.slot[o.cur], sem);
  o.pending[o.cur] = true;
  o.resident = false;
}

void SimLowerer::begin_step(std::span<const int64_t> g) {
  s_.grid_index.assign(g.begin(), g.end());
  // This step's values after the last step's, back at the base when less than twice the most a
  // step took is left below the constants' quarter of VMEM.
  largest_step_ = std::max(largest_step_, temp_top_ - step_start_);
  const int64_t limit = static_cast<int64_t>(cfg_.memory.vmem_bytes) / 4 * 3;
  if (!rotate_ || temp_top_ + 2 * largest_step_ + 64 > limit) temp_top_ = temp_base_;
  temp_top_ = (temp_top_ + 63) / 64 * 64;
  step_start_ = temp_top_;
  for (size_t i = 0; i < s_.in_types.size(); ++i)
    if (!is_any(k_.in_specs[i])) s_.in_place[i] = place_of(k_, k_.in_specs[i], s_.in_types[i], spec_name(k_.in_specs[i], "input", i), g, &sc_);
  // Before the first step: the first blocks of every input are copied at once (with the default
  // fill), so their DMAs overlap instead of each load waiting for its own in turn ...
  const bool first = std::all_of(g.begin(), g.end(), [](int64_t x) { return x == 0; });
  for (size_t i = 0; first && i < s_.in_types.size(); ++i) {
    InputState& in = ins_[i];
    if (is_any(k_.in_specs[i]) || in.cur >= 0 || !in.pend.empty()) continue;
    const int slot = free_input_slot(i);
    if (slot < 0) continue;
    issue_load(i, slot, s_.in_place[i], 0.0);
    in.pend.push_back({slot, s_.in_place[i].block_index, 0.0});
  }
  // ... and the blocks of the next steps, in step order across the inputs.
  if (first) {
    const std::vector<Index> steps = steps_after(g);
    for (int round = 1; round < depth_; ++round)
      for (size_t i = 0; i < s_.in_types.size(); ++i) {
        InputState& in = ins_[i];
        if (!is_any(k_.in_specs[i]) && in.cur < 0 && !in.pend.empty())
          look_ahead(i, steps, in.pend.front().index, 1, 0.0, 1);
      }
  }
  for (size_t i = 0; i < s_.out_types.size(); ++i) {
    if (is_any(k_.out_specs[i])) continue;
    BlockPlace p = place_of(k_, k_.out_specs[i], s_.out_types[i], spec_name(k_.out_specs[i], "output", i), g, &sc_);
    OutputState& o = outs_[i];
    if (o.resident && p.block_index == o.place.block_index) continue;
    const bool had = o.resident;
    flush(i);
    if (had) o.cur = (o.cur + 1) % static_cast<int>(o.slot.size());
    if (o.pending[o.cur]) {  // the write-back of this buffer's previous block
      b_.wait(static_cast<int>(s_.in_types.size() + i));
      o.pending[o.cur] = false;
    }
    const Dims2 d = dims2(p.block, k_.name);
    b_.fill(dst_at(o.slot[o.cur], s_.out_types[i].dtype, d), 0.0f, d.rows, d.cols);
    o.place = std::move(p);
    o.resident = true;
    s_.out_place[i] = o.place;
  }
}

}  // namespace tpu::kernel::detail::chip_lowering

namespace tpu::kernel::detail::chip_lowering {

namespace {

// What one instruction of a kernel program touches in VMEM and on which unit it runs, for the
// scheduler below.
struct SchedInstr {
  std::vector<sim::Region> rd, wr;
  bool ordered = false;  // scalar, DMA, wait: kept in program order among themselves
  bool barrier = false;  // wait / fence: compute after it stays after it
  int unit = -1;         // timeline of a compute instruction (-1: none)
  int mxu = -1;          // mxu.lw / mxu.mm: the MXU (its weight buffers are state, kept in order)
};

sim::Region sched_region(const sim::Operand& o, std::array<int64_t, 2> shape) {
  const int64_t es = sim::dtype_size(o.dtype);
  sim::Region r;
  r.space = o.space;
  r.base = static_cast<uint64_t>(o.addr.offset);
  if (o.col_stride == 1) {
    r.run = static_cast<uint64_t>(shape[1] * es);
    r.n1 = static_cast<uint64_t>(shape[0]);
    r.s1 = static_cast<uint64_t>(o.row_stride * es);
  } else {
    r.run = static_cast<uint64_t>(es);
    r.n1 = static_cast<uint64_t>(shape[1]);
    r.s1 = static_cast<uint64_t>(o.col_stride * es);
    r.n0 = static_cast<uint64_t>(shape[0]);
    r.s0 = static_cast<uint64_t>(o.row_stride * es);
  }
  r.normalize();
  return r;
}

bool sched_conflict(const SchedInstr& a, const SchedInstr& b) {
  auto any = [](const std::vector<sim::Region>& x, const std::vector<sim::Region>& y) {
    for (const sim::Region& p : x)
      for (const sim::Region& q : y)
        if (p.space == q.space && p.lo() < q.hi() && q.lo() < p.hi() && sim::regions_overlap(p, q)) return true;
    return false;
  };
  return any(a.wr, b.rd) || any(a.rd, b.wr) || any(a.wr, b.wr);
}

}  // namespace

// List scheduling of a kernel program (what a compiler's scheduler does for the unrolled grid):
// the units run their instructions in program order, so a chain of dependent operations (a
// matmul's result, then a row max, then an exp...) leaves every unit idle while it waits for the
// one before. The instructions are reordered, each only after every earlier one it depends on
// (through the VMEM bytes they read and write, a MXU's weight buffers, a wait before it), picking
// among the next few ready ones the one an estimate of the chip's timeline starts first, so the
// independent chains of other grid steps fill the gaps. DMAs and waits keep their order.
// What instruction `in` touches and where it runs; false for what is not reordered (loops,
// register-relative VMEM addresses, scalar loads).
bool sched_classify(const sim::Instr& in, SchedInstr& s) {
  const int vpu = 0, eup = 1, xlu = 2, mxu0 = 3;
  const sim::OpInfo& info = sim::op_info(in.op);
  for (const sim::Operand* o : {&in.dst, &in.a, &in.b, &in.c})
    if (o->kind == sim::Operand::Kind::mem)
      for (const sim::AddrTerm& t : o->addr.terms)
        if (t.reg >= 0 && o->space == sim::Space::vmem) return false;  // register-relative VMEM: not reordered
  switch (info.unit) {
    case sim::UnitKind::scalar:
      if (in.op == Op::loop || in.op == Op::endloop || in.op == Op::loopr || in.op == Op::sld) return false;
      s.ordered = true;
      s.barrier = true;
      break;
    case sim::UnitKind::dma: {
      s.ordered = true;
      auto side = [&](const sim::Operand& o, const std::array<int64_t, 2>& st) {
        sim::Region r;
        r.space = o.space;
        r.base = static_cast<uint64_t>(o.addr.offset);
        r.run = static_cast<uint64_t>(in.dma_shape[2]);
        r.n1 = static_cast<uint64_t>(in.dma_shape[1]);
        r.s1 = static_cast<uint64_t>(st[1] < 0 ? in.dma_shape[2] : st[1]);
        r.n0 = static_cast<uint64_t>(in.dma_shape[0]);
        r.s0 = static_cast<uint64_t>(st[0] < 0 ? in.dma_shape[1] * (st[1] < 0 ? in.dma_shape[2] : st[1]) : st[0]);
        r.normalize();
        return r;
      };
      if (in.dst.space == sim::Space::vmem) s.wr.push_back(side(in.dst, in.dst_stride));
      if (in.a.space == sim::Space::vmem) s.rd.push_back(side(in.a, in.src_stride));
      break;
    }
    case sim::UnitKind::mxu_weights:
    case sim::UnitKind::mxu:
      s.mxu = in.unit;
      s.unit = mxu0 + 2 * in.unit + (info.unit == sim::UnitKind::mxu ? 0 : 1);
      break;
    case sim::UnitKind::vpu: s.unit = vpu; break;
    case sim::UnitKind::eup: s.unit = eup; break;
    case sim::UnitKind::xlu: s.unit = xlu; break;
  }
  if (s.unit < 0) return true;
  for (auto [o, role] : {std::pair{&in.a, sim::Role::a}, {&in.b, sim::Role::b}, {&in.c, sim::Role::c}})
    if (o->kind == sim::Operand::Kind::mem && !(info.format == sim::Format::vfill && role == sim::Role::a))
      s.rd.push_back(sched_region(*o, sim::operand_shape(in, role)));
  if (in.dst.kind == sim::Operand::Kind::mem) {
    const sim::Region w = sched_region(in.dst, sim::operand_shape(in, sim::Role::dst));
    if (in.op == Op::mxu_mm && in.acc) s.rd.push_back(w);
    s.wr.push_back(w);
  }
  return true;
}

bool sched_same_region(const std::vector<sim::Region>& a, const sim::Region& r) { return a.size() == 1 && a[0] == r; }

bool sched_overlaps(const std::vector<sim::Region>& a, const sim::Region& r) {
  for (const sim::Region& q : a)
    if (q.space == r.space && q.lo() < r.hi() && r.lo() < q.hi() && sim::regions_overlap(q, r)) return true;
  return false;
}

// Whether the bytes of `r` are read after instruction `from` (exclusive) before an instruction
// that writes exactly them without reading them.
// Looks at most kSchedScan instructions ahead (what is not settled by then counts as read).
bool sched_read_later(const std::vector<SchedInstr>& si, size_t from, const sim::Region& r) {
  constexpr size_t kSchedScan = 4096;
  for (size_t k = from + 1; k < si.size(); ++k) {
    if (sched_overlaps(si[k].rd, r)) return true;
    if (sched_same_region(si[k].wr, r)) return false;
    if (k - from > kSchedScan) return true;
  }
  return false;
}

// Peepholes of the lowering's output: a value computed and then copied whole into a scratch or
// output slot (and read nowhere else) is computed into the slot; a fill every byte of which is
// overwritten before anything reads it is dropped.
void sched_peephole(std::vector<sim::Instr>& code, std::vector<SchedInstr>& si) {
  std::vector<char> drop(code.size(), 0);
  for (size_t i = 0; i < code.size(); ++i) {
    sim::Instr& x = code[i];
    const sim::OpInfo& info = sim::op_info(x.op);
    if (info.unit != sim::UnitKind::vpu && info.unit != sim::UnitKind::eup) continue;
    if (si[i].wr.size() != 1) continue;
    const sim::Region t = si[i].wr[0];
    if (x.op == Op::vfill && !sched_read_later(si, i, t)) {
      drop[i] = 1;
      si[i].wr.clear();
      continue;
    }
    if (i + 1 >= code.size() || drop[i + 1]) continue;
    const sim::Instr& m = code[i + 1];
    if (m.op != Op::vmov || m.a.kind != sim::Operand::Kind::mem || m.dst.dtype != x.dst.dtype ||
        !sched_same_region(si[i + 1].rd, t) || si[i + 1].wr.size() != 1 || sched_overlaps(si[i].rd, si[i + 1].wr[0]) ||
        sched_read_later(si, i + 1, t))
      continue;
    const std::array<int64_t, 2> xs = sim::operand_shape(x, sim::Role::dst), ms = sim::operand_shape(m, sim::Role::dst);
    if (xs != ms || x.rows != m.rows || x.cols != m.cols) continue;
    x.dst = m.dst;
    si[i].wr = si[i + 1].wr;
    drop[i + 1] = 1;
    si[i + 1] = SchedInstr{};
    ++i;
  }
  size_t k = 0;
  for (size_t i = 0; i < code.size(); ++i)
    if (!drop[i]) {
      if (k != i) code[k] = code[i], si[k] = std::move(si[i]);
      ++k;
    }
  code.resize(k);
  si.resize(k);
}

sim::Program schedule_kernel_program(const sim::Program& prog, const sim::ChipConfig& cfg) {
  // Programs of many grid steps stay in program order (the scheduler's cost grows with them).
  constexpr size_t kMaxScheduled = 1 << 15;
  if (prog.megacore() || prog.code.size() > kMaxScheduled) return prog;
  const int mxu0 = 3, nm = std::max(1, cfg.mxu.count);
  sim::Program p;
  p.name = prog.name;
  p.code = prog.code;
  std::vector<SchedInstr> si(p.code.size());
  for (size_t i = 0; i < p.code.size(); ++i)
    if (!sched_classify(p.code[i], si[i])) return prog;
  sched_peephole(p.code, si);
  const size_t n = p.code.size();
  // Two schedules: compute kept on its side of every wait, or free to move below one (more
  // overlap, but a wait placed early stalls what follows it); the one estimated to finish first.
  constexpr size_t kWindow = 192;
  // A MXU's weight load and the matmuls after it (until its next load) are a group: groups may
  // run in any order, each whole (a matmul uses the weights loaded last on its MXU).
  std::vector<std::vector<size_t>> group(n);  // lw -> its matmuls
  std::vector<size_t> loader(n, n);            // mm -> its lw
  {
    std::map<int, size_t> last_lw;
    for (size_t i = 0; i < n; ++i) {
      if (p.code[i].op == Op::mxu_lw) last_lw[p.code[i].unit] = i;
      if (p.code[i].op != Op::mxu_mm) continue;
      auto it = last_lw.find(p.code[i].unit);
      if (it == last_lw.end()) return prog;  // a matmul on weights loaded before the program: kept as it is
      loader[i] = it->second;
      group[it->second].push_back(i);
    }
  }
  auto schedule = [&](bool relaxed) {
    // Dependencies among a window of the next kWindow unscheduled instructions (older ones first).
    std::vector<std::vector<size_t>> succ(n);
    std::vector<int> preds(n, 0);
    std::vector<double> ready(n, 0.0);  // estimated time the instruction's result is ready
    std::vector<char> done(n, 0);
    std::vector<size_t> window;  // unscheduled instructions that entered the window, in program order
    std::vector<size_t> open(static_cast<size_t>(nm), 0);  // matmuls of the group each MXU holds still to come
    size_t next_in = 0;
    auto depends = [&](size_t j, size_t i) {  // j before i in program order
      const SchedInstr &a = si[j], &b = si[i];
      if (a.ordered && b.ordered) {
        // A DMA moves across a wait on another semaphore (its copy starts earlier or later; the
        // wait still consumes the signals of its own semaphore's DMAs, in their order).
        const sim::Instr &x = p.code[j], &y = p.code[i];
        const bool dma_wait = (x.op == Op::dma && y.op == Op::wait) || (x.op == Op::wait && y.op == Op::dma);
        return !dma_wait || x.sem == y.sem || x.sem < 0 || y.sem < 0;
      }
      if (a.barrier && !b.ordered) return true;  // compute after a wait stays after it
      if (b.barrier && !a.ordered && !relaxed) return true;  // and before it, unless relaxed
      if (loader[i] == j) return true;  // a matmul after its weights
      return sched_conflict(a, b);
    };
    std::vector<double> unit_free(static_cast<size_t>(mxu0 + 2 * nm), 0.0);
    std::map<int, std::deque<double>> sem_done;  // estimated completion of the DMAs on each semaphore
    double dma_free = 0, clock = 0;
    const double hbm = std::max(1e-9, std::min(cfg.hbm_bytes_per_cycle(), cfg.dma.engine_bytes_per_cycle));
    auto mode_rate = [&](sim::MxuMode m) {
      switch (m) {
        case sim::MxuMode::f32: return cfg.mxu.f32_cycles_per_row;
        case sim::MxuMode::i8: return cfg.mxu.int8_cycles_per_row;
        case sim::MxuMode::bf16x3: return 3 * cfg.mxu.bf16_cycles_per_row;
        default: return cfg.mxu.bf16_cycles_per_row;
      }
    };
    // Estimated start, busy time and result latency of instruction i issued at `clock`.
    auto estimate = [&](size_t i, double* busy, double* lat) {
      const sim::Instr& in = p.code[i];
      const SchedInstr& s = si[i];
      double start = clock;
      *busy = 0;
      *lat = 0;
      if (in.op == Op::wait) {
        auto it = sem_done.find(in.sem);
        if (it != sem_done.end())
          for (size_t k = 0; k < static_cast<size_t>(std::max<int64_t>(1, in.imm)) && k < it->second.size(); ++k)
            start = std::max(start, it->second[k]);
        return start;
      }
      if (s.unit < 0) return start;
      start = std::max(start, unit_free[static_cast<size_t>(s.unit)]);
      const double vregs = std::ceil(double(in.rows) / cfg.vpu.sublanes) * std::ceil(double(in.cols) / cfg.vpu.lanes);
      switch (sim::op_info(in.op).unit) {
        case sim::UnitKind::mxu_weights: *busy = double(in.rows) * cfg.mxu.weight_load_cycles_per_row; break;
        case sim::UnitKind::mxu:
          *busy = double(in.rows) * mode_rate(in.mode);
          *lat = cfg.mxu.fill_cycles + cfg.mxu.drain_cycles;
          break;
        case sim::UnitKind::vpu: *busy = vregs * cfg.vpu.cycles_per_vreg, *lat = cfg.vpu.latency; break;
        case sim::UnitKind::eup: *busy = vregs * cfg.eup.cycles_per_vreg, *lat = cfg.eup.latency; break;
        default:
          *busy = vregs * (in.op == Op::xtrans ? cfg.xlu.transpose_cycles_per_vreg : cfg.xlu.reduce_cycles_per_vreg);
          *lat = cfg.xlu.latency;
      }
      return start;
    };
    std::vector<double> dep_ready(n, 0.0);  // the latest ready time of its scheduled predecessors
    std::vector<size_t> order;
    size_t emitted = 0;
    while (emitted < n) {
      while (next_in < n && window.size() < kWindow) {
        const size_t i = next_in++;
        for (size_t j : window)
          if (depends(j, i)) {
            succ[j].push_back(i);
            ++preds[i];
          }
        window.push_back(i);
      }
      size_t best = n;
      double best_t = 0, best_busy = 0, best_lat = 0;
      for (size_t i : window) {
        if (preds[i] > 0) continue;
        if (p.code[i].op == Op::mxu_lw) {  // only on a MXU no group holds, with its matmuls ready but for it
          if (open[static_cast<size_t>(p.code[i].unit)] > 0) continue;
          bool go = true;
          for (size_t m : group[i]) go = go && m < next_in && preds[m] == 1;
          if (!go) continue;
        }
        double busy = 0, lat = 0;
        const double t = std::max(estimate(i, &busy, &lat), si[i].unit >= 0 ? dep_ready[i] : 0.0);
        if (best == n || t < best_t) best = i, best_t = t, best_busy = busy, best_lat = lat;
      }
      if (best == n) return std::pair{std::vector<size_t>{}, std::numeric_limits<double>::infinity()};  // stuck
      const sim::Instr& in = p.code[best];
      order.push_back(best);
      if (p.code[best].op == Op::mxu_lw) open[static_cast<size_t>(p.code[best].unit)] = group[best].size();
      if (p.code[best].op == Op::mxu_mm) --open[static_cast<size_t>(p.code[best].unit)];
      ++emitted;
      done[best] = 1;
      window.erase(std::find(window.begin(), window.end(), best));
      const SchedInstr& s = si[best];
      if (s.unit >= 0) unit_free[static_cast<size_t>(s.unit)] = best_t + best_busy;
      ready[best] = best_t + best_busy + best_lat;
      if (in.op == Op::dma) {
        const double bytes = double(in.dma_shape[0]) * double(in.dma_shape[1]) * double(in.dma_shape[2]);
        dma_free = std::max(clock + cfg.dma.latency_cycles, dma_free) + bytes / hbm;
        if (in.sem >= 0) sem_done[in.sem].push_back(dma_free);
        ready[best] = dma_free;
      }
      if (in.op == Op::wait) {
        auto& q = sem_done[in.sem];
        for (int64_t k = 0; k < std::max<int64_t>(1, in.imm) && !q.empty(); ++k) q.pop_front();
        clock = std::max(clock, best_t);
      }
      if (in.op == Op::fence) clock = std::max(clock, *std::max_element(ready.begin(), ready.end()));
      clock += cfg.scalar.issue_cycles;
      for (size_t k : succ[best]) {
        --preds[k];
        dep_ready[k] = std::max(dep_ready[k], ready[best]);
      }
    }
    return std::pair{std::move(order), *std::max_element(ready.begin(), ready.end())};
  };
  auto strict = schedule(false), relaxed = schedule(true);
  if (strict.first.empty() && relaxed.first.empty()) return prog;
  const std::vector<size_t>& order = relaxed.second < strict.second ? relaxed.first : strict.first;
  sim::ProgramBuilder out(p.name);
  for (size_t i : order) out.emit(p.code[i]);
  return out.finish();
}

}  // namespace tpu::kernel::detail::chip_lowering
