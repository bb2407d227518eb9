// Block references of the cpu interpreter: loads and stores of the current step's blocks.
#include "tpucore/core/error.h"
#include "tpucore/kernel/internal.h"

namespace tpu::kernel {

using detail::data_of;
using detail::shape_str;

namespace {

const char* kind_name(Ref::Kind k) {
  switch (k) {
    case Ref::Kind::input: return "input";
    case Ref::Kind::output: return "output";
    default: return "scratch";
  }
}

const BlockPlace* place(const KernelContext::State& s, Ref::Kind k, int i) {
  if (k == Ref::Kind::input) return &s.in_place[static_cast<size_t>(i)];
  if (k == Ref::Kind::output) return &s.out_place[static_cast<size_t>(i)];
  return nullptr;
}

const Shape& array_shape(const KernelContext::State& s, Ref::Kind k, int i) {
  return k == Ref::Kind::input ? s.in_types[static_cast<size_t>(i)].shape : s.out_types[static_cast<size_t>(i)].shape;
}

// True when `v` broadcasts to `block` (numpy rules, result equal to the block).
bool broadcasts_to(const std::vector<int64_t>& v, const std::vector<int64_t>& block) {
  if (v.size() > block.size()) return false;
  for (size_t k = 0; k < v.size(); ++k) {
    const int64_t a = v[v.size() - 1 - k], b = block[block.size() - 1 - k];
    if (a != b && a != 1) return false;
  }
  return true;
}

// A tpu::Error for a load or store of an operand left in HBM; checks a scratch buffer's copies.
void check_access(const KernelContext::State& s, Ref::Kind k, int i, bool windowed, bool write) {
  TPU_CHECK(!windowed, "kernel '{}': {} a window (Ref::at) of {} {}; windows are for async_copy", s.def->name,
            write ? "store into" : "load from", kind_name(k), i);
  if (k == Ref::Kind::scratch) {
    detail::check_scratch_access(s, i, write);
    return;
  }
  const BlockSpec& sp = k == Ref::Kind::input ? s.def->in_specs[static_cast<size_t>(i)] : s.def->out_specs[static_cast<size_t>(i)];
  TPU_CHECK(!windowed && !detail::is_any(sp),
            "kernel '{}': {} {} of {}: an operand in MemorySpace::any stays in HBM; copy a window of it with "
            "async_copy into a scratch buffer", s.def->name, write ? "store into" : "load from",
            detail::spec_name(sp, kind_name(k), static_cast<size_t>(i)), "the body");
}

}  // namespace

const std::vector<int64_t>& Ref::shape() const {
  const auto& s = ctx_->state();
  if (windowed_) return wshape_;
  if (const BlockPlace* p = place(s, kind_, index_)) return p->block;
  return s.scratch[static_cast<size_t>(index_)].shape();
}

DType Ref::dtype() const {
  const auto& s = ctx_->state();
  if (kind_ == Kind::input) return s.in_types[static_cast<size_t>(index_)].dtype;
  if (kind_ == Kind::output) return s.out_types[static_cast<size_t>(index_)].dtype;
  return s.scratch[static_cast<size_t>(index_)].dtype();
}

int64_t Ref::valid(int axis) const {
  const auto& sh = shape();
  const int r = static_cast<int>(sh.size());
  TPU_CHECK(axis >= -r && axis < r, "kernel '{}': valid({}) of a block of shape {}", ctx_->def().name, axis, shape_str(sh));
  if (axis < 0) axis += r;
  const BlockPlace* p = place(ctx_->state(), kind_, index_);
  if (!p) return sh[static_cast<size_t>(axis)];
  const int ad = p->array_dim[static_cast<size_t>(axis)];
  const int64_t left = array_shape(ctx_->state(), kind_, index_)[ad] - p->start[static_cast<size_t>(ad)];
  return std::min(left, sh[static_cast<size_t>(axis)]);
}

int64_t Ref::offset(int axis) const {
  const auto& sh = shape();
  const int r = static_cast<int>(sh.size());
  TPU_CHECK(axis >= -r && axis < r, "kernel '{}': offset({}) of a block of shape {}", ctx_->def().name, axis, shape_str(sh));
  if (axis < 0) axis += r;
  const BlockPlace* p = place(ctx_->state(), kind_, index_);
  return p ? p->start[static_cast<size_t>(p->array_dim[static_cast<size_t>(axis)])] : 0;
}

Value Ref::valid_mask() const {
  const auto& sh = shape();
  Value m = full(sh, 1.0, DType::boolean);
  for (int a = 0; a < static_cast<int>(sh.size()); ++a) {
    if (valid(a) == sh[static_cast<size_t>(a)]) continue;
    m = logical_and(m, lt(iota(sh, a), static_cast<double>(valid(a))));
  }
  return m;
}

Value Ref::load(double fill) const {
  auto& s = ctx_->state();
  check_access(s, kind_, index_, windowed_, false);
  if (s.lower) return s.lower->load(kind_, index_, fill);
  const auto& sh = shape();
  if (kind_ == Kind::scratch) return s.scratch[static_cast<size_t>(index_)];
  Value v = detail::make_value(sh, dtype());
  auto& d = data_of(v);
  const double f = detail::round_to(dtype(), fill);
  const BlockPlace& p = *place(s, kind_, index_);
  if (kind_ == Kind::input) {
    const auto& arr = s.in_data[static_cast<size_t>(index_)];
    detail::for_each_block_elem(p, array_shape(s, kind_, index_), [&](int64_t e, int64_t off) {
      d[static_cast<size_t>(e)] = off >= 0 ? arr[static_cast<size_t>(off)] : f;
    });
  } else {
    const auto& blk = s.out_block[static_cast<size_t>(index_)];
    detail::for_each_block_elem(p, array_shape(s, kind_, index_), [&](int64_t e, int64_t off) {
      d[static_cast<size_t>(e)] = off >= 0 ? blk[static_cast<size_t>(e)] : f;
    });
  }
  return v;
}

Value Ref::load(const Value& mask, double fill) const {
  TPU_CHECK(mask.defined() && mask.dtype() == DType::boolean, "kernel '{}': a load mask must be a bool value",
            ctx_->def().name);
  return where(mask, load(fill), fill);
}

void Ref::store(const Value& v) const {
  auto& s = ctx_->state();
  TPU_CHECK(v.defined(), "kernel '{}': store of an undefined value into {} {}", ctx_->def().name, kind_name(kind_), index_);
  TPU_CHECK(kind_ != Kind::input, "kernel '{}': store into input {}; inputs are read-only", ctx_->def().name, index_);
  check_access(s, kind_, index_, windowed_, true);
  const auto& sh = shape();
  TPU_CHECK(broadcasts_to(v.shape(), sh), "kernel '{}': store of a value of shape {} into {} {} whose block has shape {}",
            ctx_->def().name, shape_str(v.shape()), kind_name(kind_), index_, shape_str(sh));
  if (s.lower) {
    s.lower->store(kind_, index_, v, nullptr);
    return;
  }
  Value c = v.dtype() == dtype() ? v : cast(v, dtype());
  if (c.shape() != sh) {
    try {
      c = broadcast_to(c, sh);
    } catch (const Error&) {
      fail("kernel '{}': store of a value of shape {} into {} {} whose block has shape {}", ctx_->def().name,
           shape_str(v.shape()), kind_name(kind_), index_, shape_str(sh));
    }
  }
  if (kind_ == Kind::scratch) {
    s.scratch[static_cast<size_t>(index_)] = c;
    return;
  }
  s.out_block[static_cast<size_t>(index_)] = data_of(c);
}

void Ref::store(const Value& v, const Value& mask) const {
  TPU_CHECK(mask.defined() && mask.dtype() == DType::boolean, "kernel '{}': a store mask must be a bool value",
            ctx_->def().name);
  TPU_CHECK(v.defined(), "kernel '{}': store of an undefined value", ctx_->def().name);
  auto& s = ctx_->state();
  TPU_CHECK(kind_ != Kind::input, "kernel '{}': store into input {}; inputs are read-only", ctx_->def().name, index_);
  check_access(s, kind_, index_, windowed_, true);
  TPU_CHECK(broadcasts_to(v.shape(), shape()) && broadcasts_to(mask.shape(), shape()),
            "kernel '{}': masked store of a value of shape {} with a mask of shape {} into {} {} whose block has shape {}",
            ctx_->def().name, shape_str(v.shape()), shape_str(mask.shape()), kind_name(kind_), index_, shape_str(shape()));
  if (s.lower) {
    s.lower->store(kind_, index_, v, &mask);
    return;
  }
  Value c = v.dtype() == dtype() ? v : cast(v, dtype());
  store(where(mask, c, load()));
}

}  // namespace tpu::kernel
