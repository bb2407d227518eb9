// The mixture-of-experts ops (grouped_matmul and its weight gradient, topk, moe_sort,
// moe_permute, moe_unpermute): OpInfo entries with naive double-loop references (run on every
// device by test_opinfo.cpp, gradients checked against finite differences by
// test_autograd_gradcheck.cpp), and cases of their own: empty, one-token and uneven groups,
// products large enough to run threaded, bf16, closed-form gradients and bad inputs.
#include "moe_test_util.h"
#include "ops/fallback.h"
#include "tpucore/autograd.h"

namespace tpu::testing {
namespace {

using L = Layout;
using namespace moe;

// ---- OpInfo entries; the last input carries the integer arguments ----
OpInfoRegistrar reg_grouped_matmul({
    .op = "grouped_matmul",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -1.0, 1.0); };
          return std::vector<OpSample>{
              {"uneven groups", {mk({7, 5}, L::contiguous), mk({3, 5, 4}, L::contiguous), counts_tensor({2, 4, 1}),
                                 params({0})}},
              {"empty and one-token groups, transposed w",
               {mk({4, 6}, L::contiguous), mk({5, 3, 6}, L::contiguous), counts_tensor({0, 1, 0, 3, 0}, DType::i32),
                params({1})}},
              {"strided x and w", {mk({6, 4}, L::transposed), mk({2, 4, 5}, L::sliced), counts_tensor({5, 1}),
                                   params({0})}},
              {"every row in one group", {mk({3, 2}, L::sliced), mk({4, 3, 2}, L::contiguous),
                                          counts_tensor({0, 0, 3, 0}), params({1})}},
              {"no rows", {mk({0, 3}, L::contiguous), mk({2, 3, 4}, L::contiguous), counts_tensor({0, 0}), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return grouped_matmul(in[0], in[1], in[2], params_of(in[3])[0] != 0); },
    .reference = [](const std::vector<Ref>& r, DType) {
      return grouped_matmul_ref(r[0], r[1], ints(r[2]), params_of(r[3])[0] != 0);
    },
});

OpInfoRegistrar reg_weight_grad({
    .op = "grouped_matmul_weight_grad",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -1.0, 1.0); };
          return std::vector<OpSample>{
              {"uneven groups", {mk({7, 3}, L::contiguous), mk({7, 4}, L::contiguous), counts_tensor({3, 0, 4}),
                                 params({0})}},
              {"one-token groups, transposed", {mk({3, 5}, L::transposed), mk({3, 2}, L::sliced),
                                                counts_tensor({1, 1, 0, 1}, DType::i32), params({1})}},
              {"no rows", {mk({0, 2}, L::contiguous), mk({0, 3}, L::contiguous), counts_tensor({0, 0}), params({1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) {
      return grouped_matmul_weight_grad(in[0], in[1], in[2], params_of(in[3])[0] != 0);
    },
    .reference = [](const std::vector<Ref>& r, DType) {
      return weight_grad_ref(r[0], r[1], ints(r[2]), params_of(r[3])[0] != 0);
    },
});

OpInfoRegistrar reg_topk({
    .op = "topk",
    .dtypes = {DType::f32, DType::bf16, DType::i32},
    .samples =
        [](DType dt, Generator& g) {
          auto mk = [&](const Shape& s, L l) { return make_input(g, s, dt, l, -8.0, 8.0); };
          return std::vector<OpSample>{
              {"top 2 of 8", {mk({5, 8}, L::contiguous), params({2})}},
              {"transposed, top 3 of 4", {mk({3, 4}, L::transposed), params({3})}},
              {"all of a sliced row", {mk({2, 5}, L::sliced), params({5})}},
              {"k 0", {mk({2, 3}, L::contiguous), params({0})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return std::get<0>(topk(in[0], params_of(in[1])[0])); },
    .reference = [](const std::vector<Ref>& r, DType) { return topk_ref(r[0], params_of(r[1])[0], false); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_sort({
    .op = "moe_sort",
    .dtypes = {DType::i64, DType::i32},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"8 tokens x top 2 of 4", {make_input(g, {8, 2}, dt, L::contiguous, 0.0, 4.0), params({4})}},
              {"transposed ids, unused experts", {make_input(g, {2, 5}, dt, L::transposed, 0.0, 3.0), params({6})}},
              {"no tokens", {make_input(g, {0, 2}, dt, L::contiguous, 0.0, 2.0), params({3})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) {
      auto [order, counts] = moe_sort(in[0], params_of(in[1])[0]);
      return cat({order, counts}, 0);
    },
    .reference = [](const std::vector<Ref>& r, DType) { return moe_sort_ref(r[0], params_of(r[1])[0]); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_permute({
    .op = "moe_permute",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"5 tokens x top 2", {make_input(g, {5, 3}, dt, L::contiguous), random_order(g, 10), params({2})}},
              {"transposed x, i32 order, top 3", {make_input(g, {2, 4}, dt, L::transposed),
                                                  random_order(g, 6, DType::i32), params({3})}},
              {"top 1", {make_input(g, {4, 2}, dt, L::sliced), random_order(g, 4), params({1})}},
          };
        },
    .run = [](const std::vector<Tensor>& in) { return moe_permute(in[0], in[1], params_of(in[2])[0]); },
    .reference = [](const std::vector<Ref>& r, DType) { return permute_ref(r[0], ints(r[1]), params_of(r[2])[0]); },
    .tol = exact_tol,
});

OpInfoRegistrar reg_moe_unpermute({
    .op = "moe_unpermute",
    .dtypes = {DType::f32, DType::bf16},
    .samples =
        [](DType dt, Generator& g) {
          return std::vector<OpSample>{
              {"5 tokens x top 2", {make_input(g, {10, 3}, dt, L::contiguous), random_order(g, 10),
                                    make_input(g, {5, 2}, dt, L::contiguous, 0.0, 1.0), params({2, 1})}},
              {"strided y and weights, top 3", {make_input(g, {6, 4}, dt, L::transposed), random_order(g, 6, DType::i32),
                                                make_input(g, {2, 3}, dt, L::sliced, 0.0, 1.0), params({3, 1})}},
              {"no weights", {make_input(g, {4, 2}, dt, L::contiguous), random_order(g, 4),
                              make_input(g, {2, 2}, dt, L::contiguous), params({2, 0})}},
          };
        },
    // The second argument: whether the weights are passed (else weights of one).
    .run = [](const std::vector<Tensor>& in) {
      const auto p = params_of(in[3]);
      return moe_unpermute(in[0], in[1], p[1] ? in[2] : Tensor(), p[0]);
    },
    .reference = [](const std::vector<Ref>& r, DType) {
      const auto p = params_of(r[3]);
      return unpermute_ref(r[0], ints(r[1]), p[1] ? &r[2] : nullptr, p[0]);
    },
});

}  // namespace
}  // namespace tpu::testing
