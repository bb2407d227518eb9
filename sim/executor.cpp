// The interpreter: walks the program in order (the scalar unit issues one instruction per
// `issue_cycles`), computes each instruction's start and end on its unit's timeline, and (in
// functional mode) performs it. Cost formulas: sim/README.md, "Timing model".
#include "sim/executor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "sim/assembly.h"
#include "sim/dma.h"
#include "sim/error.h"
#include "sim/kernels.h"
#include "sim/region.h"
#include "sim/scoreboard.h"
#include "sim/timing_model.h"

namespace tpu::sim::detail {
namespace {

struct Unit {
  std::string name;
  double free = 0;
  double busy = 0;
  uint64_t count = 0;
  std::vector<double> ring;  // start times of the last queue_depth instructions
  size_t pos = 0;
};

struct PendingSignal {
  double t;
  uint64_t seq;  // DMA sequence number, 0 for `signal`
};

struct Outstanding {  // a DMA not yet waited on (race checker)
  Region w, r;
  size_t idx;
  uint64_t seq;
};

uint64_t span(const std::array<int64_t, 3>& shape, const std::array<int64_t, 2>& stride) {
  return uint64_t((shape[0] - 1) * stride[0] + (shape[1] - 1) * stride[1] + shape[2]);
}

struct Access {
  Region rd[4];
  int nr = 0;
  Region wr[1];
  int nw = 0;
  void read(const Region& r) { rd[nr++] = r; }
  void write(const Region& r) { wr[nw++] = r; }
};

// What the cores of one run share: HBM bandwidth, the touched-bytes unions of the calibrated
// model, and each core's scalar clock (so the bandwidth profile is pruned only before every
// core's present).
struct Shared {
  explicit Shared(double hbm_bytes_per_cycle, size_t cores) : hbm_bw(hbm_bytes_per_cycle), clock(cores, 0.0) {}
  BandwidthProfile hbm_bw;
  IntervalUnion touched_read, touched_written;
  std::vector<double> clock;  // scalar time per core; +inf once a core finished
};

class Executor {
 public:
  Executor(Chip& chip, const Program& prog, const RunOptions& opt, int core, Shared& sh)
      : chip_(chip), cfg_(chip.config()), prog_(prog), opt_(opt), func_(!opt.timing_only), core_(core),
        vmem_(chip.vmem(core)), sh_(sh) {
    const int m = cfg_.mxu.count;
    auto add = [&](std::string n) {
      Unit u;
      u.name = core ? fmt::format("c{}.{}", core, n) : std::move(n);
      u.ring.assign(size_t(cfg_.scalar.queue_depth), 0.0);
      units_.push_back(std::move(u));
    };
    add("scalar");
    for (int j = 0; j < m; ++j) add(fmt::format("mxu{}", j));
    for (int j = 0; j < m; ++j) add(fmt::format("mxu{}.weights", j));
    add("vpu");
    add("eup");
    add("xlu");
    for (int q = 0; q < cfg_.dma.engines; ++q) add(fmt::format("dma{}", q));
    regs_.assign(size_t(cfg_.scalar.registers), 0);
    if (opt.registers.size() > regs_.size())
      throw SimError(fmt::format("run: {} initial registers given, the chip has {}", opt.registers.size(), regs_.size()));
    std::copy(opt.registers.begin(), opt.registers.end(), regs_.begin());
    sems_.resize(size_t(cfg_.scalar.semaphores));
    mxu_.resize(size_t(m));
    buf_free_.assign(size_t(m), {0.0, 0.0});
    buf_ready_.assign(size_t(m), {0.0, 0.0});
    trace_.clock_ghz = cfg_.clock_ghz;
    for (const auto& u : units_) trace_.unit_names.push_back(u.name);
  }

  // Executes the instruction at the program counter; false once the program has ended.
  bool step();
  bool done() const { return pc_ >= prog_.code.size(); }
  double clock() const { return scalar_t_; }
  // The run's result over the cores in `all` (this one first).
  RunResult result(const std::vector<Executor*>& all);

