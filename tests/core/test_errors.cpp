// Table-driven bad calls: each must raise tpu::Error whose message names the op and the
// offending shapes or values, and the runtime must keep working afterwards.
#include <functional>

#include "testing.h"

using namespace tpu;

namespace {

struct BadCall {
  const char* what;
  std::function<void()> call;
  std::vector<std::string> must_mention;  // substrings the message must contain
};

Tensor f32(const Shape& s) { return zeros(s); }
Tensor i32(const Shape& s) { return zeros(s, DType::i32); }

std::vector<BadCall> bad_calls() {
  return {
      {"add with non-broadcastable shapes", [] { add(f32({2, 3}), f32({4})); }, {"add", "[2, 3]", "[4]"}},
      {"mul with non-broadcastable shapes", [] { mul(f32({5}), f32({2, 3})); }, {"mul", "[5]", "[2, 3]"}},
      {"where with non-broadcastable shapes",
       [] { where(zeros({3}, DType::boolean), f32({3}), f32({4})); }, {"where", "[4]"}},
      {"matmul inner dims differ", [] { matmul(f32({2, 3}), f32({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"}},
      {"matmul of a 0-d tensor", [] { matmul(f32({}), f32({3})); }, {"matmul"}},
      {"matmul batch dims not broadcastable", [] { matmul(f32({2, 2, 3}), f32({3, 3, 4})); }, {"matmul", "[2, 2, 3]"}},
      {"mm with a 3-D tensor", [] { mm(f32({2, 2, 2}), f32({2, 2})); }, {"mm", "[2, 2, 2]"}},
      {"bmm batch mismatch", [] { bmm(f32({2, 3, 4}), f32({3, 4, 5})); }, {"bmm", "[2, 3, 4]", "[3, 4, 5]"}},
      {"linear weight mismatch", [] { linear(f32({2, 3}), f32({4, 5})); }, {"linear", "[4, 5]"}},
      {"reshape to a wrong size", [] { reshape(f32({2, 3}), {4}); }, {"reshape", "[4]", "[2, 3]"}},
      {"reshape with two -1", [] { reshape(f32({2, 3}), {-1, -1}); }, {"reshape", "-1"}},
      {"view of a non-viewable layout", [] { view(f32({2, 3}).t(), {6}); }, {"view", "[6]"}},
      {"permute with too few dims", [] { permute(f32({2, 3}), {0}); }, {"permute", "[2, 3]"}},
      {"permute with a repeated dim", [] { permute(f32({2, 3}), {1, 1}); }, {"permute", "repeated"}},
      {"transpose dim out of range", [] { transpose(f32({2, 3}), 0, 2); }, {"transpose", "dim 2"}},
      {"unsqueeze dim out of range", [] { unsqueeze(f32({2}), 3); }, {"unsqueeze", "dim 3"}},
      {"flatten with start after end", [] { flatten(f32({2, 3, 4}), 2, 1); }, {"flatten"}},
      {"expand to an incompatible shape", [] { expand(f32({2, 3}), {4, 3}); }, {"expand", "[2, 3]", "[4, 3]"}},
      {"slice with step 0", [] { slice(f32({4}), 0, 0, 4, 0); }, {"slice", "step"}},
      {"select index out of range", [] { select(f32({2, 3}), 1, 3); }, {"select", "index 3"}},
      {"narrow past the end", [] { narrow(f32({5}), 0, 3, 4); }, {"narrow", "size 5"}},
      {"sum over a dim out of range", [] { sum(f32({2, 3}), {5}); }, {"sum", "dim 5"}},
      {"sum over a repeated dim", [] { sum(f32({2, 3}), {1, -1}); }, {"sum"}},
      {"mean of an integer tensor", [] { mean(i32({3})); }, {"mean", "i32"}},
      {"amax over an empty dim", [] { amax(f32({0, 3}), {0}); }, {"amax", "[0, 3]"}},
      {"argmax of an empty tensor", [] { argmax(f32({0})); }, {"argmax"}},
      {"softmax dim out of range", [] { softmax(f32({2, 3}), 2); }, {"softmax", "dim 2"}},
      {"layer_norm shape mismatch", [] { layer_norm(f32({2, 3}), {4}); }, {"layer_norm", "[4]", "[2, 3]"}},
      {"rms_norm weight mismatch", [] { rms_norm(f32({2, 3}), {3}, f32({4})); }, {"rms_norm", "[4]"}},
      {"cat of an empty list", [] { cat({}); }, {"cat"}},
      {"cat with mismatched sizes", [] { cat({f32({2, 3}), f32({2, 4})}, 0); }, {"cat", "[2, 3]", "[2, 4]"}},
      {"stack with mismatched shapes", [] { stack({f32({2}), f32({3})}); }, {"stack", "[2]", "[3]"}},
      {"split sizes that do not add up", [] { split(f32({5}), std::vector<int64_t>{2, 2}); }, {"split", "5"}},
      {"chunk into 0 pieces", [] { chunk(f32({4}), 0); }, {"chunk"}},
      {"index_select index out of range",
       [] { index_select(f32({3, 2}), 0, from_vector<int32_t>({0, 7}, {2})); }, {"index_select", "7"}},
      {"index_select with a float index", [] { index_select(f32({3, 2}), 0, f32({2})); }, {"index_select", "f32"}},
      {"gather index out of range", [] { gather(f32({2, 2}), 1, from_vector<int32_t>({0, 2, 1, 0}, {2, 2})); },
       {"gather", "2"}},
      {"scatter_add index shape larger than src",
       [] { scatter_add(f32({2, 2}), 0, i32({3, 2}), f32({2, 2})); }, {"scatter_add"}},
      {"embedding index out of range",
       [] { embedding(f32({4, 2}), from_vector<int32_t>({1, -1}, {2})); }, {"embedding", "-1"}},
      {"one_hot with too few classes", [] { one_hot(from_vector<int32_t>({0, 5}, {2}), 3); }, {"one_hot", "5"}},
      {"masked_fill with a non-bool mask", [] { masked_fill(f32({2}), f32({2}), 1.0); }, {"masked_fill", "f32"}},
      {"tril of a 1-D tensor", [] { tril(f32({3})); }, {"tril", "[3]"}},
      {"in-place add that would broadcast self", [] { Tensor a = f32({3}); a.add_(f32({2, 3})); }, {"add_", "[3]", "[2, 3]"}},
      {"in-place float result into an int tensor", [] { Tensor a = i32({3}); a.add_(f32({3})); }, {"add_", "i32", "f32"}},
      {"subtracting bool tensors", [] { sub(zeros({2}, DType::boolean), zeros({2}, DType::boolean)); }, {"sub", "bool"}},
      {"item of a multi-element tensor", [] { f32({2, 2}).item(); }, {"item", "[2, 2]"}},
      {"data<float> of an i32 tensor", [] { i32({2}).data<float>(); }, {"f32", "i32"}},
      {"from_vector with the wrong count", [] { from_vector<float>({1, 2, 3}, {2, 2}); }, {"from_vector", "[2, 2]"}},
      {"empty with a negative dim", [] { empty({2, -1}); }, {"empty", "-1"}},
      {"arange with step 0", [] { arange(0, 10, 0); }, {"arange", "step"}},
      {"arange that cannot reach its end", [] { arange(10, 0, 1); }, {"arange"}},
      {"linspace with negative steps", [] { linspace(0, 1, -2); }, {"linspace", "-2"}},
      {"randint with high <= low", [] { randint(5, 5, {2}); }, {"randint", "5"}},
      {"rand with an integer dtype", [] { rand({2}, DType::i32); }, {"rand", "i32"}},
      {"eye with a negative size", [] { eye(-1); }, {"eye", "-1"}},
      {"an undefined tensor input", [] { add(Tensor(), f32({1})); }, {"add", "undefined"}},
      {"a bad device string", [] { Device d("gpu:0"); }, {"gpu:0"}},
      {"a tpu device with no driver", [] { zeros({2}, TensorOptions(Device("tpu:0"))); }, {"tpu", "TPU_DRIVER_PATH"}},
      {"a bad dtype name", [] { parse_dtype("float64"); }, {"float64"}},
      {"more than 8 dims", [] { zeros(Shape(std::vector<int64_t>(9, 1))); }, {"9"}},
  };
}

}  // namespace

TEST_CASE("errors: bad calls raise tpu::Error naming the op and the offending values", "[errors]") {
  auto calls = bad_calls();
  CHECK(calls.size() >= 40);
  for (const BadCall& c : calls) {
    DYNAMIC_SECTION(c.what) {
      bool threw = false;
      std::string msg;
      try {
        c.call();
      } catch (const Error& e) {
        threw = true;
        msg = e.what();
      } catch (const std::exception& e) {
        FAIL("threw a non-tpu::Error exception: " << e.what());
      }
      INFO("message: " << msg);
      REQUIRE(threw);
      for (const std::string& s : c.must_mention) {
        INFO("expected the message to mention '" << s << "'");
        CHECK(msg.find(s) != std::string::npos);
      }
    }
  }
  // The runtime keeps working afterwards.
  Tensor a = arange(4).to(DType::f32).reshape({2, 2});
  Tensor b = matmul(a, a);
  CHECK(b.to_vector<float>() == std::vector<float>{2, 3, 6, 11});
}
