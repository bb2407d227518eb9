// Scenario "collectives": every collective on every dtype, zero / one / odd sizes and
// non-contiguous views, against a naive reference computed from all ranks' regenerated inputs.
#include <fmt/format.h>

#include "worker_common.h"

namespace dist_test {

using tpu::dist::ReduceOp;

namespace {

const DType kDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::i8, DType::u8, DType::boolean};

struct Case {
  Shape shape;
  bool noncontig;
};
const Case kCases[] = {{Shape{0}, false}, {Shape{1}, false}, {Shape{7}, false}, {Shape{1023}, false},
                       {Shape{6, 5}, true}, {Shape{3, 0}, false}};

double reduce_ref(ReduceOp op, int n, DType d, const std::function<double(int)>& v) {
  double acc = v(0);
  for (int r = 1; r < n; ++r) {
    double x = v(r);
    switch (op) {
      case ReduceOp::sum: case ReduceOp::avg: acc += x; break;
      case ReduceOp::product: acc *= x; break;
      case ReduceOp::max: acc = std::max(acc, x); break;
      case ReduceOp::min: acc = std::min(acc, x); break;
    }
  }
  if (d == DType::boolean) {  // sum/max: any; product/min: all
    bool any = false, all = true;
    for (int r = 0; r < n; ++r) any = any || v(r) != 0, all = all && v(r) != 0;
    return (op == ReduceOp::product || op == ReduceOp::min) ? all : any;
  }
  return op == ReduceOp::avg ? as_dtype(acc, d) / n : acc;
}

void all_reduce_tests(int rank, int n, DType d, const Case& c, const std::string& tag) {
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::product};
  for (ReduceOp op : ops) {
    if (op == ReduceOp::avg && !tpu::is_floating(d)) continue;
    bool prod = op == ReduceOp::product;
    auto gen = [&](int r, int64_t k) { return prod ? pvalue(r, k, 1, d) : value(r, k, 1, d); };
    Tensor t = make(d, c.shape, [&](int64_t k) { return gen(rank, k); }, c.noncontig);
    tpu::dist::all_reduce(t, op);
    expect(t, [&](int64_t k) { return reduce_ref(op, n, d, [&](int r) { return as_dtype(gen(r, k), d); }); },
           fmt::format("all_reduce {} {}", tpu::dist::reduce_op_name(op), tag));
  }
}

void gather_tests(int rank, int n, DType d, const Case& c, const std::string& tag) {
  int64_t k = c.shape.numel();
  Tensor in = make(d, c.shape, [&](int64_t i) { return value(rank, i, 2, d); }, c.noncontig);
  // all_gather into a list (one output non-contiguous when the case is).
  std::vector<Tensor> outs;
  for (int r = 0; r < n; ++r) outs.push_back(make(d, c.shape, [](int64_t) { return 0; }, c.noncontig && r == 1));
  tpu::dist::all_gather(outs, in);
  for (int r = 0; r < n; ++r)
    expect(outs[static_cast<size_t>(r)], [&](int64_t i) { return value(r, i, 2, d); }, fmt::format("all_gather[{}] {}", r, tag));
  // all_gather_into_tensor: concatenated along dim 0.
  Shape cat = c.shape;
  cat[0] *= n;
  Tensor out = tpu::zeros(cat, tpu::TensorOptions(d));
  tpu::dist::all_gather_into_tensor(out, in);
  expect(out, [&](int64_t i) { return k == 0 ? 0 : value(static_cast<int>(i / k), i % k, 2, d); },
         "all_gather_into_tensor " + tag);
  // broadcast from the last rank.
  Tensor b = make(d, c.shape, [&](int64_t i) { return value(rank, i, 3, d); }, c.noncontig);
  tpu::dist::broadcast(b, n - 1);
  expect(b, [&](int64_t i) { return value(n - 1, i, 3, d); }, "broadcast " + tag);
}

void scatter_tests(int rank, int n, DType d, const Case& c, const std::string& tag) {
  Shape in_shape = c.shape;
  in_shape[0] *= n;  // rank r gets block r of the reduced input
  int64_t k = c.shape.numel();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
    if (op == ReduceOp::avg && !tpu::is_floating(d)) continue;
    Tensor in = make(d, in_shape, [&](int64_t i) { return value(rank, i, 4, d); }, c.noncontig);
    Tensor out = make(d, c.shape, [](int64_t) { return 0; }, c.noncontig);
    tpu::dist::reduce_scatter_tensor(out, in, op);
    expect(out, [&](int64_t i) {
      return reduce_ref(op, n, d, [&](int r) { return as_dtype(value(r, rank * k + i, 4, d), d); });
    }, fmt::format("reduce_scatter_tensor {} {}", tpu::dist::reduce_op_name(op), tag));
  }
  // all_to_all_single: block j of rank i's input lands in block i of rank j's output.
  Tensor in = make(d, in_shape, [&](int64_t i) { return value(rank, i, 5, d); }, c.noncontig);
  Tensor out = tpu::zeros(in_shape, tpu::TensorOptions(d));
  tpu::dist::world()->all_to_all_single(out, in);
  expect(out, [&](int64_t i) { return value(static_cast<int>(i / k), rank * k + i % k, 5, d); }, "all_to_all_single " + tag);
  // all_to_all with lists.
  std::vector<Tensor> ins, outs;
  for (int j = 0; j < n; ++j) {
    ins.push_back(make(d, c.shape, [&](int64_t i) { return value(rank, j * 100 + i, 6, d); }, c.noncontig));
    outs.push_back(make(d, c.shape, [](int64_t) { return 0; }, c.noncontig));
  }
  tpu::dist::all_to_all(outs, ins);
  for (int j = 0; j < n; ++j)
    expect(outs[static_cast<size_t>(j)], [&](int64_t i) { return value(j, rank * 100 + i, 6, d); },
           fmt::format("all_to_all[{}] {}", j, tag));
}

void p2p_tests(int rank, int n, DType d, const Case& c, const std::string& tag) {
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  Tensor mine = make(d, c.shape, [&](int64_t i) { return value(rank, i, 7, d); }, c.noncontig);
  Tensor got = make(d, c.shape, [](int64_t) { return 0; }, c.noncontig);
  auto s = tpu::dist::world()->send_async(mine, next, 3);
  tpu::dist::recv(got, prev, 3);
  s.wait();
  expect(got, [&](int64_t i) { return value(prev, i, 7, d); }, "send/recv ring " + tag);
}

}  // namespace

int scenario_collectives() {
  int rank = tpu::dist::get_rank(), n = tpu::dist::get_world_size();
  for (DType d : kDTypes)
    for (const Case& c : kCases) {
      std::string tag = fmt::format("{} {}{}", tpu::dtype_name(d), c.shape, c.noncontig ? " non-contiguous" : "");
      all_reduce_tests(rank, n, d, c, tag);
      gather_tests(rank, n, d, c, tag);
      scatter_tests(rank, n, d, c, tag);
      p2p_tests(rank, n, d, c, tag);
    }
  tpu::dist::barrier();
  return 0;
}

}  // namespace dist_test
