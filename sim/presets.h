// Named chip presets: "tiny" for tests and presets shaped like public TPU generations
// (v4, v5e, v5p, v6e, v7). Each preset describes ONE TensorCore (one simulated device);
// `cores_per_chip` says how many make a chip. The JSON text is embedded in the library.
#pragma once
#include <string>
#include <vector>

#include "sim/config.h"

namespace tpu::sim {

std::vector<std::string> preset_names();
// The preset's JSON text; throws SimError listing the known names if `name` is unknown.
// "<name>-ideal" (e.g. "v4-ideal") is the preset with timing.model "ideal" (config.h).
const std::string& preset_json(const std::string& name);
ChipConfig preset_config(const std::string& name);
// A preset name, a path to a JSON file, or literal JSON text (starting with '{').
ChipConfig load_config(const std::string& name_or_path_or_json);

}  // namespace tpu::sim
