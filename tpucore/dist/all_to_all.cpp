// The uneven all-to-all (all_to_all_single with split sizes, list all_to_all of tensors of
// different sizes): one exchange of every rank's dtype and element counts, a check that what
// rank i sends to rank j is what rank j expects from rank i (every rank sees the same counts,
// so every rank fails alike and the group stays usable), then the backend's transfer.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tpucore/dist/backend.h"
#include "tpucore/ops.h"

namespace tpu::dist {

void Backend::all_to_all_v(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, int64_t max_block) {
  const int n = size();
  if (max_block == 0) return;
  TensorOptions o(in.dtype(), in.device());
  Tensor pin = zeros(Shape{max_block * n}, o), pout = zeros(Shape{max_block * n}, TensorOptions(out.dtype(), out.device()));
  int64_t off = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t c = send[static_cast<size_t>(j)];
    if (c > 0) pin.narrow(0, j * max_block, c).copy_(in.narrow(0, off, c));
    off += c;
  }
  all_to_all(pout, pin);
  off = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t c = recv[static_cast<size_t>(i)];
    if (c > 0) out.narrow(0, off, c).copy_(pout.narrow(0, i * max_block, c));
    off += c;
  }
}

std::vector<int64_t> splits_or_even(const std::vector<int64_t>& splits, const Tensor& t, int n, const std::string& what,
                                    const char* arg, const char* tensor) {
  if (splits.empty()) {
    if (t.size(0) % n != 0)
      fail("{}: no {} given, so the {}'s dim 0 ({}) must split evenly over {} ranks", what, arg, tensor, t.size(0), n);
    return std::vector<int64_t>(static_cast<size_t>(n), t.size(0) / n);
  }
  if (static_cast<int>(splits.size()) != n)
    fail("{}: {} has {} entries; the group has {} ranks", what, arg, splits.size(), n);
  int64_t sum = 0;
  for (int64_t x : splits) {
    if (x < 0) fail("{}: {} holds a negative size ({})", what, arg, x);
    sum += x;
  }
  if (sum != t.size(0))
    fail("{}: {} sum to {} but the {}'s dim 0 is {}", what, arg, sum, tensor, t.size(0));
  return splits;
}

void run_all_to_all_v(Backend& b, const Tensor& out, const Tensor& in, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv, const std::string& what) {
  const int n = b.size();
  // [dtype, send[0..n), recv[0..n)]: the same length on every rank of the group.
  std::vector<int64_t> mine;
  mine.push_back(static_cast<int64_t>(in.dtype()));
  mine.insert(mine.end(), send.begin(), send.end());
  mine.insert(mine.end(), recv.begin(), recv.end());
  std::vector<char> bytes(mine.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const auto all = b.exchange(bytes);
  std::vector<std::vector<int64_t>> r(static_cast<size_t>(n), std::vector<int64_t>(mine.size()));
  for (int i = 0; i < n; ++i) std::memcpy(r[static_cast<size_t>(i)].data(), all[static_cast<size_t>(i)].data(), bytes.size());
  auto dt = [&](int i) { return dtype_name(static_cast<DType>(r[static_cast<size_t>(i)][0])); };
  for (int i = 1; i < n; ++i)
    if (r[static_cast<size_t>(i)][0] != r[0][0])
      fail("{}: the ranks' dtypes differ (rank 0: {}, rank {}: {}); no rank ran the exchange", what, dt(0), i, dt(i));
  std::string bad;
  int nbad = 0;
  int64_t max_block = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int64_t s = r[static_cast<size_t>(i)][static_cast<size_t>(1 + j)];      // i sends to j
      const int64_t e = r[static_cast<size_t>(j)][static_cast<size_t>(1 + n + i)];  // j expects from i
      max_block = std::max(max_block, s);
      if (s != e && nbad++ < 4)
        bad += fmt::format("{}rank {} sends {} element(s) to rank {}, which expects {}", bad.empty() ? "" : "; ", i, s, j, e);
    }
  if (nbad > 0)
    fail("{}: the split sizes do not match across ranks ({}{}); no rank ran the exchange", what, bad,
         nbad > 4 ? fmt::format(" and {} more", nbad - 4) : "");
  b.all_to_all_v(out, in, send, recv, max_block);
}

}  // namespace tpu::dist
