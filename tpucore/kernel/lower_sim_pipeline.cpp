// The block pipeline of the chip lowering: input blocks come in by DMA into a ring of VMEM
// slots, the copies of the next steps' blocks issued ahead so the DMA latency overlaps the
// compute of the steps before; output blocks stay resident and go back by DMA when their block
// index changes, waited on only when their buffer is reused.
#include "tpucore/kernel/lower_sim_impl.h"

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
  constexpr int kMaxLookahead = 16;  // grid steps looked at ahead of g
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
  temp_top_ = temp_base_;
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
