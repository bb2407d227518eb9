// Tensor parallelism of quantized linears (parallelize_module over nn::QuantizedLinear): a
// two-layer MLP, the first layer column-parallel and the second row-parallel, in int8 (per-row
// scales), int4 (group scales [N, K / group]) and fp8 (per-row, and block scales), against the
// same unsharded layers in this process and against a naive loop over the dequantized weights;
// a Qwen3-shaped CausalLM with int8 / int4 linears split by causal_lm_plan against its unsharded
// logits.
// A split that cuts an int4 group or an fp8 scale block is a tpu::Error naming the numbers.
#include <cstring>

#include "model.h"
#include "tpucore/models.h"
#include "tpucore/nn/parallel/parallelize.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/quantize.h"

namespace sharded_test {

using namespace tpu::nn::parallel;

namespace {

// y = down(relu(up(x))): hidden -> inter -> hidden.
struct QMLP : nn::Module {
  std::shared_ptr<nn::Linear> up, down;
  QMLP(std::shared_ptr<nn::Linear> u, std::shared_ptr<nn::Linear> d) {
    up = register_module("up", std::move(u));
    down = register_module("down", std::move(d));
  }
  Tensor forward(const Tensor& x) override { return (*down)(relu((*up)(x))); }
};

// A float layer whose rows and columns come in blocks of 16 of scale 0.25, 0.75, 1.25, 1.75
// (repeating), so neighbouring rows' scales, int4 groups and fp8 blocks clearly differ: a shard
// reading another part's scales is far off.
std::shared_ptr<nn::Linear> float_linear(int64_t in, int64_t out, uint64_t seed) {
  Generator g(seed);
  auto l = std::make_shared<nn::Linear>(in, out, true, &g);
  NoGradGuard ng;
  std::vector<float> col(static_cast<size_t>(in)), row(static_cast<size_t>(out));
  for (int64_t k = 0; k < in; ++k) col[size_t(k)] = 0.25f + 0.5f * float((k / 16) % 4);
  for (int64_t j = 0; j < out; ++j) row[size_t(j)] = 0.25f + 0.5f * float((j / 16) % 4);
  l->weight.copy_(mul(mul(l->weight, from_vector(col, Shape{1, in})), from_vector(row, Shape{out, 1})));
  l->bias.copy_(randn(Shape{out}, {}, &g) * 0.1);
  return l;
}

// An fp8 layer with block scales: the e4m3 bytes of `src`'s weight and positive scales of
// blocks bn x bk drawn from the seed, about those of quantize_fp8 (distinct per block, not fitted).
std::shared_ptr<nn::Linear> fp8_block_linear(const nn::Linear& src, int64_t bn, int64_t bk, uint64_t seed) {
  Generator g(seed);
  const Fp8Weight w = quantize_fp8(src.weight.detach());
  const int64_t N = src.weight.size(0), K = src.weight.size(1);
  const Tensor scale = add(mul(rand(Shape{(N + bn - 1) / bn, (K + bk - 1) / bk}, {}, &g), 2e-4), 1e-4);
  return std::make_shared<nn::QuantizedLinear>(w.q, scale, src.bias.detach(), bn, bk);
}

// The dequantized weight [N, K] of a quantized layer as f32 (each kind's own dequantize).
Tensor dequantized(const nn::QuantizedLinear& q) {
  switch (q.kind) {
    case nn::WeightQuant::int8: return dequantize_int8(q.weight, q.weight_scale);
    case nn::WeightQuant::int4: return dequantize_int4(q.weight, q.weight_scale);
    default:
      return q.block_n > 0 ? dequantize_fp8(q.weight, q.weight_scale, q.block_n, q.block_k)
                           : dequantize_fp8(q.weight, q.weight_scale);
  }
}

// x W^T + b by loops over host vectors (x [M, K], W [N, K]).
std::vector<float> naive_linear(const std::vector<float>& x, const Tensor& w, const Tensor& b, int64_t M) {
  const int64_t N = w.size(0), K = w.size(1);
  const std::vector<float> wv = w.contiguous().to_vector<float>(), bv = b.to_vector<float>();
  std::vector<float> y(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t o = 0; o < N; ++o) {
      double s = bv[size_t(o)];
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(i * K + k)]) * wv[size_t(o * K + k)];
      y[size_t(i * N + o)] = float(s);
    }
  return y;
}

double max_diff(const Tensor& a, const std::vector<float>& b) {
  const std::vector<float> av = a.contiguous().to_vector<float>();
  if (av.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < av.size(); ++i) m = std::max(m, std::fabs(double(av[i]) - b[i]));
  return m;
}

