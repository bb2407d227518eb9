// Manual mode of the kernel API: scalar-prefetch arrays, windows of operands left in HBM
// (MemorySpace::any) and async copies with DMA semaphores. The checks (window ranges, shapes,
// a wait with nothing in flight, a copy never waited on, a scratch buffer touched while its
// copy is in flight) are shared by the interpreter and the chip lowering; the interpreter moves
// the data here (read at start(), written at wait()), the lowering emits DMAs.
#include <algorithm>

#include "tpucore/core/error.h"
#include "tpucore/kernel/internal.h"

namespace tpu::kernel {

using detail::shape_str;

int64_t Scalars::operator()(int array, int64_t i) const {
  TPU_CHECK(array >= 0 && array < count(), "kernel '{}': scalar-prefetch array {} of {}", *kernel_, array, count());
  const auto& v = (*values_)[static_cast<size_t>(array)];
  TPU_CHECK(i >= 0 && i < static_cast<int64_t>(v.size()),
            "kernel '{}': element {} of scalar-prefetch array {} of shape {}, out of range", *kernel_, i, array,
            (*shapes_)[static_cast<size_t>(array)]);
  return v[static_cast<size_t>(i)];
}

const Shape& Scalars::shape(int array) const {
  TPU_CHECK(array >= 0 && array < count(), "kernel '{}': scalar-prefetch array {} of {}", *kernel_, array, count());
  return (*shapes_)[static_cast<size_t>(array)];
}

int64_t KernelContext::scalar(int array, int64_t i) const { return scalars()(array, i); }

Scalars KernelContext::scalars() const { return Scalars(&s_->scalars, &s_->scalar_shapes, &s_->def->name); }

namespace {

const BlockSpec* spec_of_ref(const KernelContext::State& s, Ref::Kind k, int i) {
  if (k == Ref::Kind::input) return &s.def->in_specs[static_cast<size_t>(i)];
  if (k == Ref::Kind::output) return &s.def->out_specs[static_cast<size_t>(i)];
  return nullptr;
}

std::string ref_name(const KernelContext::State& s, const Ref& r) {
  std::string n;
  if (r.kind() == Ref::Kind::scratch) {
    const ScratchSpec& sc = s.def->scratch[static_cast<size_t>(r.index())];
    n = sc.name.empty() ? fmt::format("scratch {}", r.index()) : fmt::format("scratch {} ('{}')", r.index(), sc.name);
  } else {
    const bool in = r.kind() == Ref::Kind::input;
    n = detail::spec_name(*spec_of_ref(s, r.kind(), r.index()), in ? "input" : "output", static_cast<size_t>(r.index()));
  }
  if (r.is_window()) n += fmt::format(" window at {} of {}", shape_str(r.window_start()), shape_str(r.window_extent()));
  return n;
}

// The array an operand or scratch buffer is (its shape and dtype).
TensorType side_type(const KernelContext::State& s, const Ref& r) {
  if (r.kind() == Ref::Kind::scratch) {
    const ScratchSpec& sc = s.def->scratch[static_cast<size_t>(r.index())];
    return {Shape(sc.shape), sc.dtype};
  }
  return r.kind() == Ref::Kind::input ? s.in_types[static_cast<size_t>(r.index())]
                                      : s.out_types[static_cast<size_t>(r.index())];
}

// The part of a copy's scratch side it covers: its window's block, or the whole buffer.
std::vector<int64_t> scratch_region(const KernelContext::State& s, const Ref& r) {
  if (r.is_window()) return detail::window_place(r, side_type(s, r).shape).block;
  return s.def->scratch[static_cast<size_t>(r.index())].shape;
}

}  // namespace

Ref Ref::at(Index start, std::vector<int64_t> shape) const {
  const auto& s = ctx_->state();
  const std::string& kn = s.def->name;
  TPU_CHECK(!windowed_ && (kind_ == Kind::scratch || detail::is_any(*spec_of_ref(s, kind_, index_))),
            "kernel '{}': at() takes a window of an operand in MemorySpace::any or of a scratch buffer; {} is not one",
            kn, ref_name(s, *this));
  const Shape a = side_type(s, *this).shape;
  TPU_CHECK(static_cast<int>(start.size()) == a.ndim() && static_cast<int>(shape.size()) == a.ndim(),
            "kernel '{}': a window at {} of {} for an array {} of rank {}", kn, shape_str(start), shape_str(shape),
            a, a.ndim());
  Ref r = *this;
  r.windowed_ = true;
  r.start_ = std::move(start);
  r.extent_ = std::move(shape);
  for (int d = 0; d < a.ndim(); ++d) {
    const size_t u = static_cast<size_t>(d);
    const int64_t n = r.extent_[u] == squeezed ? 1 : r.extent_[u];
    TPU_CHECK(n > 0 && r.start_[u] >= 0 && r.start_[u] + n <= a[d],
              "kernel '{}': the window at {} of {} of {} is out of range: the array is {}", kn, shape_str(r.start_),
              shape_str(r.extent_), ref_name(s, *this), a);
    if (r.extent_[u] != squeezed) r.wshape_.push_back(n);
  }
  return r;
}

namespace detail {

BlockPlace window_place(const Ref& r, const Shape& array) {
  BlockPlace p;
  for (int d = 0; d < array.ndim(); ++d) {
    const int64_t e = r.window_extent()[static_cast<size_t>(d)];
    p.start.push_back(r.window_start()[static_cast<size_t>(d)]);
    p.extent.push_back(e == squeezed ? 1 : e);
    p.block_index.push_back(0);
    if (e != squeezed) {
      p.block.push_back(e);
      p.array_dim.push_back(d);
    }
  }
  return p;
}

void begin_copies(KernelContext::State& s) {
  s.in_flight.assign(static_cast<size_t>(std::max(0, s.def->num_semaphores)), {});
  s.scratch_incoming.assign(s.def->scratch.size(), 0);
  s.scratch_outgoing.assign(s.def->scratch.size(), 0);
}

void end_copies(KernelContext::State& s) {
  for (size_t sem = 0; sem < s.in_flight.size(); ++sem)
    if (!s.in_flight[sem].empty()) {
      const auto& c = s.in_flight[sem].front();
      fail("kernel '{}': the async copy from {} into {} on semaphore {}, started at grid step {}, is never waited "
           "on (a missing wait() on the semaphore)",
           s.def->name, ref_name(s, c.src), ref_name(s, c.dst), sem, shape_str(c.step));
    }
}

void check_scratch_access(const KernelContext::State& s, int i, bool write) {
  if (!s.check_copies || s.scratch_incoming.empty()) return;
  const size_t u = static_cast<size_t>(i);
  const std::string who = ref_name(s, Ref(nullptr, Ref::Kind::scratch, i));
  TPU_CHECK(s.scratch_incoming[u] == 0,
            "kernel '{}': grid step {} {} {} while an async copy into it is in flight (a race: wait() on its "
            "semaphore first)", s.def->name, shape_str(s.grid_index), write ? "writes" : "reads", who);
  TPU_CHECK(!write || s.scratch_outgoing[u] == 0,
            "kernel '{}': grid step {} writes {} while an async copy out of it is in flight (a race: wait() on its "
            "semaphore first)", s.def->name, shape_str(s.grid_index), who);
}

}  // namespace detail

AsyncCopy KernelContext::async_copy(const Ref& src, const Ref& dst, int sem) {
  const State& s = *s_;
  const std::string& kn = s.def->name;
  TPU_CHECK(sem >= 0 && sem < s.def->num_semaphores, "kernel '{}': async copy on semaphore {} of {} (KernelDef::num_semaphores)",
            kn, sem, s.def->num_semaphores);
  const bool in_copy = src.is_window() && src.kind() != Ref::Kind::scratch && dst.kind() == Ref::Kind::scratch;
  const bool out_copy = src.kind() == Ref::Kind::scratch && dst.is_window() && dst.kind() == Ref::Kind::output;
  TPU_CHECK(in_copy || out_copy,
            "kernel '{}': an async copy from {} into {}: copies go from a window (Ref::at) of an operand in "
            "MemorySpace::any into a scratch buffer (or a window of one), or from a scratch buffer (or a window of "
            "one) into a window of an output", kn, ref_name(s, src), ref_name(s, dst));
  const Ref& win = in_copy ? src : dst;
  const Ref& buf = in_copy ? dst : src;
  const ScratchSpec& sc = s.def->scratch[static_cast<size_t>(buf.index())];
  BlockPlace p = detail::window_place(win, side_type(s, win).shape);
  const std::vector<int64_t> region = scratch_region(s, buf);
  TPU_CHECK(p.block == region && side_type(s, win).dtype == sc.dtype,
            "kernel '{}': an async copy from {} into {}: the window is {} {} and the scratch buffer {} {}", kn,
            ref_name(s, src), ref_name(s, dst), dtype_name(side_type(s, win).dtype), shape_str(p.block),
            dtype_name(sc.dtype), shape_str(region));
  return AsyncCopy(this, src, dst, sem);
}

namespace {

// True when two sides of copies on one scratch buffer share elements (a whole buffer shares all).
bool regions_overlap(const Ref& a, const Ref& b) {
  if (!a.is_window() || !b.is_window()) return true;
  for (size_t d = 0; d < a.window_start().size(); ++d) {
    const int64_t ea = std::max<int64_t>(1, a.window_extent()[d]), eb = std::max<int64_t>(1, b.window_extent()[d]);
    if (a.window_start()[d] + ea <= b.window_start()[d] || b.window_start()[d] + eb <= a.window_start()[d]) return false;
  }
  return true;
}

}  // namespace

void AsyncCopy::start() const {
  KernelContext::State& s = ctx_->state();
  const bool in_copy = dst_.kind() == Ref::Kind::scratch;
  const int buf = in_copy ? dst_.index() : src_.index();
  if (!in_copy || !dst_.is_window()) {
    detail::check_scratch_access(s, buf, in_copy);
  } else if (s.check_copies) {  // copies into disjoint windows of one buffer may be in flight together
    for (const auto& q : s.in_flight)
      for (const auto& c : q) {
        const Ref& side = c.dst.kind() == Ref::Kind::scratch ? c.dst : c.src;
        TPU_CHECK(side.kind() != Ref::Kind::scratch || side.index() != buf || !regions_overlap(side, dst_),
                  "kernel '{}': grid step {} starts a copy into {} while the async copy from {} into {} touches the "
                  "same elements (a race: wait() on its semaphore first)", s.def->name, shape_str(s.grid_index),
                  ref_name(s, dst_), ref_name(s, c.src), ref_name(s, c.dst));
      }
  }
  KernelContext::State::Copy c{src_, dst_, s.grid_index, {}};
  if (s.lower) {
    s.lower->copy_start(src_, dst_, sem_);
  } else if (in_copy) {
    const TensorType t = side_type(s, src_);
    const BlockPlace p = detail::window_place(src_, t.shape);
    const auto& arr = src_.kind() == Ref::Kind::input ? s.in_data[static_cast<size_t>(src_.index())]
                                                      : s.out_data[static_cast<size_t>(src_.index())];
    c.data.resize(static_cast<size_t>(detail::numel_of(p.block)));
    detail::for_each_block_elem(p, t.shape, [&](int64_t e, int64_t off) { c.data[static_cast<size_t>(e)] = arr[static_cast<size_t>(off)]; });
  } else if (src_.is_window()) {
    const TensorType t = side_type(s, src_);
    const BlockPlace p = detail::window_place(src_, t.shape);
    const auto& arr = detail::data_of(s.scratch[static_cast<size_t>(buf)]);
    c.data.resize(static_cast<size_t>(detail::numel_of(p.block)));
    detail::for_each_block_elem(p, t.shape, [&](int64_t e, int64_t off) { c.data[static_cast<size_t>(e)] = arr[static_cast<size_t>(off)]; });
  } else {
    c.data = detail::data_of(s.scratch[static_cast<size_t>(buf)]);
  }
  (in_copy ? s.scratch_incoming : s.scratch_outgoing)[static_cast<size_t>(buf)]++;
  s.in_flight[static_cast<size_t>(sem_)].push_back(std::move(c));
}

void AsyncCopy::wait() const {
  KernelContext::State& s = ctx_->state();
  auto& q = s.in_flight[static_cast<size_t>(sem_)];
  TPU_CHECK(!q.empty(), "kernel '{}': grid step {} waits on semaphore {} for a copy into {}, but no copy on it is in "
            "flight (a wait without start())", s.def->name, shape_str(s.grid_index), sem_, ref_name(s, dst_));
  KernelContext::State::Copy c = std::move(q.front());
  q.pop_front();
  const bool in_copy = c.dst.kind() == Ref::Kind::scratch;
  const bool same = c.dst.kind() == dst_.kind() && c.src.kind() == src_.kind() &&
                    (in_copy ? c.dst.index() == dst_.index() : c.src.index() == src_.index());
  TPU_CHECK(same, "kernel '{}': grid step {} waits on semaphore {} for a copy into {}, but the oldest copy in flight "
            "on it goes from {} into {}", s.def->name, shape_str(s.grid_index), sem_, ref_name(s, dst_),
            ref_name(s, c.src), ref_name(s, c.dst));
  const int buf = in_copy ? c.dst.index() : c.src.index();
  (in_copy ? s.scratch_incoming : s.scratch_outgoing)[static_cast<size_t>(buf)]--;
  if (s.lower) {
    s.lower->copy_wait(c.src, c.dst, sem_);
    return;
  }
  if (in_copy) {
    const ScratchSpec& sc = s.def->scratch[static_cast<size_t>(buf)];
    Value v = detail::make_value(sc.shape, sc.dtype);
    if (c.dst.is_window()) {  // the rest of the buffer keeps its values
      detail::data_of(v) = detail::data_of(s.scratch[static_cast<size_t>(buf)]);
      const BlockPlace p = detail::window_place(c.dst, Shape(sc.shape));
      auto& arr = detail::data_of(v);
      detail::for_each_block_elem(p, Shape(sc.shape), [&](int64_t e, int64_t off) { arr[static_cast<size_t>(off)] = c.data[static_cast<size_t>(e)]; });
    } else {
      detail::data_of(v) = std::move(c.data);
    }
    s.scratch[static_cast<size_t>(buf)] = v;
  } else {
    const TensorType t = side_type(s, c.dst);
    const BlockPlace p = detail::window_place(c.dst, t.shape);
    auto& arr = s.out_data[static_cast<size_t>(c.dst.index())];
    detail::for_each_block_elem(p, t.shape, [&](int64_t e, int64_t off) { arr[static_cast<size_t>(off)] = c.data[static_cast<size_t>(e)]; });
  }
}

}  // namespace tpu::kernel