 private:
  int mxu_unit(int j) const { return 1 + j; }
  // Streaming cycles per LHS row: bf16x3 is three bf16 passes.
  double mode_cycles_per_row(MxuMode m) const {
    switch (m) {
      case MxuMode::bf16: return cfg_.mxu.bf16_cycles_per_row;
      case MxuMode::f32: return cfg_.mxu.f32_cycles_per_row;
      case MxuMode::i8: return cfg_.mxu.int8_cycles_per_row;
      case MxuMode::bf16x3: return 3 * cfg_.mxu.bf16_cycles_per_row;
      case MxuMode::fp8: return cfg_.mxu.fp8_cycles_per_row;
    }
    return cfg_.mxu.bf16_cycles_per_row;
  }
  // The calibrated timing model (timing_model.h) on this program's counted work.
  CoreWork core_work() const {
    CoreWork w;
    for (int j = 0; j < cfg_.mxu.count; ++j) w.mxu_stream_cycles += units_[size_t(mxu_unit(j))].busy;
    for (int u : {vpu_unit(), eup_unit(), xlu_unit()}) w.vector_cycles = std::max(w.vector_cycles, units_[size_t(u)].busy);
    for (int j = 0; j < cfg_.mxu.count; ++j) w.mxu_weight_cycles += units_[size_t(wl_unit(j))].busy;
    w.xlu_cycles = units_[size_t(xlu_unit())].busy;
    w.narrow_store_bytes = narrow_store_bytes_;
    w.dmas = double(dma_seq_);
    return w;
  }
  int wl_unit(int j) const { return 1 + cfg_.mxu.count + j; }
  int vpu_unit() const { return 1 + 2 * cfg_.mxu.count; }
  int eup_unit() const { return 2 + 2 * cfg_.mxu.count; }
  int xlu_unit() const { return 3 + 2 * cfg_.mxu.count; }
  int dma_unit(int q) const { return 4 + 2 * cfg_.mxu.count + q; }

  [[noreturn]] void fail(size_t idx, const std::string& why) const {
    throw SimError(fmt::format("{}{}: {}", core_ ? fmt::format("core {}: ", core_) : "", describe_instr(prog_, idx), why),
                   long(idx));
  }

  int64_t eval(const Addr& a) const {
    int64_t v = a.offset;
    for (const auto& t : a.terms)
      if (t.reg >= 0) v += regs_[size_t(t.reg)] * t.scale;
    return v;
  }

  Memory& mem(Space s) { return s == Space::hbm ? chip_.hbm() : vmem_; }

  void check_range(size_t idx, const char* name, Space sp, int64_t base, __int128 hi) {
    uint64_t size = mem(sp).size();
    if (base < 0 || hi > __int128(size))
      fail(idx, fmt::format("operand '{}' touches {}[{}, {}) which is outside {} ({} bytes)", name, space_name(sp), base,
                            int64_t(std::min<__int128>(hi, INT64_MAX)), space_name(sp), size));
  }

  // Resolves a matrix operand: bounds/alignment check, region and functional reference.
  Region mat(size_t idx, const Operand& o, int64_t rows, int64_t cols, const char* name, MatRef* ref) {
    const int64_t es = dtype_size(o.dtype);
    int64_t base = eval(o.addr);
    if (base % es != 0)
      fail(idx, fmt::format("operand '{}' address {} is not aligned to its {}-byte {} elements", name, base, es,
                            dtype_name(o.dtype)));
    __int128 hi = __int128(base) + (__int128(rows) - 1) * o.row_stride * es + (__int128(cols) - 1) * o.col_stride * es + es;
    check_range(idx, name, o.space, base, hi);
    Region r;
    r.space = o.space;
    r.base = uint64_t(base);
    if (o.col_stride == 1) {
      r.run = uint64_t(cols * es);
      r.n1 = uint64_t(rows);
      r.s1 = uint64_t(o.row_stride * es);
    } else {
      r.run = uint64_t(es);
      r.n1 = uint64_t(cols);
      r.s1 = uint64_t(o.col_stride * es);
      r.n0 = uint64_t(rows);
      r.s0 = uint64_t(o.row_stride * es);
    }
    r.normalize();
    if (ref) {
      ref->base = func_ ? vmem_.data() + base : nullptr;
      ref->dtype = o.dtype;
      ref->rs = o.row_stride;
      ref->cs = o.col_stride;
      ref->is_imm = false;
    }
    return r;
  }

