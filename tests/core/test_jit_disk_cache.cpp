// The persistent cache in TPU_CACHE_DIR: a second compile of the same function loads the
// optimized graph; a corrupt or stale entry is detected, logged and rebuilt.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "jit_testing.h"

namespace tpu {
namespace {
using jit_testing::expect_close;
using jit_testing::rnd;
using jit_testing::stats_of;
namespace fs = std::filesystem;

struct CacheDir {
  fs::path dir;
  CacheDir() {
    dir = fs::temp_directory_path() / ("tpucore-jit-test-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    ::setenv("TPU_CACHE_DIR", dir.c_str(), 1);
  }
  ~CacheDir() {
    ::unsetenv("TPU_CACHE_DIR");
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::vector<fs::path> files() const {
    std::vector<fs::path> v;
    for (auto& e : fs::directory_iterator(dir)) v.push_back(e.path());
    return v;
  }
};

TEST_CASE("jit disk cache: reuse across compiles, corrupt entries rebuilt", "[jit]") {
  CacheDir cd;
  auto fn = [](const Tensor& x) { return softmax(x * 3.0, -1) + 1.0; };
  Tensor x = rnd({4, 8}, 1);
  {
    auto f = compile(fn, {.name = "disk_a"});
    expect_close(f(x), fn(x));
    CHECK(stats_of("disk_a").disk_hits == 0);
  }
  REQUIRE(cd.files().size() == 1);
  {
    auto f = compile(fn, {.name = "disk_b"});  // as a second process would
    expect_close(f(x), fn(x));
    CHECK(stats_of("disk_b").disk_hits == 1);
  }
  const fs::path entry = cd.files()[0];
  for (const char* garbage : {"{\"key\": 1", "", "{\"key\":\"0\",\"compiler\":\"x\",\"checksum\":\"0\",\"graph\":\"{}\"}"}) {
    std::ofstream(entry, std::ios::trunc) << garbage;
    auto f = compile(fn, {.name = "disk_c"});
    expect_close(f(x), fn(x));
    CHECK(stats_of("disk_c").disk_hits == 0);
  }
  {
    // Tampered payload with a valid envelope: the checksum catches it.
    std::ifstream in(entry);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t p = s.find("mul");
    REQUIRE(p != std::string::npos);
    s.replace(p, 3, "add");
    std::ofstream(entry, std::ios::trunc) << s;
    auto f = compile(fn, {.name = "disk_d"});
    expect_close(f(x), fn(x));
    CHECK(stats_of("disk_d").disk_hits == 0);
    auto f2 = compile(fn, {.name = "disk_e"});  // rebuilt entry is good again
    f2(x);
    CHECK(stats_of("disk_e").disk_hits == 1);
  }
}

}  // namespace
}  // namespace tpu
