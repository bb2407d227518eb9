// tpu-gguf: writes a Llama checkpoint folder (config.json + safetensors, as tpucore and the Hub
// keep them) as a GGUF file for llama.cpp, its matrices in one tensor type.
//
//   tpu-gguf CHECKPOINT_DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0] [--embed-type TYPE]
//
// --type sets the decoder's projections and the output head (default f32); --embed-type the
// token embedding (default f32; with tied embeddings it is the head too). Norms stay f32. The
// vocabulary written is a placeholder (tools/tpu-gguf/gguf_writer.h): the file runs on token ids.
#include <cstdio>
#include <exception>
#include <string>

#include "../cli_args.h"
#include "gguf_writer.h"
#include "tpucore/models.h"

int main(int argc, char** argv) {
  tpu::gguf::LlamaOptions o;
  std::string type = "f32", embed_type = "f32";
  tpu::cli::Parser p("tpu-gguf", "Writes a Llama checkpoint folder as a GGUF file (llama.cpp's format).");
  p.positional("CHECKPOINT_DIR", "config.json and model.safetensors of a Llama-layout model");
  p.positional("OUT.gguf", "the file to write");
  p.value("--type", "TYPE", "f32, f16, bf16, q8_0 or q4_0: the projections and the head (default f32)",
          [&](const std::string& v) { type = v; });
  p.value("--embed-type", "TYPE", "the token embedding's type (default f32)", [&](const std::string& v) { embed_type = v; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  if (p.positionals().size() != 2) {
    std::fprintf(stderr, "tpu-gguf: expected CHECKPOINT_DIR and OUT.gguf (see --help)\n");
    return 2;
  }
  try {
    o.type = tpu::gguf::parse_type(type);
    o.embed_type = tpu::gguf::parse_type(embed_type);
    auto m = tpu::models::load_causal_lm(p.positionals()[0], tpu::models::LoadOptions{});
    tpu::gguf::write_llama_gguf(*m, p.positionals()[1], o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpu-gguf: %s\n", e.what());
    return 1;
  }
  return 0;
}
