// Bad inputs from a sweep of the API: shapes whose element count overflows, ranges too long for
// a tensor, environment settings with invalid values, and the default generator shared by
// several threads. Each must be a tpu::Error (or a warning) naming what was wrong, and the
// runtime stays usable afterwards.
#include <algorithm>
#include <thread>

#include "testing.h"

namespace tpu::testing {

TEST_CASE("hardening: element counts that overflow are errors, not wrapped sizes (item 9)", "[hardening]") {
  const Shape huge{int64_t{1} << 33, int64_t{1} << 31};  // 2^64 elements: wraps to 0 in int64
  expect_error([&] { (void)huge.numel(); }, {"[8589934592, 2147483648]", "overflow"});
  CHECK(Shape({0, int64_t{1} << 62, int64_t{1} << 62}).numel() == 0);  // a zero dim wins
  CHECK(Shape({int64_t{1} << 31, int64_t{1} << 31}).numel() == int64_t{1} << 62);
  expect_error([&] { (void)empty(huge); }, {"empty", "[8589934592, 2147483648]"});
  expect_error([&] { (void)empty(huge, Device("sim:0")); }, {"empty", "[8589934592, 2147483648]"});
  expect_error([&] { (void)zeros(huge); }, {"[8589934592, 2147483648]"});
  expect_error([&] { (void)empty({int64_t{1} << 40, int64_t{1} << 10}); }, {"empty", "limit"});
  // A view whose element count overflows is refused where it is made.
  expect_error([&] { (void)ones({1, 1}).expand(huge); }, {"expand", "[8589934592, 2147483648]"});
  expect_error([&] { (void)ones({1, 1}, Device("sim:0")).expand(huge); }, {"expand"});
  expect_error([&] { (void)ones({1}).reshape({int64_t{1} << 33, int64_t{1} << 31}); }, {"reshape"});
  // Still usable.
  CHECK(ones({2, 3}).sum().item<float>() == 6.0f);
  CHECK(ones({2, 3}, Device("sim:0")).sum().item<float>() == 6.0f);
}

TEST_CASE("hardening: arange past the element limit names arange and the limit (item 13)", "[hardening]") {
  expect_error([] { (void)arange(0, 1e18); }, {"arange", "1e+18", "70368744177664"});
  expect_error([] { (void)arange(0, 1e30, 0.5); }, {"arange", "70368744177664"});
  expect_error([] { (void)linspace(0, 1, int64_t{1} << 50); }, {"linspace", "70368744177664"});
  CHECK(arange(0, 5).numel() == 5);
}

TEST_CASE("hardening: randn from several threads on the default generator (item 10)", "[hardening]") {
  // Each call draws one contiguous block of the shared stream, so the blocks drawn by 4 threads
  // are exactly the blocks a single thread draws from the same seed, in some order.
  constexpr int kThreads = 4, kCalls = 24, kN = 4096;
  manual_seed(1234);
  std::vector<std::vector<float>> got(kThreads * kCalls);
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int c = 0; c < kCalls; ++c) got[size_t(t * kCalls + c)] = randn({kN}).to_vector<float>();
      });
    for (auto& th : ts) th.join();
  }
  manual_seed(1234);
  std::vector<std::vector<float>> want;
  for (int c = 0; c < kThreads * kCalls; ++c) want.push_back(randn({kN}).to_vector<float>());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got == want);
}

}  // namespace tpu::testing