  Region dma_side(size_t idx, const Operand& o, const std::array<int64_t, 3>& shape,
                  const std::array<int64_t, 2>& stride, const char* name, uint64_t* base_out) {
    int64_t base = eval(o.addr);
    __int128 hi = __int128(base) + (__int128(shape[0]) - 1) * stride[0] + (__int128(shape[1]) - 1) * stride[1] + shape[2];
    check_range(idx, name, o.space, base, hi);
    Region r;
    r.space = o.space;
    r.base = uint64_t(base);
    r.run = uint64_t(shape[2]);
    r.n1 = uint64_t(shape[1]);
    r.s1 = uint64_t(stride[1]);
    r.n0 = uint64_t(shape[0]);
    r.s0 = uint64_t(stride[0]);
    r.normalize();
    *base_out = uint64_t(base);
    return r;
  }

  double issue(int u) {
    double t = scalar_t_;
    if (u != 0) t = std::max(t, units_[size_t(u)].ring[units_[size_t(u)].pos]);
    scalar_t_ = t + cfg_.scalar.issue_cycles;
    units_[0].busy += cfg_.scalar.issue_cycles;
    ++units_[0].count;
    issue_t_ = t;
    return t;
  }

  void started(int u, double start, double busy, double end, size_t idx) {
    Unit& x = units_[size_t(u)];
    x.ring[x.pos] = start;
    x.pos = (x.pos + 1) % x.ring.size();
    x.busy += busy;
    ++x.count;
    max_t_ = std::max(max_t_, end);
    if (opt_.trace) {
      if (trace_.events.size() < opt_.max_trace_events) trace_.events.push_back({uint32_t(u), uint32_t(idx), start, end});
      else trace_.truncated = true;
    }
  }

  // Earliest start allowed by accesses of in-flight compute instructions on other units:
  // reads wait for earlier writes (RAW); writes wait for earlier writes and reads (WAW, WAR).
  double deps(const Access& acc, int unit, double lower_bound) {
    if (reads_.size() + writes_.size() > board_limit_) {
      reads_.prune(issue_t_);
      writes_.prune(issue_t_);
      board_limit_ = reads_.size() + writes_.size() + 32;
    }
    double d = lower_bound;  // entries done by then cannot delay the instruction
    for (int i = 0; i < acc.nr; ++i) d = writes_.scan(acc.rd[i], unit, d);
    for (int i = 0; i < acc.nw; ++i) d = reads_.scan(acc.wr[i], unit, writes_.scan(acc.wr[i], unit, d));
    return d;
  }

  void board_add(const Access& acc, int unit, double read_done, double ready) {
    for (int i = 0; i < acc.nr; ++i) {
      bool also_written = false;  // a write entry of the same bytes (later t) covers the read
      for (int j = 0; j < acc.nw; ++j)
        also_written |= acc.wr[j] == acc.rd[i] && ready >= read_done;
      if (!also_written) reads_.push(acc.rd[i], read_done, unit);
    }
    for (int i = 0; i < acc.nw; ++i) writes_.push(acc.wr[i], ready, unit);
  }

  void race_check(size_t idx, const Access& acc) {
    if (!opt_.race_check) return;
    for (const auto& o : outstanding_) {
      const char* kind = nullptr;
      const Region* hit = nullptr;
      for (int i = 0; i < acc.nr && !kind; ++i)
        if (regions_overlap(o.w, acc.rd[i])) kind = "read-after-write", hit = &acc.rd[i];
      for (int i = 0; i < acc.nw && !kind; ++i)
        if (regions_overlap(o.w, acc.wr[i])) kind = "write-after-write", hit = &acc.wr[i];
        else if (regions_overlap(o.r, acc.wr[i])) kind = "write-after-read", hit = &acc.wr[i];
      if (!kind) continue;
      ++race_count_;
      std::string what = std::string(kind) == "read-after-write"   ? "reads bytes that"
                         : std::string(kind) == "write-after-write" ? "overwrites bytes that"
                                                                     : "overwrites bytes that";
      std::string dma_does = std::string(kind) == "write-after-read" ? "is still reading" : "is still writing";
      std::string msg = fmt::format(
          "race ({}) on {}[{}, {}): {} {} DMA {} {}, without waiting on its semaphore",
          kind, space_name(hit->space), hit->lo(), hit->hi(), describe_instr(prog_, idx), what,
          describe_instr(prog_, o.idx), dma_does);
      if (opt_.fail_on_race) throw SimError(msg, long(idx));
      if (races_.size() < 100) races_.push_back({o.idx, idx, kind, msg});
    }
  }

