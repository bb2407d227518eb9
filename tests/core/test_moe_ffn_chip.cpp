// The fused mixture-of-experts node moe_ffn on the simulated chip (codegen/moe_ffn_kernel.cpp):
// one program over all experts against the naive per-token loop in double (moe_ffn_ref), for
// routings with empty, one-token and uneven experts, experts split over several row tiles and
// a launch split over token chunks; a new routing or token count builds no new program; f16
// runs the counted chain; a compiled MoE block for inference runs one moe_ffn program.
#include <map>

#include "codegen/moe_ffn_kernel.h"
#include "codegen_testing.h"
#include "moe_test_util.h"
#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/nn/moe.h"

namespace tpu::testing {
namespace {

using namespace moe;

Tensor ffn_call(const Tensor& x, const Tensor& ids, const Tensor& w, const Tensor& w1, const Tensor& w2) {
  return ops::call(*ops::find_op("moe_ffn"), {x, ids, w, w1, w2}, {{"num_experts", w1.size(0)}, {"top_k", ids.size(1)}});
}

uint64_t ffn_kernel_runs(const char* k) {
  ChipRunProbe::sync_all();
  const codegen::CodegenStats s = codegen::stats();
  return s.runs_by_kernel.count(k) ? s.runs_by_kernel.at(k) : 0;
}

// Uneven random ids: each token's k experts distinct, drawn from the first `used` experts.
std::vector<int64_t> ffn_random_ids(Generator& g, int64_t T, int64_t k, int64_t used) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> pick;
    while (static_cast<int64_t>(pick.size()) < k) {
      const auto e = std::min(used - 1, static_cast<int64_t>(g.next_double() * static_cast<double>(used)));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    ids.insert(ids.end(), pick.begin(), pick.end());
  }
  return ids;
}

struct FfnCase {
  const char* name;
  int64_t T, H, F, E, k;
  std::vector<int64_t> ids;  // empty: ffn_random_ids over all experts
};

void ffn_check_case(Generator& g, const FfnCase& c, DType dt, const Device& dev) {
  const std::vector<int64_t> ids = c.ids.empty() ? ffn_random_ids(g, c.T, c.k, c.E) : c.ids;
  const Tensor x = make_input(g, {c.T, c.H}, dt, Layout::contiguous, -1.0, 1.0);
  const Tensor w = make_input(g, {c.T, c.k}, dt, Layout::contiguous, 0.0, 1.0);
  const Tensor w1 = make_input(g, {c.E, 2 * c.F, c.H}, dt, Layout::contiguous, -0.5, 0.5);
  const Tensor w2 = make_input(g, {c.E, c.H, c.F}, dt, Layout::contiguous, -0.5, 0.5);
  const Ref ref = moe_ffn_ref(ref_of(x), ids, ref_of(w), ref_of(w1), ref_of(w2));
  INFO(c.name << " " << dtype_name(dt));
  const ChipRunProbe probe;
  const uint64_t fused0 = ffn_kernel_runs("moe_ffn"), gmm0 = ffn_kernel_runs("grouped_matmul");
  const uint64_t chain0 = codegen::moe_ffn_chain_fallbacks();
  const Tensor out = ffn_call(x.to(dev), from_vector(ids, Shape{c.T, c.k}).to(dev), w.to(dev), w1.to(dev), w2.to(dev));
  REQUIRE(out.device() == dev);
  CHECK(out.dtype() == dt);
  CHECK(probe.new_fallbacks() == 0);
  CHECK(ffn_kernel_runs("moe_ffn") > fused0);
  CHECK(ffn_kernel_runs("grouped_matmul") == gmm0);  // not the chain
  CHECK(codegen::moe_ffn_chain_fallbacks() == chain0);
  check_close(out.to(Device()), ref, dt == DType::f32 ? Tol{2e-5, 2e-5} : Tol{3e-2, 3e-2}, c.name);
}

TEST_CASE("moe_ffn on the chip: one program equals the naive loop (empty, one-token, uneven experts)",
          "[moe][codegen]") {
  TinySim tiny;
  Generator g(5);
  const std::vector<FfnCase> cases{
      {"uneven, random", 7, 32, 48, 4, 2, {}},
      // experts 1 and 3 empty
      {"empty experts", 7, 32, 48, 4, 2, {0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0, 0, 2}},
      // experts 1 and 3 one token each, expert 0 twelve
      {"one-token experts", 7, 32, 48, 4, 2, {0, 1, 0, 2, 2, 0, 0, 3, 0, 2, 2, 0, 0, 2}},
      {"top 1, one expert takes all", 5, 32, 48, 4, 1, {3, 3, 3, 3, 3}},
      // 40 slots of expert 0: several row tiles of one expert, the last a partial MXU block
      {"one expert over several row tiles", 40, 32, 48, 4, 2, {}},
  };
  for (DType dt : {DType::f32, DType::bf16})
    for (FfnCase c : cases) {
      if (std::string(c.name) == "one expert over several row tiles") {
        c.ids.clear();
        for (int64_t t = 0; t < c.T; ++t) {
          c.ids.push_back(0);
          c.ids.push_back(1 + t % 3);
        }
      }
      ffn_check_case(g, c, dt, tiny.dev());
    }
}

TEST_CASE("moe_ffn on the chip: the intermediate width in chunks, a different output width, token chunks",
          "[moe][codegen]") {
  TinySim tiny;
  Generator g(9);
  // F = 256 leaves too little VMEM on the tiny chip for whole-width weights: the program walks
  // F in chunks (the weights of the next chunk loading during this one).
  ffn_check_case(g, {"intermediate in chunks", 9, 32, 256, 3, 2, {}}, DType::f32, tiny.dev());
  ffn_check_case(g, {"intermediate in chunks", 9, 32, 256, 3, 2, {}}, DType::bf16, tiny.dev());
  // gate_up [E, 2F, H] with down [E, O, F], O != H.
  {
    const int64_t T = 6, H = 16, F = 24, O = 40, E = 3, k = 2;
    const std::vector<int64_t> ids = ffn_random_ids(g, T, k, E);
    const Tensor x = make_input(g, {T, H}, DType::f32, Layout::contiguous, -1.0, 1.0);
    const Tensor w = make_input(g, {T, k}, DType::f32, Layout::contiguous, 0.0, 1.0);
    const Tensor w1 = make_input(g, {E, 2 * F, H}, DType::f32, Layout::contiguous, -0.5, 0.5);
    const Tensor w2 = make_input(g, {E, O, F}, DType::f32, Layout::contiguous, -0.5, 0.5);
    const Tensor out = ffn_call(x.to(tiny.dev()), from_vector(ids, Shape{T, k}).to(tiny.dev()), w.to(tiny.dev()),
                               w1.to(tiny.dev()), w2.to(tiny.dev()));
    check_close(out.to(Device()), moe_ffn_ref(ref_of(x), ids, ref_of(w), ref_of(w1), ref_of(w2)), {2e-5, 2e-5},
                "output width 40");
  }
  // More tokens than one launch's accumulator holds on the tiny chip (about 1150 at H = 32,
  // F = 48): the same program launched per chunk of tokens.
  const uint64_t runs0 = ffn_kernel_runs("moe_ffn");
  ffn_check_case(g, {"two token chunks", 1200, 32, 48, 4, 2, {}}, DType::f32, tiny.dev());
  CHECK(ffn_kernel_runs("moe_ffn") - runs0 >= 2);
}

TEST_CASE("moe_ffn on the chip: a new routing or token count builds no new program", "[moe][codegen]") {
  TinySim tiny;
  Generator g(11);
  const int64_t H = 32, F = 48, E = 4, k = 2;
  const Tensor w1 = make_input(g, {E, 2 * F, H}, DType::f32, Layout::contiguous, -0.5, 0.5).to(tiny.dev());
  const Tensor w2 = make_input(g, {E, H, F}, DType::f32, Layout::contiguous, -0.5, 0.5).to(tiny.dev());
  auto run = [&](int64_t T, std::vector<int64_t> ids) {
    const Tensor x = make_input(g, {T, H}, DType::f32, Layout::contiguous, -1.0, 1.0);
    const Tensor w = make_input(g, {T, k}, DType::f32, Layout::contiguous, 0.0, 1.0);
    const Tensor out = ffn_call(x.to(tiny.dev()), from_vector(ids, Shape{T, k}).to(tiny.dev()), w.to(tiny.dev()), w1, w2);
    check_close(out.to(Device()), moe_ffn_ref(ref_of(x), ids, ref_of(w), ref_of(w1), ref_of(w2)), {2e-5, 2e-5}, "values");
  };
  run(7, ffn_random_ids(g, 7, k, E));  // builds the program
  ChipRunProbe::sync_all();
  const uint64_t built = codegen::stats().programs_built;
  const size_t cached = codegen::cached_programs(tiny.dev());
  const uint64_t runs0 = ffn_kernel_runs("moe_ffn");
  run(7, {1, 3, 1, 3, 3, 1, 1, 3, 3, 1, 1, 3, 1, 3});  // another routing: experts 0 and 2 empty
  run(3, ffn_random_ids(g, 3, k, E));                      // fewer tokens
  run(13, ffn_random_ids(g, 13, k, 2));                    // more tokens, two experts
  ChipRunProbe::sync_all();
  CHECK(ffn_kernel_runs("moe_ffn") - runs0 == 3);
  CHECK(codegen::stats().programs_built == built);
  CHECK(codegen::cached_programs(tiny.dev()) == cached);
}

TEST_CASE("moe_ffn on the chip: f16 and a strided x run the counted chain, strided ids do not, bad ids are errors", "[moe][codegen]") {
  TinySim tiny;
  Generator g(13);
  const int64_t T = 5, H = 8, F = 6, E = 3, k = 2;
  const std::vector<int64_t> ids = ffn_random_ids(g, T, k, E);
  const Tensor x = make_input(g, {T, H}, DType::f16, Layout::contiguous, -1.0, 1.0);
  const Tensor w = make_input(g, {T, k}, DType::f16, Layout::contiguous, 0.0, 1.0);
  const Tensor w1 = make_input(g, {E, 2 * F, H}, DType::f16, Layout::contiguous, -0.5, 0.5);
  const Tensor w2 = make_input(g, {E, H, F}, DType::f16, Layout::contiguous, -0.5, 0.5);
  const Device d = tiny.dev();
  const uint64_t chain0 = codegen::moe_ffn_chain_fallbacks();
  const Tensor out = ffn_call(x.to(d), from_vector(ids, Shape{T, k}).to(d), w.to(d), w1.to(d), w2.to(d));
  CHECK(codegen::moe_ffn_chain_fallbacks() == chain0 + 1);
  check_close(out.to(Device()), moe_ffn_ref(ref_of(x), ids, ref_of(w), ref_of(w1), ref_of(w2)), {1e-2, 1e-2}, "f16");
  // i32 ids stored transposed go through the program; a transposed x runs the chain.
  {
    const Tensor xf = x.to(DType::f32), wf = w.to(DType::f32), w1f = w1.to(DType::f32), w2f = w2.to(DType::f32);
    std::vector<int64_t> ids_kt(ids.size());  // [k, T]
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) ids_kt[static_cast<size_t>(j * T + t)] = ids[static_cast<size_t>(t * k + j)];
    const Tensor idt = transpose(from_vector(ids_kt, Shape{k, T}).to(DType::i32).to(d), 0, 1);
    REQUIRE(!idt.is_contiguous());
    const Ref ref = moe_ffn_ref(ref_of(xf), ids, ref_of(wf), ref_of(w1f), ref_of(w2f));
    const ChipRunProbe probe;
    const uint64_t fused0 = ffn_kernel_runs("moe_ffn");
    check_close(ffn_call(xf.to(d), idt, wf.to(d), w1f.to(d), w2f.to(d)).to(Device()), ref, {2e-5, 2e-5}, "i32 ids, strided");
    CHECK(ffn_kernel_runs("moe_ffn") == fused0 + 1);
    CHECK(probe.new_fallbacks() == 0);
    const Tensor xt = transpose(transpose(xf, 0, 1).contiguous().to(d), 0, 1);
    REQUIRE(!xt.is_contiguous());
    check_close(ffn_call(xt, idt, wf.to(d), w1f.to(d), w2f.to(d)).to(Device()), ref, {2e-5, 2e-5}, "strided x");
    CHECK(codegen::moe_ffn_chain_fallbacks() == chain0 + 2);
  }
  std::vector<int64_t> bad = ids;
  bad[3] = E;
  expect_error(
      [&] {
        ffn_call(x.to(DType::f32).to(d), from_vector(bad, Shape{T, k}).to(d), w.to(DType::f32).to(d),
                w1.to(DType::f32).to(d), w2.to(DType::f32).to(d));
      },
      {"moe_ffn", "out of range"});
}

