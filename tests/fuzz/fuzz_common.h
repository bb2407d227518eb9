// Shared by the libFuzzer targets: an input is fine if the parser accepts it or rejects it with
// the library's own error type; anything else (another exception, a sanitizer report, a broken
// round trip) is a finding. finding() aborts so libFuzzer saves the input as a crash.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tpu_fuzz {

[[noreturn]] inline void finding(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "FUZZ FINDING: %.*s\n%.*s\n", int(what.size()), what.data(), int(detail.size()), detail.data());
  std::abort();
}

inline std::string text_of(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

}  // namespace tpu_fuzz