// One format: the unsharded model's output, the naive loop over its dequantized weights, then
// the model parallelized over `tp` (up colwise, down rowwise) on the same input.
void check_layers(const dist::ProcessGroupPtr& tp, const std::string& what, double tol,  // relative
                  const std::function<std::shared_ptr<nn::Linear>(const nn::Linear&, bool)>& quant) {
  const int64_t hidden = 128, inter = 64, M = 5;
  const auto up_f = float_linear(hidden, inter, 11), down_f = float_linear(inter, hidden, 12);
  auto model = std::make_shared<QMLP>(quant(*up_f, true), quant(*down_f, false));
  const auto& qu = dynamic_cast<const nn::QuantizedLinear&>(*model->up);
  const auto& qd = dynamic_cast<const nn::QuantizedLinear&>(*model->down);
  Generator g(13);
  const Tensor x = randn(Shape{M, hidden}, {}, &g);
  // Reference: the naive loop over the dequantized weights (independent of linear_int8 / int4 /
  // fp8 and of any sharding).
  std::vector<float> h = naive_linear(x.to_vector<float>(), dequantized(qu), qu.bias, M);
  for (float& v : h) v = std::max(v, 0.0f);
  const std::vector<float> want = naive_linear(h, dequantized(qd), qd.bias, M);
  const Tensor whole = (*model)(x);
  tol *= std::max(1.0, max_abs(whole));  // relative to the output's size
  const double d0 = max_diff(whole, want);
  check(d0 < tol, fmt::format("{}: the unsharded layers equal the naive loop (max diff {})", what, d0));
  const int64_t up_scale_rows = qu.weight_scale.size(0);
  parallelize_module(*model, tp, {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
  const int n = tp->size();
  const auto& su = dynamic_cast<const nn::QuantizedLinear&>(*model->up);
  const auto& sd = dynamic_cast<const nn::QuantizedLinear&>(*model->down);
  check(su.weight.size(0) == inter / n && su.weight_scale.size(0) == up_scale_rows / n,
        what + ": the column shard holds its rows' scales");
  check(sd.in_features == inter / n, what + ": the row shard takes its block of the input features");
  const Tensor got = (*model)(x);
  const double d = max_diff(got, want);
  check(d < tol, fmt::format("{}: {} ranks equal the unsharded layers (max diff {})", what, n, d));
  const double d1 = max_diff(got, whole.to_vector<float>());
  check(d1 < tol / 4, fmt::format("{}: the sharded output equals the unsharded model's (max diff {})", what, d1));
}

// A Qwen3-shaped CausalLM with int8 or int4 decoder linears, parallelized by causal_lm_plan:
// the logits equal the unsharded quantized model's.
void check_causal_lm(const dist::ProcessGroupPtr& tp, nn::WeightQuant kind) {
  const std::string what = fmt::format("causal_lm_plan over {} linears", nn::weight_quant_name(kind));
  Generator g(17);
  auto lm = std::make_shared<models::CausalLM>(
      models::ModelConfig::from_json(
          R"({"model_type": "qwen3", "vocab_size": 40, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false})"),
      &g);
  models::quantize_causal_lm(*lm, kind, 32);
  const Tensor ids = from_vector(std::vector<int64_t>{1, 7, 3, 30, 12, 5, 9, 2}, Shape{2, 4});
  NoGradGuard ng;
  const Tensor whole = (*lm)(ids);
  parallelize_module(*lm, tp, causal_lm_plan(*lm));
  const Tensor got = (*lm)(ids);
  check(got.shape() == whole.shape(), what + ": logits of the unsharded shape");
  const double d = max_diff(got, whole.to_vector<float>()), tol = 1e-3 * std::max(1.0, max_abs(whole));
  check(d < tol, fmt::format("{}: 2 ranks equal the unsharded model (max diff {}, tolerance {})", what, d, tol));
}

}  // namespace

int scenario_tp_quant() {
  auto tp = dist::world();
  using nn::WeightQuant;
  auto check_format = [&](const std::string& what, double tol, const auto& quant) {
    try {
      check_layers(tp, what, tol, quant);
    } catch (const std::exception& e) {
      check(false, what + ": " + e.what());
    }
  };
  check_format("int8", 2e-2, [](const nn::Linear& l, bool) {
    return std::make_shared<nn::QuantizedLinear>(l, WeightQuant::int8);
  });
  check_format("int4 group 32", 2e-2, [](const nn::Linear& l, bool) {
    return std::make_shared<nn::QuantizedLinear>(l, WeightQuant::int4, 32);
  });
  check_format("fp8 per row", 2e-3, [](const nn::Linear& l, bool) {
    return std::make_shared<nn::QuantizedLinear>(l, WeightQuant::fp8);
  });
  check_format("fp8 blocks 16x32", 2e-3, [](const nn::Linear& l, bool col) {
    return fp8_block_linear(l, 16, 32, col ? 21 : 22);
  });

  for (auto kind : {WeightQuant::int8, WeightQuant::int4}) {
    try {
      check_causal_lm(tp, kind);
    } catch (const std::exception& e) {
      check(false, std::string("causal_lm_plan: ") + e.what());
    }
  }

  // Splits that cut a group or a block: a tpu::Error naming the numbers, the layer untouched.
  const auto wide = float_linear(128, 64, 31);  // in 128, out 64
  {
    auto q = std::make_shared<nn::QuantizedLinear>(*wide, WeightQuant::int4, 128);
    auto m = std::make_shared<QMLP>(q, std::make_shared<nn::QuantizedLinear>(*float_linear(64, 128, 32), WeightQuant::int8));
    check_error([&] { parallelize_module(*m, tp, {{"up", RowwiseParallel()}}); }, "cuts a group of 128",
                "int4 row split inside a group");
    check(q->in_features == 128 && q->weight.size(1) == 64, "the refused int4 layer keeps its weight");
  }
  {
    auto q = fp8_block_linear(*wide, 64, 32, 33);  // 64 rows: 32 per rank cut the one row block
    auto m = std::make_shared<QMLP>(q, std::make_shared<nn::QuantizedLinear>(*float_linear(64, 128, 34), WeightQuant::int8));
    check_error([&] { parallelize_module(*m, tp, {{"up", ColwiseParallel()}}); }, "cuts a block of 64 rows",
                "fp8 column split inside a block");
    check(q->weight.size(0) == 64, "the refused fp8 layer keeps its weight");
  }
  {
    auto q = fp8_block_linear(*wide, 16, 128, 35);  // 128 input features per block
    auto m = std::make_shared<QMLP>(q, std::make_shared<nn::QuantizedLinear>(*float_linear(64, 128, 36), WeightQuant::int8));
    check_error([&] { parallelize_module(*m, tp, {{"up", RowwiseParallel()}}); }, "cuts a block of 128 columns",
                "fp8 row split inside a block");
  }
  return 0;
}

}  // namespace sharded_test
