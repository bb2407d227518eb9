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
  const tpu::jit::Stats st = tpu::jit::stats();
  const tpu::jit::FunctionStats* fs = st.find("gloo_step");
  check(fs && fs->compiles == 1 && fs->hits == 2, "one compile, then cache hits");
  return 0;
}

}  // namespace dist_test
