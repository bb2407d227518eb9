/// @file
/// tpu::Error: every failure a user can cause. Messages name the op, the argument, and the
/// shapes / dtypes / devices involved.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tpu {

/// The exception every failure a user can cause throws (a std::runtime_error): bad arguments,
/// shapes, dtypes or devices, I/O errors, unsupported features. what() names the op, the
/// argument and the values involved.
class Error : public std::runtime_error {
 public:
  /// An error with the message `what`.
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Throws a tpu::Error whose message is fmt::format(f, args...).
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tpu

/// TPU_CHECK(cond, "op: message {}", args...): throws tpu::Error when cond is false.
/// @hideinitializer
#define TPU_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) [[unlikely]] {              \
      ::tpu::fail(__VA_ARGS__);              \
    }                                        \
  } while (0)
