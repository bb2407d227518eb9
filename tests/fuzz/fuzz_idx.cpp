// Fuzzes the IDX reader (tpu::data::parse_idx, plain and gzip-compressed). An accepted file's
// tensor must hold exactly the elements its header declares, and every byte of it is read
// (so a short buffer shows up under ASan).
#include <span>

#include "tpucore/data.h"
#include "tpucore/core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpu::Tensor t;
  try {
    t = tpu::data::parse_idx(std::span<const uint8_t>(data, size), "fuzz");
  } catch (const tpu::Error&) {
    return 0;
  }
  if (!t.defined() || !t.is_contiguous()) tpu_fuzz::finding("parse_idx returned an undefined or strided tensor");
  // For a plain (not gzip) input, the shape must be the header's: byte 3 = ndims, then
  // big-endian u32 dims.
  if (size >= 4 && !(data[0] == 0x1f && data[1] == 0x8b)) {
    const size_t nd = data[3];
    if (size_t(t.dim()) != nd || size < 4 + 4 * nd) tpu_fuzz::finding("parse_idx: rank differs from the header");
    for (size_t d = 0; d < nd; ++d) {
      const uint8_t* p = data + 4 + 4 * d;
      const int64_t want = (int64_t(p[0]) << 24) | (int64_t(p[1]) << 16) | (int64_t(p[2]) << 8) | int64_t(p[3]);
      if (t.size(int64_t(d)) != want) tpu_fuzz::finding("parse_idx: a dimension differs from the header");
    }
  }
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  unsigned sum = 0;
  for (size_t i = 0; i < t.nbytes(); ++i) sum += bytes[i];
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}
