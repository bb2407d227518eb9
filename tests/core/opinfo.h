// OpInfo table: every registered op has an entry with sample inputs, a naive reference and
// tolerances. Entries are registered from each op family's test file; test_opinfo.cpp runs
// them on every device and fails when a registered op has no entry.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "testing.h"

namespace tpu::testing {

struct OpSample {
  std::string desc;            // "broadcast [3,1] x [4]", "transposed", ...
  std::vector<Tensor> inputs;  // cpu tensors; moved to the device under test by the runner
};

struct OpInfo {
  std::string op;  // registry name(s) this entry covers, e.g. "add"
  std::vector<DType> dtypes;
  // Sample inputs for one dtype (random shapes, broadcasting, non-contiguous views, 0-d and
  // zero-size tensors).
  std::function<std::vector<OpSample>(DType, Generator&)> samples;
  // Runs the op through the public API on the given inputs.
  std::function<Tensor(const std::vector<Tensor>&)> run;
  // The independent reference, from the inputs' values.
  std::function<Ref(const std::vector<Ref>&, DType)> reference;
  std::function<Tol(DType)> tol = default_tol;
};

std::vector<OpInfo>& opinfo_table();
// Names of registered ops that have no numeric entry on purpose, with the reason (e.g. a
// random op tested by its moments in its own test file).
std::vector<std::pair<std::string, std::string>>& opinfo_covered_elsewhere();

// Runs every sample of an entry on `dev` and checks it against the reference (test_opinfo.cpp).
void run_opinfo_entry(const OpInfo& info, Device dev);

struct OpInfoRegistrar {
  explicit OpInfoRegistrar(OpInfo info) { opinfo_table().push_back(std::move(info)); }
  OpInfoRegistrar(const std::string& op, const std::string& where) {
    opinfo_covered_elsewhere().emplace_back(op, where);
  }
};

}  // namespace tpu::testing
