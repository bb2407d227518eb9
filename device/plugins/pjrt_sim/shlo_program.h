// The StableHLO subset tpu::export_stablehlo writes (graph/stablehlo.h, either attribute
// syntax), parsed into a list of ops and run with tpucore's ops on a device: on sim:N the ops
// that have a lowering run as generated chip programs, the others on the host fallback.
// Malformed text and ops outside the subset are a tpu::Error naming the line.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::pjrt_sim {

struct TypeSpec {
  Shape shape;
  DType dtype = DType::f32;
};

struct Op {
  int line = 0;
  std::string result;             // "%v3" (empty for func.return)
  int num_results = 1;            // "%v3:2 = ..." (custom_call): results %v3#0, %v3#1
  std::string name;               // "add", "reduce", "return", ...
  std::vector<std::string> operands;
  std::string attrs;              // the text between the braces
  std::vector<TypeSpec> in_types;
  TypeSpec type;                  // the (first) result's
  std::vector<TypeSpec> types;    // every result's
  std::string body;               // reduce, scatter: the region's op ("add", "maximum", ...)
};

struct Program {
  std::vector<TypeSpec> args;
  std::vector<Op> ops;  // the last one is the return
  std::vector<TypeSpec> results;
};

Program parse_program(const std::string& text);
// Runs the program on `dev` with inputs (already on dev); returns the results (on dev).
// Helpers shared by the op runners (shlo_run.cpp, shlo_index.cpp).
// A tpu::Error naming the module line and op.
[[noreturn]] void bad(const Op& op, const std::string& why);
// The text after "name = " in the op's attributes, or empty.
std::string attr(const Op& op, const std::string& name);
// Every integer in s, in order (digits with an optional leading '-').
std::vector<int64_t> int_list(const std::string& s);

// A custom_call's target and parameters (backend_config "name=value;..."). A target that is not
// a kernel op registered in this process (tpu::kernel::register_op: the plugin shares the
// process and libtpucore with its user), or the wrong operand count, is a tpu::Error naming it.
struct CustomCall {
  std::string target;
  std::map<std::string, int64_t> params;
};
CustomCall custom_call_of(const Op& op);

std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs, Device dev);

}  // namespace tpu::pjrt_sim
