#include "opinfo.h"
using namespace tpu;
TEST_CASE("smoke: arange reshape", "[core]") {
  auto a = arange(6).reshape({2, 3});
  CHECK(a.dtype() == DType::i32);
  CHECK(a.t().contiguous().to_vector<int32_t>() == std::vector<int32_t>{0, 3, 1, 4, 2, 5});
}
