// The "compiled" scenario of the tpu::dist worker: collectives inside tpu::compile on cpu
// tensors over gloo. Each rank checks the compiled results against a naive reference it
// computes from every rank's (regenerable) inputs, and against the same function run eagerly.
#include <algorithm>
#include <string>
#include <tuple>

#include "tpucore/compile.h"
#include "worker_common.h"

using namespace dist_test;

namespace {

std::vector<float> input(int r, int salt, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 5 + r * 3 + salt * 7) % 9) - 4.f;
  return v;
}

std::tuple<Tensor, Tensor, Tensor> step(const Tensor& x) {
  const int n = tpu::dist::get_world_size();
  Tensor h = tpu::relu(x * 2 + 1);
  Tensor sum = h.clone();
  tpu::dist::all_reduce(sum, tpu::dist::ReduceOp::sum);
  Tensor gathered = tpu::empty(Shape{x.size(0) * n}, tpu::TensorOptions(x.dtype()));
  tpu::dist::all_gather_into_tensor(gathered, x);
  Tensor scattered = tpu::empty(Shape{x.size(0) / n}, tpu::TensorOptions(x.dtype()));
  tpu::dist::reduce_scatter_tensor(scattered, h, tpu::dist::ReduceOp::sum);
  Tensor avg = x * 1;
  tpu::dist::all_reduce_async(avg, tpu::dist::ReduceOp::avg).wait();
  return {sum * 3 + avg, gathered, scattered - 1};
}

}  // namespace

namespace dist_test {

int scenario_compiled() {
  const int n = tpu::dist::get_world_size(), me = tpu::dist::get_rank();
  const int64_t len = 24;
  auto f = tpu::compile(&step, {.name = "gloo_step", .fullgraph = true});
  for (int salt = 0; salt < 3; ++salt) {
    Tensor x = tpu::from_vector(input(me, salt, len), Shape{len});
    auto [s, g, sc] = f(x);
    auto [es, eg, esc] = step(x);
    std::vector<float> hs(size_t(len), 0.f), xs(size_t(len), 0.f), rg;
    for (int r = 0; r < n; ++r) {
      std::vector<float> xr = input(r, salt, len);
      for (int64_t i = 0; i < len; ++i) {
        hs[size_t(i)] += std::max(0.f, 2 * xr[size_t(i)] + 1);
        xs[size_t(i)] += xr[size_t(i)];
      }
      rg.insert(rg.end(), xr.begin(), xr.end());
    }
    std::vector<float> rs(static_cast<size_t>(len)), rsc;
    for (int64_t i = 0; i < len; ++i) rs[size_t(i)] = hs[size_t(i)] * 3 + xs[size_t(i)] / float(n);
    const int64_t blk = len / n;
    for (int64_t i = me * blk; i < (me + 1) * blk; ++i) rsc.push_back(hs[size_t(i)] - 1);
    const std::string at = " (salt " + std::to_string(salt) + ")";
    check(values(s) == rs, "compiled all_reduce sum + avg" + at);
    check(values(g) == rg, "compiled all_gather" + at);
    check(values(sc) == rsc, "compiled reduce_scatter" + at);
    check(values(es) == rs && values(eg) == rg && values(esc) == rsc, "eager" + at);
  }
  // all_to_all_single with uneven (and empty) splits inside tpu::compile: rank r sends
  // (r + 2 j) % 3 rows of 2 to rank j; row k of rank r holds 10 r + k in both columns.
  auto rows = [](int r, int j) -> int64_t { return (r + 2 * j) % 3; };
  std::vector<int64_t> in_s, out_s;
  int64_t ni = 0, no = 0;
  for (int j = 0; j < n; ++j) {
    in_s.push_back(rows(me, j));
    out_s.push_back(rows(j, me));
    ni += in_s.back();
    no += out_s.back();
  }
  auto a2a = [&](const Tensor& x) {
    Tensor o = tpu::empty(Shape{no, 2}, tpu::TensorOptions(x.dtype()));
    tpu::dist::world()->all_to_all_single(o, x * 3, out_s, in_s);
    return o + 1;
  };
  auto fa = tpu::compile(a2a, {.name = "gloo_a2a"});
  std::vector<float> xv, want;
  for (int64_t k = 0; k < ni; ++k) xv.insert(xv.end(), 2, float(10 * me + k));
  for (int j = 0; j < n; ++j) {
    int64_t first = 0;
    for (int k = 0; k < me; ++k) first += rows(j, k);
    for (int64_t k = first; k < first + rows(j, me); ++k) want.insert(want.end(), 2, float(3 * (10 * j + k) + 1));
  }
  Tensor xa = tpu::from_vector(xv, Shape{ni, 2});
  check(values(fa(xa)) == want, "compiled uneven all_to_all_single");
  check(values(fa(xa)) == want, "compiled uneven all_to_all_single (cached)");
  check(values(a2a(xa)) == want, "eager uneven all_to_all_single");
  const tpu::jit::Stats st = tpu::jit::stats();
  const tpu::jit::FunctionStats* fs = st.find("gloo_step");
  check(fs && fs->compiles == 1 && fs->hits == 2, "one compile, then cache hits");
  return 0;
}

}  // namespace dist_test