  void exec_dma(size_t idx, const Instr& in);
  void exec_lw(size_t idx, const Instr& in);
  void exec_mm(size_t idx, const Instr& in);
  void exec_vector(size_t idx, const Instr& in);
  void exec_wait(size_t idx, const Instr& in);
  void exec_sld(size_t idx, const Instr& in);

  Chip& chip_;
  const ChipConfig& cfg_;
  const Program& prog_;
  RunOptions opt_;
  bool func_;
  int core_;
  Memory& vmem_;
  Shared& sh_;
  size_t pc_ = 0;
  std::vector<Unit> units_;
  std::vector<int64_t> regs_;
  std::unordered_map<size_t, int64_t> trips_;  // trip counts of the running loopr loops, by pc
  double scalar_t_ = 0, issue_t_ = 0, max_t_ = 0;
  BoardList reads_, writes_;
  size_t board_limit_ = 64;
  std::vector<std::vector<PendingSignal>> sems_;
  std::vector<Outstanding> outstanding_;
  uint64_t dma_seq_ = 0;
  std::vector<MxuWeights> mxu_;
  std::vector<std::array<double, 2>> buf_free_, buf_ready_;
  std::vector<RaceReport> races_;
  uint64_t race_count_ = 0;
  Trace trace_;
  std::vector<uint8_t> tmp_;
  std::vector<float> scratch_a_, scratch_c_;
  // stats
  double flops_ = 0, vec_elems_ = 0, narrow_store_bytes_ = 0;
  std::array<double, 5> mode_flops_{};  // MXU FLOPs per MxuMode (bf16, f32, i8, bf16x3, fp8)
  uint64_t hbm_read_ = 0, hbm_written_ = 0, dma_bytes_ = 0, dyn_ = 0;
};

// A 32-bit scalar load: the word is read at issue (also in timing-only mode: addresses and trip
// counts depend on it), after every compute write to it is ready; a DMA still writing it is a
// race. It costs one issue slot, as a read of scalar memory does (see sim/README.md, "sld").
void Executor::exec_sld(size_t idx, const Instr& in) {
  const int64_t base = eval(in.a.addr);
  if (base % 4 != 0) fail(idx, fmt::format("sld address {} is not 4-byte aligned", base));
  check_range(idx, "src", in.a.space, base, __int128(base) + 4);
  Access acc;
  Region r;
  r.space = in.a.space;
  r.base = uint64_t(base);
  r.run = 4;
  r.normalize();
  acc.read(r);
  race_check(idx, acc);
  const double t = issue(0);
  const double ready = deps(acc, 0, t);
  if (ready > scalar_t_) scalar_t_ = ready;
  int32_t v = 0;
  mem(in.a.space).read(uint64_t(base), &v, 4);
  regs_[size_t(in.reg)] = v;
}

void Executor::exec_dma(size_t idx, const Instr& in) {
  const int u = dma_unit(in.unit);
  const double t = issue(u);
  Access acc;
  DmaGeometry g;
  g.shape = in.dma_shape;
  g.dst_stride = in.dst_stride;
  g.src_stride = in.src_stride;
  acc.read(dma_side(idx, in.a, in.dma_shape, in.src_stride, "src", &g.src));
  acc.write(dma_side(idx, in.dst, in.dma_shape, in.dst_stride, "dst", &g.dst));
  race_check(idx, acc);
  const double start = deps(acc, u, t);
  Unit& q = units_[size_t(u)];
  const double xfer = std::max(start + cfg_.dma.latency_cycles, q.free);
  const uint64_t bytes = uint64_t(in.dma_shape[0] * in.dma_shape[1] * in.dma_shape[2]);
  const int hbm_sides = (in.a.space == Space::hbm) + (in.dst.space == Space::hbm);
  double end;
  if (hbm_sides > 0) {
    double floor = issue_t_;  // no core issues a DMA before its present
    for (size_t c = 0; c < sh_.clock.size(); ++c)
      if (int(c) != core_) floor = std::min(floor, sh_.clock[c]);
    sh_.hbm_bw.prune(floor);
    end = sh_.hbm_bw.allocate(xfer, double(bytes) * hbm_sides, cfg_.dma.engine_bytes_per_cycle * hbm_sides);
  } else {
    end = xfer + double(bytes) / cfg_.dma.engine_bytes_per_cycle;
  }
  q.free = end;
  started(u, start, end - xfer, end, idx);
  if (in.a.space == Space::hbm) hbm_read_ += bytes;
  if (in.dst.space == Space::hbm) hbm_written_ += bytes;
  if (cfg_.timing.calibrated() && bytes > 0) {  // compulsory traffic (Stats::work): the union of the HBM spans touched
    if (in.a.space == Space::hbm) sh_.touched_read.add(g.src, span(in.dma_shape, in.src_stride));
    if (in.dst.space == Space::hbm) sh_.touched_written.add(g.dst, span(in.dma_shape, in.dst_stride));
  }
  dma_bytes_ += bytes;
  const uint64_t seq = ++dma_seq_;
  if (in.sem >= 0) sems_[size_t(in.sem)].push_back({end, seq});
  if (opt_.race_check) {
    if (outstanding_.size() >= 65536) outstanding_.erase(outstanding_.begin());
    outstanding_.push_back({acc.wr[0], acc.rd[0], idx, seq});
  }
  if (func_) dma_copy(mem(in.dst.space), mem(in.a.space), g, tmp_);
}

void Executor::exec_lw(size_t idx, const Instr& in) {
  const int j = in.unit;
  const int u = wl_unit(j);
  const double t = issue(u);
  Access acc;
  MatRef w;
  acc.read(mat(idx, in.a, in.rows, in.cols, "w", &w));
  race_check(idx, acc);
  MxuWeights& st = mxu_[size_t(j)];
  const int b = int(st.loads % 2);
  const double start = deps(acc, u, std::max({t, units_[size_t(u)].free, buf_free_[size_t(j)][size_t(b)]}));
  const double busy = double(in.rows) * cfg_.mxu.weight_load_cycles_per_row;
  const double end = start + busy;
  units_[size_t(u)].free = end;
  buf_ready_[size_t(j)][size_t(b)] = end;
  started(u, start, busy, end, idx);
  board_add(acc, u, end, end);
  if (func_) mxu_load(st, b, w, in.rows, in.cols, in.mode);
  st.k[size_t(b)] = in.rows;
  st.n[size_t(b)] = in.cols;
  st.mode[size_t(b)] = in.mode;
  st.current = b;
  ++st.loads;
}

void Executor::exec_mm(size_t idx, const Instr& in) {
  const int j = in.unit;
  const int u = mxu_unit(j);
  const double t = issue(u);
  MxuWeights& st = mxu_[size_t(j)];
  if (st.current < 0) fail(idx, fmt::format("mxu {} has no weights loaded (use mxu.lw first)", j));
  const size_t b = size_t(st.current);
  if (st.k[b] != in.k || st.n[b] != in.cols || st.mode[b] != in.mode)
    fail(idx, fmt::format("the weights loaded in mxu {} are {}x{} in mode {}, not {}x{} in mode {}", j, st.k[b], st.n[b],
                          mxu_mode_name(st.mode[b]), in.k, in.cols, mxu_mode_name(in.mode)));
  Access acc;
  MatRef lhs, out;
  acc.read(mat(idx, in.a, in.rows, in.k, "lhs", &lhs));
  Region out_r = mat(idx, in.dst, in.rows, in.cols, "out", &out);
  if (in.acc) acc.read(out_r);
  acc.write(out_r);
  race_check(idx, acc);
  const double start = deps(acc, u, std::max({t, units_[size_t(u)].free, buf_ready_[size_t(j)][b]}));
  const double per_row = mode_cycles_per_row(in.mode);
  if (per_row <= 0) fail(idx, fmt::format("chip '{}' has no MXU rate for mode {} (mxu.fp8_cycles_per_row is 0)", cfg_.name,
                                          mxu_mode_name(in.mode)));
  const double busy = double(in.rows) * per_row;
  const double end = start + busy;
  const double ready = end + cfg_.mxu.fill_cycles + cfg_.mxu.drain_cycles;
  units_[size_t(u)].free = end;
  buf_free_[size_t(j)][b] = std::max(buf_free_[size_t(j)][b], end);
  started(u, start, busy, end, idx);
  max_t_ = std::max(max_t_, ready);
  board_add(acc, u, end, ready);
  const double f = 2.0 * double(in.rows) * double(in.k) * double(in.cols);
  flops_ += f;
  mode_flops_[size_t(in.mode)] += f;
  if (func_) mxu_matmul(st, out, lhs, in.rows, in.acc, in.mode, scratch_a_, scratch_c_);
}

void Executor::exec_vector(size_t idx, const Instr& in) {
  const OpInfo& info = op_info(in.op);
  const int u = info.unit == UnitKind::vpu ? vpu_unit() : info.unit == UnitKind::eup ? eup_unit() : xlu_unit();
  const double t = issue(u);
  Access acc;
  MatRef d, a, b, c;
  const bool x = info.unit == UnitKind::xlu;
  auto src = [&](const Operand& o, const char* name, MatRef& ref) {
    if (o.kind == Operand::Kind::imm) {
      ref.is_imm = true;
      ref.imm = o.imm;
    } else if (o.kind == Operand::Kind::mem) {
      acc.read(mat(idx, o, in.rows, in.cols, name, &ref));
    }
  };
  if (info.format != Format::vfill) src(in.a, "a", a);
  src(in.b, "b", b);
  src(in.c, "c", c);
  auto dshape = operand_shape(in, Role::dst);
  acc.write(mat(idx, in.dst, dshape[0], dshape[1], "dst", &d));
  race_check(idx, acc);
  const double start = deps(acc, u, std::max(t, units_[size_t(u)].free));
  const double vregs = std::ceil(double(in.rows) / cfg_.vpu.sublanes) * std::ceil(double(in.cols) / cfg_.vpu.lanes);
  double per = cfg_.vpu.cycles_per_vreg, lat = cfg_.vpu.latency;
  if (info.unit == UnitKind::eup) per = cfg_.eup.cycles_per_vreg, lat = cfg_.eup.latency;
  if (x) per = in.op == Op::xtrans ? cfg_.xlu.transpose_cycles_per_vreg : cfg_.xlu.reduce_cycles_per_vreg, lat = cfg_.xlu.latency;
  const double busy = vregs * per;
  const double end = start + busy;
  units_[size_t(u)].free = end;
  started(u, start, busy, end, idx);
  max_t_ = std::max(max_t_, end + lat);
  board_add(acc, u, end, end + lat);
  vec_elems_ += double(in.rows) * double(in.cols);
  if (dtype_size(in.dst.dtype) == 2) narrow_store_bytes_ += 2.0 * double(dshape[0]) * double(dshape[1]);
  if (func_) {
    if (x) xlu_exec(in.op, d, a, in.rows, in.cols, in.axis);
    else vector_exec(in.op, d, a, b, c, in.rows, in.cols, in.fimm);
  }
}

void Executor::exec_wait(size_t idx, const Instr& in) {
  const double t = issue(0);
  auto& p = sems_[size_t(in.sem)];
  if (int64_t(p.size()) < in.imm)
    fail(idx, fmt::format("waits for {} signal(s) on semaphore {} but only {} are pending: the program would hang",
                          in.imm, in.sem, p.size()));
  const size_t n = size_t(in.imm);
  std::partial_sort(p.begin(), p.begin() + long(n), p.end(),
                    [](const PendingSignal& x, const PendingSignal& y) { return x.t < y.t; });
  const double tw = p[n - 1].t;
  if (opt_.race_check) {
    for (size_t i = 0; i < n; ++i) {
      uint64_t seq = p[i].seq;
      if (seq == 0) continue;
      for (size_t k = 0; k < outstanding_.size(); ++k)
        if (outstanding_[k].seq == seq) {
          outstanding_.erase(outstanding_.begin() + long(k));
          break;
        }
    }
  }
  p.erase(p.begin(), p.begin() + long(n));
  if (tw > scalar_t_) {
    if (opt_.trace && trace_.events.size() < opt_.max_trace_events) trace_.events.push_back({0, uint32_t(idx), t, tw});
    scalar_t_ = tw;
  }
}

bool Executor::step() {
  const auto& code = prog_.code;
  size_t& pc = pc_;
  if (pc < code.size()) {
    const Instr& in = code[pc];
    if (++dyn_ > opt_.max_instructions)
      fail(pc, fmt::format("the run exceeded max_instructions ({}); runaway loop?", opt_.max_instructions));
    switch (in.op) {
      case Op::nop: issue(0); break;
      case Op::halt: pc = code.size(); return false;
      case Op::sset:
        issue(0);
        regs_[size_t(in.reg)] = in.imm;
        break;
      case Op::sadd:
        issue(0);
        regs_[size_t(in.reg)] = int64_t(uint64_t(regs_[size_t(in.reg_a)]) + uint64_t(in.imm));
        break;
      case Op::smul:
        issue(0);
        regs_[size_t(in.reg)] = int64_t(uint64_t(regs_[size_t(in.reg_a)]) * uint64_t(in.imm));
        break;
      case Op::smod: {
        issue(0);
        int64_t v = regs_[size_t(in.reg_a)] % in.imm;
        regs_[size_t(in.reg)] = v < 0 ? v + in.imm : v;
        break;
      }
      case Op::loop:
        issue(0);
        regs_[size_t(in.reg)] = 0;
        if (in.imm == 0) {
          pc = size_t(in.match) + 1;
          return !done();
        }
        break;
      case Op::loopr:
        issue(0);
        trips_[pc] = regs_[size_t(in.reg_a)];
        regs_[size_t(in.reg)] = 0;
        if (trips_[pc] <= 0) {
          pc = size_t(in.match) + 1;
          return !done();
        }
        break;
      case Op::sld: exec_sld(pc, in); break;
      case Op::endloop: {
        issue(0);
        const Instr& head = code[size_t(in.match)];
        const int64_t trips = head.op == Op::loopr ? trips_[size_t(in.match)] : head.imm;
        if (++regs_[size_t(head.reg)] < trips) {
          pc = size_t(in.match) + 1;
          return !done();
        }
        break;
      }
      case Op::wait: exec_wait(pc, in); break;
      case Op::signal: {
        const double t = issue(0);
        for (int64_t i = 0; i < in.imm; ++i) sems_[size_t(in.sem)].push_back({t, 0});
        break;
      }
      case Op::fence: {
        const double t = issue(0);
        const double done = std::max(scalar_t_, max_t_);
        if (opt_.trace && done > scalar_t_ && trace_.events.size() < opt_.max_trace_events)
          trace_.events.push_back({0, uint32_t(pc), t, done});
        scalar_t_ = done;
        outstanding_.clear();
        reads_.clear();
        writes_.clear();
        break;
      }
      case Op::dma: exec_dma(pc, in); break;
      case Op::mxu_lw: exec_lw(pc, in); break;
      case Op::mxu_mm: exec_mm(pc, in); break;
      default: exec_vector(pc, in); break;
    }
    ++pc;
  }
  return !done();
}

RunResult Executor::result(const std::vector<Executor*>& all) {
  RunResult res;
  Stats& s = res.stats;
  s.chip = cfg_.name;
  s.timing_only = opt_.timing_only;
  s.clock_ghz = cfg_.clock_ghz;
  CountedWork w;
  double flops = 0, mxu_busy = 0;
  std::array<double, 5> mode_flops{};
  uint64_t hbm_read = 0, hbm_written = 0;
  for (Executor* e : all) {
    s.cycles = std::max({s.cycles, e->scalar_t_, e->max_t_});
    w.cores.push_back(e->core_work());
    s.instructions += e->dyn_;
    s.static_instructions += e->prog_.code.size();
    for (const auto& u : e->units_) s.units.push_back({u.name, u.busy, u.count});
    for (int j = 0; j < cfg_.mxu.count; ++j) mxu_busy += e->units_[size_t(e->mxu_unit(j))].busy;
    flops += e->flops_;
    for (size_t m = 0; m < mode_flops.size(); ++m) mode_flops[m] += e->mode_flops_[m];
    s.vector_elements += e->vec_elems_;
    hbm_read += e->hbm_read_;
    hbm_written += e->hbm_written_;
    s.dma_bytes += e->dma_bytes_;
    s.races += e->race_count_;
  }
  // One trace: every core's tracks, instruction indices counted through the parts in order.
  res.trace = std::move(trace_);
  size_t code_offset = prog_.code.size();
  for (Executor* e : all) {
    if (e == this) continue;
    const auto unit_offset = uint32_t(res.trace.unit_names.size());
    for (auto& n : e->trace_.unit_names) res.trace.unit_names.push_back(n);
    for (auto ev : e->trace_.events) {
      if (res.trace.events.size() >= opt_.max_trace_events) {
        res.trace.truncated = true;
        break;
      }
      ev.unit += unit_offset;
      ev.instr += uint32_t(code_offset);
      res.trace.events.push_back(ev);
    }
    res.trace.truncated = res.trace.truncated || e->trace_.truncated;
    code_offset += e->prog_.code.size();
    for (auto& r : e->races_)
      if (res.races.size() < 100) res.races.push_back(r);
  }
  s.ideal_cycles = s.cycles;
  s.timing_model = cfg_.timing.model;
  w.compulsory_read_bytes = sh_.touched_read.bytes();
  w.compulsory_written_bytes = sh_.touched_written.bytes();
  w.traffic_bytes = hbm_read + hbm_written;
  if (cfg_.timing.calibrated()) s.cycles = calibrated_cycles(cfg_, w);
  s.work = std::move(w);
  s.seconds = s.cycles / (cfg_.clock_ghz * 1e9);
  s.mxu_flops = flops;
  s.hbm_bytes_read = hbm_read;
  s.hbm_bytes_written = hbm_written;
  // Peak and MFU per MXU mode: each mode's FLOPs count at that mode's peak rate.
  for (int m = 0; m < int(mode_flops.size()); ++m) {
    if (mode_flops[size_t(m)] <= 0) continue;
    s.mxu_peak_cycles += mode_flops[size_t(m)] / (cfg_.peak_flops_at(mode_cycles_per_row(MxuMode(m))) / (cfg_.clock_ghz * 1e9));
    if (!s.mxu_modes.empty()) s.mxu_modes += "+";
    s.mxu_modes += mxu_mode_name(MxuMode(m));
  }
  // Megacore: the calibrated model prices the device (`megacore` cores: its peak and bandwidth
  // scale); the ideal timeline measures against the cores the program ran on.
  const double cores = cfg_.timing.calibrated() ? cfg_.timing.megacore : double(all.size());
  s.mxu_peak_cycles /= cores;
  s.peak_flops = flops > 0 ? flops / s.mxu_peak_cycles * cfg_.clock_ghz * 1e9 : cores * cfg_.peak_flops();
  s.hbm_bytes_per_cycle = cfg_.hbm_bytes_per_cycle() * cores;
  if (s.cycles > 0) {
    s.mxu_busy_fraction = mxu_busy / (s.cycles * cfg_.mxu.count * cores);
    s.mfu = s.mxu_peak_cycles / s.cycles;
    s.flops_per_second = flops / s.seconds;
    s.hbm_bandwidth_fraction = double(hbm_read + hbm_written) / (s.cycles * s.hbm_bytes_per_cycle);
  }
  s.arithmetic_intensity = (hbm_read + hbm_written) ? flops / double(hbm_read + hbm_written) : 0;
  s.race_check = opt_.race_check;
  std::vector<RaceReport> races = std::move(races_);
  races.insert(races.end(), res.races.begin(), res.races.end());
  res.races = std::move(races);
  res.registers = regs_;
  return res;
}

}  // namespace

// One core: the program alone with its core's share of the HBM bandwidth. Megacore: one
// executor per part, stepped in order of their scalar clocks (the one furthest behind next), so
// DMAs of both cores claim the shared HBM bandwidth in time order.
RunResult execute(Chip& chip, const Program& prog, const RunOptions& opt) {
  const ChipConfig& cfg = chip.config();
  if (!prog.megacore()) {
    Shared sh(cfg.hbm_bytes_per_cycle(), 1);
    Executor ex(chip, prog, opt, 0, sh);
    while (ex.step()) {
    }
    return ex.result({&ex});
  }
  const size_t n = prog.cores.size();
  Shared sh(cfg.hbm_bytes_per_cycle() * double(n), n);
  std::vector<std::unique_ptr<Executor>> ex;
  std::vector<Executor*> all;
  for (size_t c = 0; c < n; ++c) {
    ex.push_back(std::make_unique<Executor>(chip, prog.cores[c], opt, int(c), sh));
    all.push_back(ex.back().get());
  }
  for (;;) {
    size_t next = n;
    for (size_t c = 0; c < n; ++c) {
      sh.clock[c] = all[c]->done() ? std::numeric_limits<double>::infinity() : all[c]->clock();
      if (!all[c]->done() && (next == n || sh.clock[c] < sh.clock[next])) next = c;
    }
    if (next == n) break;
    all[next]->step();
  }
  return all[0]->result(all);
}

}  // namespace tpu::sim::detail
