// Scenarios "a2a" and "die_a2a": all_to_all with uneven and empty splits (all_to_all_single
// with split sizes, the list form with tensors of different sizes) against a naive exchange of
// every rank's regenerated input; split sizes or dtypes that disagree across ranks (an error
// on every rank naming them, the group stays usable); a rank that dies before the call.
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

#include "worker_common.h"

namespace dist_test {

namespace {

// Rows rank r sends to rank j (zero for some pairs).
int64_t rows(int r, int j, int salt) { return (r * 3 + j * 5 + salt) % 4; }

void uneven_single(int n, int rank, DType d, int salt, bool noncontig) {
  const int64_t w = 3;
  std::vector<int64_t> in_s, out_s;
  int64_t ni = 0, no = 0;
  for (int j = 0; j < n; ++j) {
    in_s.push_back(rows(rank, j, salt));
    out_s.push_back(rows(j, rank, salt));
    ni += in_s.back();
    no += out_s.back();
  }
  // Element (i, c) of rank r's input: value(r, i * w + c).
  auto in_val = [&](int r, int64_t k) { return value(r, k, salt, d); };
  Tensor in = make(d, Shape{ni, w}, [&](int64_t k) { return in_val(rank, k); }, noncontig);
  Tensor out = tpu::zeros(Shape{no, w}, tpu::TensorOptions(d));
  tpu::dist::world()->all_to_all_single(out, in, out_s, in_s);
  std::vector<double> want;
  for (int j = 0; j < n; ++j) {
    int64_t first = 0;
    for (int k = 0; k < rank; ++k) first += rows(j, k, salt);
    for (int64_t i = first; i < first + rows(j, rank, salt); ++i)
      for (int64_t c = 0; c < w; ++c) want.push_back(in_val(j, i * w + c));
  }
  expect(out, [&](int64_t k) { return want[static_cast<size_t>(k)]; },
         fmt::format("uneven all_to_all_single {} salt {}{}", tpu::dtype_name(d), salt, noncontig ? " (transposed input)" : ""));
}

}  // namespace

int scenario_a2a() {
  const int rank = tpu::dist::get_rank(), n = tpu::dist::get_world_size();
  int salt = 0;
  for (DType d : {DType::f32, DType::bf16, DType::i64, DType::u8})
    for (bool nc : {false, true}) uneven_single(n, rank, d, salt++, nc);
  // Nothing at all to move on any rank.
  Tensor none = tpu::zeros(Shape{0, 2});
  tpu::dist::world()->all_to_all_single(none, none, std::vector<int64_t>(size_t(n), 0), std::vector<int64_t>(size_t(n), 0));
  // The list form with tensors of different sizes: rank r sends r + 2 j elements (none when
  // r == j) to rank j as a [len] tensor.
  auto len = [](int r, int j) -> int64_t { return r == j ? 0 : r + 2 * j; };
  std::vector<Tensor> ins, outs;
  for (int j = 0; j < n; ++j) {
    ins.push_back(make(DType::f32, Shape{len(rank, j)}, [&](int64_t i) { return 100.0 * rank + 10.0 * j + double(i); }, false));
    outs.push_back(tpu::zeros(Shape{len(j, rank)}));
  }
  tpu::dist::all_to_all(outs, ins);
  for (int j = 0; j < n; ++j)
    expect(outs[size_t(j)], [&](int64_t i) { return 100.0 * j + 10.0 * rank + double(i); }, fmt::format("list all_to_all from {}", j));
  // Split sizes that disagree across ranks: every rank fails, naming them; the group stays usable.
  Tensor x = tpu::zeros(Shape{2 * n, 2});
  std::vector<int64_t> even(size_t(n), 2), skew = even;
  skew[0] = 3;
  skew[1] = 1;
  int rc = expect_error([&] { tpu::dist::world()->all_to_all_single(x, x, even, rank == 0 ? skew : even); },
                      "rank 0 sends 6 element(s) to rank 0, which expects 4");
  // dtypes that differ: the header check names both calls.
  Tensor y = tpu::zeros(Shape{2 * n, 2}, tpu::TensorOptions(rank == 1 ? DType::bf16 : DType::f32));
  rc |= expect_error([&] { tpu::dist::world()->all_to_all_single(y, y, even, even); }, "disagree");
  uneven_single(n, rank, DType::f32, 7, false);
  return rc;
}

int scenario_die_a2a() {  // rank 1 dies before the call; the others fail within the timeout
  tpu::dist::barrier();
  if (tpu::dist::get_rank() == 1) _exit(7);
  const int n = tpu::dist::get_world_size();
  Tensor t = tpu::zeros(Shape{4 * n, 8});
  std::vector<int64_t> s(size_t(n), 4);
  return expect_error([&] { tpu::dist::world()->all_to_all_single(t, t, s, s); }, "tpu::dist all_to_all_single");
}

}  // namespace dist_test
