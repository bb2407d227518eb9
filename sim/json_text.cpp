#include "sim/json_text.h"

#include <vector>

#include <fmt/format.h>

#include "sim/error.h"

namespace tpu::sim::detail {

using nlohmann::json;

json parse_json_text(const std::string& text, const char* what) {
  // The parser callback follows the nesting so that an error raised by the lexer (which has no
  // notion of fields) can name the key whose value it was reading.
  struct Level {
    bool array = false;
    std::string key;
    size_t index = 0;
  };
  std::vector<Level> path;
  auto where = [&] {
    std::string s;
    for (const Level& l : path) {
      if (l.array) s += fmt::format("[{}]", l.index);
      else if (!l.key.empty()) s += (s.empty() ? "" : ".") + l.key;
    }
    return s;
  };
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: path.push_back({}); break;
      case json::parse_event_t::array_start: path.push_back({true, {}, 0}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!path.empty()) path.pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:
        if (!path.empty() && path.back().array) ++path.back().index;
        break;
      case json::parse_event_t::key:
        if (!path.empty() && parsed.is_string()) path.back().key = parsed.get<std::string>();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::exception& e) {
    const std::string field = where();
    if (field.empty()) throw SimError(fmt::format("{}: invalid JSON: {}", what, e.what()));
    throw SimError(fmt::format("{}: invalid JSON in field '{}': {}", what, field, e.what()));
  }
}

}  // namespace tpu::sim::detail
