// Renders one conversation with tpu::ChatTemplate (tests/chat/check_chat_templates.py compares the
// output with Jinja2's, byte for byte).
//   chat_render TOKENIZER_CONFIG.json CASE.json   -> the prompt on stdout, exit 0
// A tpu::Error prints "ERROR: <message>" to stdout and exits with 3. CASE.json holds "messages"
// and optionally "tools", "documents", "add_generation_prompt" and "extra".
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tpucore/chat_template.h"
#include "tpucore/core/error.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: chat_render TOKENIZER_CONFIG.json CASE.json\n");
    return 2;
  }
  try {
    std::ifstream f(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const auto c = nlohmann::ordered_json::parse(ss.str());
    tpu::ChatRequest req;
    req.messages = c.at("messages");
    if (c.contains("tools")) req.tools = c["tools"];
    if (c.contains("documents")) req.documents = c["documents"];
    req.add_generation_prompt = c.value("add_generation_prompt", false);
    if (c.contains("extra")) req.extra = c["extra"];
    const auto tmpl = tpu::ChatTemplate::from_config_file(argv[1]);
    const std::string out = tmpl.render(req);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  } catch (const tpu::Error& e) {
    std::printf("ERROR: %s", e.what());
    return 3;
  }
}
