// tpu-calib's measured rows: the CSV sets of sim/calibration/tpu_v4 (README there), one Row per
// measured kernel (or, for the norms, per call of several kernels).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tpu::calib {

enum class Kind { matmul, binary, unary, norm };

struct Row {
  std::string set, name;
  Kind kind = Kind::unary;
  std::string op;               // matmul; add, sub, div, ...; relu, sigmoid, ...; layer_norm, rms_norm
  std::vector<int64_t> shape;   // matmul: m, n, k; otherwise the tensor shape
  double measured_us = 0;
  std::string prefetched;       // matmul_large: the operand XLA's fusion prefetched ("A" or "B")
  std::string a_layout, b_layout, out_layout;  // matmul_large: XLA layouts, "{1,0}" (row-major) or "{0,1}"
  int kernels = 1;              // XLA kernels the measured time sums (the norms: 5 or 3)
};

struct SetSpec {
  const char* file;
  const char* set;
  Kind kind;
  double max_mape;   // the calibration target for this set (percent)
  bool r2_target;    // R^2 >= 0.98 is a target (the sets that span more than 10x, added with it)
  bool fitted;       // the constants are fitted to it (matmul_large is reported only, see main.cpp)
};

// Every set the report reads, in report order, with its MAPE target.
const std::vector<SetSpec>& set_specs();
// The rows of one set; throws std::runtime_error naming the file and the column or line.
std::vector<Row> load_set(const std::string& dir, const SetSpec& spec);

}  // namespace tpu::calib
