// JSON serialization of programs: {"format":"tpusim-program","version":1,"name":..,"code":[..]}
// where each instruction is an object with "op" and the same field names as the assembly.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "sim/program.h"

namespace tpu::sim {

nlohmann::json program_to_json(const Program& p);
// Parses and finalizes; errors name the instruction index and field.
Program program_from_json(const nlohmann::json& j);
std::string program_to_json_text(const Program& p, int indent = -1);
Program program_from_json_text(const std::string& text);

}  // namespace tpu::sim
