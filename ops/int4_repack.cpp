// The cache of int4 weights repacked to the panel layout (int4_repack.h).
#include "ops/int4_repack.h"

#include <cstdlib>
#include <iterator>
#include <mutex>
#include <new>
#include <unordered_map>

#include "ops/cpu/kernels/gemv_int4.h"
#include "tpucore/core/env.h"

namespace tpu::ops {

Int4Panels::~Int4Panels() { std::free(data); }

namespace {

constexpr int64_t kDefaultCapMb = 2048;

struct Key {
  std::weak_ptr<Storage> q, s;
  uint64_t qversion = 0, sversion = 0;
  int64_t qoffset = 0, soffset = 0, N = 0, K = 0, group = 0;
  DType sdtype = DType::f32;
};

struct Entry {
  Key key;
  std::shared_ptr<const Int4Panels> panels;  // null: not cacheable (transient scales)
};

bool same_storage(const std::weak_ptr<Storage>& a, const std::weak_ptr<Storage>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

// The same weight bytes (storage, offset, shape; its version apart).
bool same_weight(const Key& a, const Key& b) {
  return same_storage(a.q, b.q) && a.qoffset == b.qoffset && a.N == b.N && a.K == b.K;
}

bool same_scales(const Key& a, const Key& b) {
  return same_storage(a.s, b.s) && a.soffset == b.soffset && a.group == b.group && a.sdtype == b.sdtype &&
         a.sversion == b.sversion;
}

// Entries by the address of the weight's storage (a bucket; identity is the weak reference:
// a dead storage's address may come back for another one, whose lookup then drops the entry).
struct Cache {
  std::mutex mu;
  std::unordered_multimap<const Storage*, Entry> entries;
  int64_t bytes = 0;
  int64_t cap_override = -1;
  uint32_t lookups = 0;

  int64_t cap_bytes() const {
    static const int64_t env_mb =
        env_int("TPU_CPU_INT4_REPACK_MB", 0, int64_t{1} << 30, "the default budget applies").value_or(kDefaultCapMb);
    return (cap_override >= 0 ? cap_override : env_mb) << 20;
  }

  using It = std::unordered_multimap<const Storage*, Entry>::iterator;
  It erase(It it) {
    if (it->second.panels) bytes -= it->second.panels->bytes;
    return entries.erase(it);
  }

  // Drops the entries whose weight storage died (their scales' may die first: a cast copy).
  void purge() {
    for (It it = entries.begin(); it != entries.end();) it = it->second.key.q.expired() ? erase(it) : std::next(it);
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: products may run during static destruction
  return *c;
}

}  // namespace

std::shared_ptr<const Int4Panels> int4_panels_for(const Tensor& q, const Tensor& s, int64_t group) {
  const int64_t N = q.shape()[0], K = 2 * q.shape()[1];
  if (!kernels::int4_panel_supported(K, group) || !q.storage() || !s.storage() ||
      (s.dtype() != DType::f32 && s.dtype() != DType::f16))
    return nullptr;
  Cache& c = cache();
  const Storage* addr = q.storage().get();
  const Key key{q.storage(), s.storage(), q.storage()->version, s.storage()->version, q.offset(), s.offset(),
                N,           K,           group,                s.dtype()};
  const int64_t need = kernels::int4_panel_bytes(N, K, group, s.dtype() == DType::f16);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (++c.lookups % 1024 == 0) c.purge();  // weights freed without a later lookup of their address
    auto [it, end] = c.entries.equal_range(addr);
    while (it != end) {
      Entry& e = it->second;
      if (!same_storage(e.key.q, key.q) || e.key.q.expired()) {  // a dead storage at this address
        it = c.erase(it);
        continue;
      }
      if (!same_weight(e.key, key)) {
        ++it;
        continue;
      }
      if (e.key.qversion == key.qversion) {
        if (same_scales(e.key, key)) return e.panels;
        // The same weight with other scales while the entry's died: scales copied per call.
        if (e.key.s.expired() || !e.panels) {
          if (e.panels) c.bytes -= e.panels->bytes;
          e.panels = nullptr;
          e.key = key;
          return nullptr;
        }
      }
      c.erase(it);  // written in place since, or other live scales: repacked below
      break;
    }
    if (c.bytes + need > c.cap_bytes()) {
      c.purge();
      if (c.bytes + need > c.cap_bytes()) return nullptr;
    }
  }
  auto panels = std::make_shared<Int4Panels>();
  panels->bytes = need;
  panels->f16_scales = s.dtype() == DType::f16;
  panels->data = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>((need + 63) / 64 * 64)));
  if (!panels->data) throw std::bad_alloc();
  const kernels::Int4Scales sc =
      panels->f16_scales ? kernels::Int4Scales(s.data<f16>()) : kernels::Int4Scales(s.data<float>());
  kernels::int4_pack_panels(N, K, group, q.data<uint8_t>(), sc, panels->data);
  std::lock_guard<std::mutex> lock(c.mu);
  // Another thread may have cached this weight meanwhile: its entry is kept, any other for the
  // same weight bytes replaced.
  auto [it, end] = c.entries.equal_range(addr);
  while (it != end) {
    if (same_storage(it->second.key.q, key.q) && same_weight(it->second.key, key)) {
      if (it->second.key.qversion == key.qversion && same_scales(it->second.key, key)) return it->second.panels;
      it = c.erase(it);
    } else {
      ++it;
    }
  }
  if (c.bytes + need > c.cap_bytes()) return panels;  // used this once
  c.entries.emplace(addr, Entry{key, panels});
  c.bytes += need;
  return panels;
}

Int4RepackStats int4_repack_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.purge();
  Int4RepackStats st;
  for (const auto& [addr, e] : c.entries)
    if (e.panels) ++st.entries;
  st.bytes = c.bytes;
  st.cap_bytes = c.cap_bytes();
  return st;
}

void set_int4_repack_cap_mb(int64_t mb) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.cap_override = mb < 0 ? -1 : mb;
  if (c.cap_bytes() == 0) {
    c.entries.clear();
    c.bytes = 0;
  }
}

}  // namespace tpu::ops
