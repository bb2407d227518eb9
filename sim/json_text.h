// Internal: parses JSON text for the simulator's readers (chip config, program JSON). Every
// failure of the JSON library, including a number it cannot represent (1e400), becomes a
// SimError that names the reader and the field being read when the text broke.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace tpu::sim::detail {

// `what` prefixes the message ("chip config", "program JSON").
nlohmann::json parse_json_text(const std::string& text, const char* what);

}  // namespace tpu::sim::detail
