// Fuzzes the chat-template interpreter (tpu::ChatTemplate): an input is a template source, parsed
// and rendered on a fixed conversation with tools, tool calls and extra variables, under small
// limits. Parsing and rendering may only fail with a tpu::Error, and an accepted render stays
// within the output limit and renders the same bytes a second time.
#include <string>

#include "tpucore/chat_template.h"
#include "tpucore/core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tpu::ChatRequest req = [] {
    tpu::ChatRequest r;
    r.messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris? \u00e9 \ud83d\ude00"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "abcdefghi", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": "<think>\nhot\n</think>\n\nIt is 21.5 C."}])");
    r.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    r.add_generation_prompt = true;
    r.extra = {{"enable_thinking", false}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
    return r;
  }();
  tpu::ChatTemplateLimits lim;
  lim.max_output = 1 << 20;
  lim.max_steps = 200000;
  const std::string src = tpu_fuzz::text_of(data, size);
  std::optional<tpu::ChatTemplate> t;
  try {
    t.emplace(tpu::ChatTemplate::from_source(src, "fuzz"));
  } catch (const tpu::Error&) {
    return 0;
  }
  std::string out;
  try {
    out = t->render(req, lim);
  } catch (const tpu::Error&) {
    return 0;
  }
  if (out.size() > lim.max_output) tpu_fuzz::finding("render went past the output limit", std::to_string(out.size()));
  std::string again;
  try {
    again = t->render(req, lim);
  } catch (const tpu::Error& e) {
    tpu_fuzz::finding("a second render of the same template failed", e.what());
  }
  if (again != out && src.find("strftime_now") == std::string::npos)
    tpu_fuzz::finding("two renders of the same template differ", again);
  return 0;
}