TEST_CASE("moe_ffn on the chip: a compiled MoE block for inference runs one moe_ffn program, no chain op",
          "[moe][codegen][jit]") {
  TinySim tiny;
  Generator g(17);
  nn::MoEConfig mc;
  mc.hidden = 16;
  mc.intermediate = 24;
  mc.num_experts = 4;
  mc.top_k = 2;
  nn::SparseMoE blk(mc, &g);
  blk.to(tiny.dev());
  blk.eval();
  NoGradGuard ng;
  auto f = compile([&](const Tensor& x) { return blk.forward(x); }, {.name = "moe_ffn_chip_block", .fullgraph = true});
  const Tensor w1 = blk.experts->gate_up_proj.to(Device()), w2 = blk.experts->down_proj.to(Device());
  uint64_t built = 0;
  for (int c = 0; c < 3; ++c) {
    const Tensor x = make_input(g, {6, mc.hidden}, DType::f32, Layout::contiguous, -1.0, 1.0).to(tiny.dev());
    const nn::SparseMoE::Routing r = blk.route(x);  // eager, on the chip
    const std::vector<int64_t> ids = r.experts.to(Device()).to(DType::i64).contiguous().to_vector<int64_t>();
    const Ref ref = moe_ffn_ref(ref_of(x.to(Device())), ids, ref_of(r.weights.to(Device())), ref_of(w1), ref_of(w2));
    std::map<std::string, uint64_t> before;
    for (const char* k : {"moe_ffn", "moe_sort", "moe_permute", "grouped_matmul", "moe_unpermute"})
      before[k] = ffn_kernel_runs(k);
    const ChipRunProbe probe;
    const Tensor y = f(x);
    CHECK(probe.new_fallbacks() == 0);
    CHECK(ffn_kernel_runs("moe_ffn") - before["moe_ffn"] == 1);
    for (const char* k : {"moe_sort", "moe_permute", "grouped_matmul", "moe_unpermute"}) {
      INFO(k);
      CHECK(ffn_kernel_runs(k) == before[k]);
    }
    check_close(y.to(Device()), ref, {2e-5, 2e-5}, "compiled block");
    ChipRunProbe::sync_all();
    if (c == 0) built = codegen::stats().programs_built;
  }
  // Later calls (new routings) built no program and traced no graph.
  CHECK(codegen::stats().programs_built == built);
  const jit::Stats st = jit::stats();
  const jit::FunctionStats* fs = st.find("moe_ffn_chip_block");
  REQUIRE(fs != nullptr);
  CHECK(fs->compiles == 1);
}

}  // namespace
}  // namespace tpu::testing
