#include "sim/dma.h"

#include <algorithm>
#include <limits>

#include "sim/error.h"

namespace tpu::sim::detail {

BandwidthProfile::BandwidthProfile(double cap) : cap_(cap), times_{0.0}, used_{0.0} {}

size_t BandwidthProfile::split(double t) {
  if (t < times_[head_]) {  // before the pruned horizon: treat as free from t
    times_.insert(times_.begin() + long(head_), t);
    used_.insert(used_.begin() + long(head_), 0.0);
    return head_;
  }
  // Breakpoints are sorted; new transfers mostly start near the end, so search backwards.
  size_t i = times_.size() - 1;
  while (i > head_ && times_[i] > t) --i;
  if (times_[i] == t) return i;
  times_.insert(times_.begin() + long(i + 1), t);
  used_.insert(used_.begin() + long(i + 1), used_[i]);
  return i + 1;
}

double BandwidthProfile::allocate(double t0, double bytes, double max_rate) {
  if (bytes <= 0) return t0;
  size_t i = split(t0);
  double remaining = bytes;
  for (;;) {
    if (i >= times_.size())  // cannot happen: the open last segment always has room
      throw SimError("internal: HBM bandwidth profile has no free segment");
    double seg_start = times_[i];
    bool last = i + 1 == times_.size();
    double seg_end = last ? std::numeric_limits<double>::infinity() : times_[i + 1];
    double rate = std::min(max_rate, cap_ - used_[i]);
    if (rate > cap_ * 1e-9) {
      double t_end = seg_start + remaining / rate;
      // With a very high rate the transfer time can vanish below the resolution of
      // seg_start (t_end == seg_start): it then takes no time and must not claim bandwidth
      // over the segment, or the open last segment would end up full forever.
      if (!(t_end > seg_start)) return seg_start;
      if (t_end <= seg_end) {
        if (t_end < seg_end) {
          size_t j = split(t_end);  // j == i + 1
          (void)j;
        }
        used_[i] += rate;
        return t_end;
      }
      used_[i] += rate;
      remaining -= rate * (seg_end - seg_start);
    }
    ++i;
  }
}

void BandwidthProfile::prune(double t) {
  while (head_ + 1 < times_.size() && times_[head_ + 1] <= t) ++head_;
  if (head_ > 1024 && head_ * 2 > times_.size()) {
    times_.erase(times_.begin(), times_.begin() + long(head_));
    used_.erase(used_.begin(), used_.begin() + long(head_));
    head_ = 0;
  }
}

void dma_copy(Memory& dst_mem, const Memory& src_mem, const DmaGeometry& g, std::vector<uint8_t>& tmp) {
  const uint64_t run = uint64_t(g.shape[2]);
  const bool dst_flat = dst_mem.space() == Space::vmem;
  const bool src_flat = src_mem.space() == Space::vmem;
  for (int64_t p = 0; p < g.shape[0]; ++p) {
    for (int64_t r = 0; r < g.shape[1]; ++r) {
      uint64_t s = g.src + uint64_t(p * g.src_stride[0] + r * g.src_stride[1]);
      uint64_t d = g.dst + uint64_t(p * g.dst_stride[0] + r * g.dst_stride[1]);
      if (dst_flat) {
        src_mem.read(s, dst_mem.data() + d, run);  // memcpy/memmove into flat vmem
      } else if (src_flat) {
        dst_mem.write(d, src_mem.data() + s, run);
      } else {
        tmp.resize(run);
        src_mem.read(s, tmp.data(), run);
        dst_mem.write(d, tmp.data(), run);
      }
    }
  }
}

}  // namespace tpu::sim::detail
