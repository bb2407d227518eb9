/// @file
/// tpu::Error: every failure a user can cause. Messages name the op, the argument, and the
/// shapes / dtypes / devices involved.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tpu {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tpu

// TPU_CHECK(cond, "op: message {}", args...): throws tpu::Error when cond is false.
#define TPU_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) [[unlikely]] {              \
      ::tpu::fail(__VA_ARGS__);              \
    }                                        \
  } while (0)
