// Encodes a corpus with transformers.js' tokenizers (the independent reference) and writes, for
// each text, the ids with and without special tokens and the decoding of the latter.
//   node reference.mjs MODULE_DIR tokenizer.json corpus.json out.json
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [moduleDir, tokPath, corpusPath, outPath] = process.argv.slice(2);
const mod = await import(pathToFileURL(path.join(moduleDir, "dist", "tokenizers.mjs")).href);
const tok = new mod.Tokenizer(JSON.parse(fs.readFileSync(tokPath, "utf8")), {});
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const out = corpus.map((text) => {
  const plain = tok.encode(text, { add_special_tokens: false }).ids;
  return {
    with_special: tok.encode(text, { add_special_tokens: true }).ids,
    without_special: plain,
    decoded: plain.length ? tok.decode(plain, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "",
  };
});
fs.writeFileSync(outPath, JSON.stringify(out));
