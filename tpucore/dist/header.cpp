#include "tpucore/dist/header.h"

#include <fmt/format.h>

#include <cstring>

namespace tpu::dist::detail {

const char* op_name(OpCode op) {
  switch (op) {
    case OpCode::all_reduce: return "all_reduce";
    case OpCode::broadcast: return "broadcast";
    case OpCode::all_gather: return "all_gather";
    case OpCode::all_gather_into_tensor: return "all_gather_into_tensor";
    case OpCode::reduce_scatter_tensor: return "reduce_scatter_tensor";
    case OpCode::all_to_all: return "all_to_all";
    case OpCode::all_to_all_single: return "all_to_all_single";
    case OpCode::barrier: return "barrier";
    case OpCode::send_recv: return "send/recv";
  }
  return "unknown collective";
}

Header make_header(OpCode op, const Tensor* t, ReduceOp r, int root, int64_t count) {
  Header h;
  h.op = static_cast<uint8_t>(op);
  h.reduce = static_cast<uint8_t>(r);
  h.root = root;
  h.count = count;
  if (t && t->defined()) {
    h.dtype = static_cast<uint8_t>(t->dtype());
    h.ndim = static_cast<uint8_t>(t->dim());
    h.numel = t->numel();
    for (int d = 0; d < t->dim() && d < 8; ++d) h.dims[d] = t->size(d);
  }
  return h;
}

std::string describe(const Header& h) {
  if (h.bad) return fmt::format("{} with invalid arguments", op_name(static_cast<OpCode>(h.op)));
  auto op = static_cast<OpCode>(h.op);
  std::string s = op_name(op);
  if (op == OpCode::barrier) return s;
  std::string dims;
  for (int d = 0; d < h.ndim; ++d) {
    if (d) dims += ", ";
    dims += d >= 8 ? "..." : d == 0 && h.count == -1 ? "*" : std::to_string(h.dims[d]);  // *: uneven dim 0
  }
  std::string dt = h.dtype < kNumDTypes ? std::string(dtype_name(static_cast<DType>(h.dtype))) : "?";
  s += fmt::format(" {}[{}]", dt, dims);
  if (op == OpCode::all_reduce || op == OpCode::reduce_scatter_tensor)
    s += fmt::format(" {}", reduce_op_name(static_cast<ReduceOp>(h.reduce)));
  if (op == OpCode::broadcast) s += fmt::format(" from rank {}", h.root);
  if (op == OpCode::all_gather || op == OpCode::all_to_all) s += fmt::format(" (lists of {})", h.count);
  if (op == OpCode::all_to_all_single && h.count == -1) s += " (split sizes)";
  return s;
}

bool same(const Header& a, const Header& b) { return std::memcmp(&a, &b, sizeof(Header)) == 0; }

std::vector<char> to_bytes(const Header& h) {
  std::vector<char> b(sizeof(Header));
  std::memcpy(b.data(), &h, sizeof(Header));
  return b;
}

Header from_bytes(const std::vector<char>& b) {
  Header h;
  std::memcpy(&h, b.data(), std::min(b.size(), sizeof(Header)));
  return h;
}

}  // namespace tpu::dist::detail
