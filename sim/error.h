// tpu::sim::SimError: every failure a user of the simulator can cause (bad program, bad
// config, out-of-range address) is reported as a SimError whose message names the
// instruction (index and text), the line:column, or the config field involved.
#pragma once
#include <stdexcept>
#include <string>

namespace tpu::sim {

class SimError : public std::runtime_error {
 public:
  explicit SimError(const std::string& what, long instr_index = -1)
      : std::runtime_error(what), index_(instr_index) {}
  // Index of the instruction the error is about, or -1.
  long instr_index() const { return index_; }

 private:
  long index_;
};

}  // namespace tpu::sim
