// Fuzzes the tokenizer.json reader and the encoder (tpu::Tokenizer). An input is a tokenizer.json
// text, then a NUL byte, then a text to encode (no NUL: the whole input is the file and the text
// is a fixed sample). A file the reader accepts must encode the text to ids of its vocabulary that
// decode back to the exact bytes of the text (byte-level BPE loses nothing, invalid UTF-8
// included), and decoding must reject an id past the vocabulary with a tpu::Error.
#include <algorithm>
#include <string>

#include "tpucore/core/error.h"
#include "tpucore/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = tpu_fuzz::text_of(data, size);
  const size_t nul = in.find('\0');
  const std::string file = in.substr(0, nul);
  const std::string text = nul == std::string::npos ? std::string("Hello, world! 123 \xc3\xa9\xff") : in.substr(nul + 1);
  std::optional<tpu::Tokenizer> tok;
  try {
    tok.emplace(tpu::Tokenizer::from_json(file, "fuzz.json"));
  } catch (const tpu::Error&) {
    return 0;
  }
  std::vector<int64_t> ids;
  try {
    ids = tok->encode(text);
  } catch (const tpu::Error&) {
    return 0;  // e.g. a vocabulary without some byte's token: reported, not a crash
  }
  const int64_t n = tok->vocab_size();
  for (int64_t id : ids)
    if (id < 0 || id >= n) tpu_fuzz::finding("encode gave an id outside the vocabulary", std::to_string(id));
  std::string back;
  try {
    back = tok->decode(ids);
  } catch (const tpu::Error& e) {
    tpu_fuzz::finding("decode rejected the ids encode gave", e.what());
  }
  if (back != text) tpu_fuzz::finding("decode(encode(text)) is not the text", back);
  try {
    (void)tok->decode({n});
    tpu_fuzz::finding("decode accepted an id past the vocabulary");
  } catch (const tpu::Error&) {
  }
  return 0;
}
