#include "codegen/decode_attention.h"

namespace tpu::codegen {

bool fold_decode_heads(AttentionSpec& s) {
  // A window tells rows apart by position: folded heads would read as later positions.
  if (s.lq != 1 || s.causal || s.window > 0 || s.group <= 1 || s.heads % s.group != 0) return false;
  const int64_t g = s.group, kv_heads = s.heads / g;
  if (static_cast<int64_t>(s.q_off.size()) != s.heads) return false;
  // The query heads of a group: one stride apart (the same stride for every group).
  const int64_t stride = s.q_off[1] - s.q_off[0];
  if (stride <= 0) return false;
  for (int64_t j = 0; j < kv_heads; ++j)
    for (int64_t t = 0; t < g; ++t)
      if (s.q_off[static_cast<size_t>(j * g + t)] != s.q_off[static_cast<size_t>(j * g)] + t * stride) return false;
  if (s.has_mask) {
    if (static_cast<int64_t>(s.m_off.size()) != s.heads) return false;
    for (int64_t j = 0; j < kv_heads; ++j)
      for (int64_t t = 1; t < g; ++t)
        if (s.m_off[static_cast<size_t>(j * g + t)] != s.m_off[static_cast<size_t>(j * g)]) return false;
  }
  std::vector<int64_t> q_off(static_cast<size_t>(kv_heads)), m_off;
  for (int64_t j = 0; j < kv_heads; ++j) q_off[static_cast<size_t>(j)] = s.q_off[static_cast<size_t>(j * g)];
  if (s.has_mask) {
    m_off.resize(static_cast<size_t>(kv_heads));
    for (int64_t j = 0; j < kv_heads; ++j) m_off[static_cast<size_t>(j)] = s.m_off[static_cast<size_t>(j * g)];
    s.m_off = std::move(m_off);
    s.m_rs = 0;  // every query row of a group reads the same mask row
  }
  s.q_off = std::move(q_off);
  s.q_rs = stride;
  s.lq = g;
  s.heads = kv_heads;
  s.group = 1;
  s.name = "decode_attention";
  return true;
}

}  // namespace tpu::codegen
