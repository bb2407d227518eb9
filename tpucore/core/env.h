// Integer settings read from the environment (TPU_NUM_THREADS, TPU_HOST_CACHE_MB,
// TPU_SIM_PROGRAM_CACHE). A value that is not a whole number in the accepted range is never
// used silently: it is reported with the variable, the value and the range, and the default
// applies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tpu {

struct EnvInt {
  std::optional<int64_t> value;  // the number, when `text` is one in [lo, hi]
  std::string problem;           // otherwise what was wrong (empty when fine)
};

// Pure: parses the text of variable `name` (surrounding spaces allowed).
EnvInt parse_env_int(const char* name, const char* text, int64_t lo, int64_t hi);

// Reads variable `name`: unset or empty gives nullopt; an invalid value gives nullopt after a
// warning on the library log that ends with `fallback` (what applies instead).
std::optional<int64_t> env_int(const char* name, int64_t lo, int64_t hi, const char* fallback);

}  // namespace tpu
