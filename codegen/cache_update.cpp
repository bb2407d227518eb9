#include "codegen/cache_update.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <array>
#include <mutex>
#include <optional>

#include "codegen/launch.h"
#include "ops/meta_util.h"
#include "ops/registry.h"
#include "sim/builder.h"
#include "tpucore/ops.h"

namespace tpu::codegen {
namespace {

using namespace ops;
using B = sim::ProgramBuilder;

void cache_write_meta(const MetaArgs& a, MetaResult& m) {
  const Tensor& c = a.inputs[0];
  const Tensor& s = a.inputs[1];
  const Tensor& p = a.inputs[2];
  TPU_CHECK(c.dim() == 4 && c.is_contiguous(), "kv_cache_write_: the cache must be a contiguous [B, H, C, D] tensor, got {}",
            describe(c));
  TPU_CHECK(s.dim() == 4 && s.size(0) == c.size(0) && s.size(1) == c.size(1) && s.size(3) == c.size(3) &&
                s.size(2) >= 1 && s.size(2) <= c.size(2),
            "kv_cache_write_: the new entries must be [{}, {}, T, {}] with 1 <= T <= {}, got shape {}", c.size(0), c.size(1),
            c.size(3), c.size(2), s.shape().str());
  TPU_CHECK(s.dtype() == c.dtype(), "kv_cache_write_: the new entries are {}, the cache {}", dtype_name(s.dtype()),
            dtype_name(c.dtype()));
  TPU_CHECK(p.numel() == 1 && (p.dtype() == DType::i32 || p.dtype() == DType::i64),
            "kv_cache_write_: the position must be one i32 or i64 value, got {}", describe(p));
  m.out() = {c.shape(), c.dtype(), c.device()};
}

// Host values of position tensors, by storage (held weakly: a freed storage never matches a new
// one at its address) and version: position_tensor records the value it uploads, and the first
// read of another tensor records what it read (on a chip that waits for the work before it on
// the stream), so the layers of one decode step read it once at most.
struct PositionMemo {
  std::weak_ptr<Storage> storage;  // not kept alive: a freed one never matches
  int64_t offset = 0;
  uint64_t version = 0;
  DType dtype = DType::i32;
  int64_t value = 0;
};
std::mutex g_memo_mu;
std::array<PositionMemo, 8> g_memo;
size_t g_memo_next = 0;

void remember(const Tensor& pos, int64_t v) {
  std::lock_guard<std::mutex> lk(g_memo_mu);
  g_memo[g_memo_next] = {pos.storage(), pos.offset(), pos.storage()->version, pos.dtype(), v};
  g_memo_next = (g_memo_next + 1) % g_memo.size();
}

int64_t read_position(const Tensor& pos, int64_t limit, const char* op = "kv_cache_write_") {
  std::optional<int64_t> known;
  if (!pos.device().is_cpu()) {
    std::lock_guard<std::mutex> lk(g_memo_mu);
    for (const PositionMemo& m : g_memo)
      if (pos.storage() && m.storage.lock() == pos.storage() && m.offset == pos.offset() &&
          m.version == pos.storage()->version && m.dtype == pos.dtype())
        known = m.value;
  }
  const int64_t v = known ? *known : pos.item<int64_t>();
  if (!known && !pos.device().is_cpu()) remember(pos, v);
  TPU_CHECK(v >= 0 && v <= limit, "{}: position {} is outside [0, {}] (cache length minus new entries)", op, v,
            limit);
  return v;
}

void cache_write_cpu(const KernelArgs& a) {
  const Tensor& c = a.inputs[0];
  const Tensor& s = a.inputs[1];
  const int64_t t = s.size(2), d = s.size(3);
  const int64_t pos = read_position(a.inputs[2], c.size(2) - t);
  const auto es = static_cast<int64_t>(c.element_size());
  char* cb = static_cast<char*>(c.raw_data());
  const char* sb = static_cast<const char*>(s.raw_data());
  const Shape& ss = s.strides();
  for (int64_t b = 0; b < s.size(0); ++b)
    for (int64_t h = 0; h < s.size(1); ++h)
      for (int64_t i = 0; i < t; ++i) {
        char* dst = cb + (((b * c.size(1) + h) * c.size(2) + pos + i) * d) * es;
        const char* src = sb + (b * ss[0] + h * ss[1] + i * ss[2]) * es;
        if (ss[3] == 1) {
          std::memcpy(dst, src, static_cast<size_t>(d * es));
        } else {
          for (int64_t j = 0; j < d; ++j) std::memcpy(dst + j * es, src + j * ss[3] * es, static_cast<size_t>(es));
        }
      }
  a.outputs[0] = c;  // the result is the cache itself
}

// One DMA per batch row: H planes of T rows of D elements, from src's strides into the cache at
// r0 + r2 * D * es (r2: the position); r1 is src.
sim::Program make_cache_write(const Tensor& c, const Tensor& s) {
  const int64_t es = static_cast<int64_t>(c.element_size());
  const int64_t bsz = s.size(0), h = s.size(1), t = s.size(2), d = s.size(3), cap = c.size(2);
  const Shape& ss = s.strides();
  B b("kv_cache_write");
  sim::DmaShape sh;
  sh.planes = h;
  sh.rows = t;
  sh.row_bytes = d * es;
  sh.src_plane_stride = ss[1] * es;
  sh.src_row_stride = ss[2] * es;
  sh.dst_plane_stride = cap * d * es;
  sh.dst_row_stride = d * es;
  b.loop(3, bsz);
  const sim::Addr dst = B::at(0, {{0, 1}, {2, d * es}, {3, h * cap * d * es}});
  const sim::Addr src = B::at(0, {{1, 1}, {3, ss[0] * es}});
  b.dma(B::hbm_at(dst), B::hbm_at(src), sh, 0, 0);
  b.end_loop();
  b.wait(0, bsz);
  b.fence();
  return b.finish();
}

void cache_write_chip(const KernelArgs& a) {
  const Tensor& c = a.inputs[0];
  Tensor s = a.inputs[1];
  const int64_t t = s.size(2);
  const int64_t pos = read_position(a.inputs[2], c.size(2) - t);
  if (!runs_generated_programs(c.device())) {
    Tensor dst = narrow(c, 2, pos, t);
    copy_(dst, s);
    a.outputs[0] = c;
    return;
  }
  if (s.strides()[3] != 1 && s.size(3) > 1) s = contiguous(s);
  const Shape& ss = s.strides();
  const std::string key = fmt::format("kv_cache_write:{}:[{}]:[{}]:{}", c.element_size(), fmt::join(s.shape(), ","),
                                      fmt::join(ss, ","), c.size(2));
  const LoadedProgram lp = cached_program(c.device(), key, [&] { return make_cache_write(c, s); });
  launch(c.device(), lp, "kv_cache_write", {hbm_address(c), hbm_address(s), pos});
  a.outputs[0] = c;
}

TPU_DEFINE_OP(kv_cache_write_op,
              {.name = "kv_cache_write_", .num_inputs = 3, .flags = kNonDifferentiable, .meta = &cache_write_meta,
               .cpu = &cache_write_cpu,
               .doc = "writes [B, H, T, D] entries into a [B, H, C, D] cache at a runtime position of dim 2, in place"});

[[maybe_unused]] const bool g_registered = [] {
  kv_cache_write_op();
  ops::register_kernel("kv_cache_write_", DeviceType::sim, &cache_write_chip);
  ops::register_kernel("kv_cache_write_", DeviceType::tpu, &cache_write_chip);
  return true;
}();

}  // namespace

Tensor position_tensor(int64_t pos, Device device) {
  Tensor t = from_vector(std::vector<int64_t>{pos}, Shape{1}, TensorOptions(DType::i64, device));
  if (!device.is_cpu()) remember(t, pos);
  return t;
}

int64_t read_cache_position(const Tensor& pos, int64_t limit, const char* op) { return read_position(pos, limit, op); }

Tensor kv_cache_write_(const Tensor& cache, const Tensor& src, const Tensor& pos) {
  return ops::call(kv_cache_write_op(), {cache, src, pos});
}

}  // namespace tpu::codegen
