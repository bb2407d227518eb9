// The header ranks exchange before a collective to check that they agree (internal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpucore/dist.h"

namespace tpu::dist::detail {

enum class OpCode : uint8_t {
  all_reduce = 1, broadcast, all_gather, all_gather_into_tensor, reduce_scatter_tensor, all_to_all,
  all_to_all_single, barrier, send_recv
};
const char* op_name(OpCode op);

struct Header {  // 96 bytes, no implicit padding
  uint8_t op = 0, dtype = 0, reduce = 0, ndim = 0, bad = 0, pad[3] = {};
  int32_t root = 0, pad2 = 0;
  int64_t numel = 0, count = 0;
  int64_t dims[8] = {};
};
static_assert(sizeof(Header) == 96);

// t may be undefined (barrier, or a call whose arguments were invalid: bad = 1).
Header make_header(OpCode op, const Tensor* t, ReduceOp r = ReduceOp::sum, int root = 0, int64_t count = 0);
std::string describe(const Header& h);  // "all_reduce f32[4, 3] sum"
bool same(const Header& a, const Header& b);
std::vector<char> to_bytes(const Header& h);
Header from_bytes(const std::vector<char>& b);

}  // namespace tpu::dist::detail
