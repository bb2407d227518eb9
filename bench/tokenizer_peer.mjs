// The peer of bench/bench_tokenizer's real-file benchmarks: transformers.js' tokenizers
// (@huggingface/tokenizers) encoding the same text with the same tokenizer.json in one node
// process (single-threaded). Loads the tokenizer once, warms up, times N encodes with
// process.hrtime and prints one JSON line: {"ns_per_encode": ..., "tokens": ...}.
//   node tokenizer_peer.mjs MODULE_DIR tokenizer.json TEXT_FILE N
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [moduleDir, tokPath, textPath, nArg] = process.argv.slice(2);
const n = Math.max(1, parseInt(nArg ?? "20", 10));
const mod = await import(pathToFileURL(path.join(moduleDir, "dist", "tokenizers.mjs")).href);
const tok = new mod.Tokenizer(JSON.parse(fs.readFileSync(tokPath, "utf8")), {});
const text = fs.readFileSync(textPath, "utf8");
const opts = { add_special_tokens: false };
let tokens = 0;
for (let k = 0; k < 3; ++k) tokens = tok.encode(text, opts).ids.length;
const t0 = process.hrtime.bigint();
for (let k = 0; k < n; ++k) tokens = tok.encode(text, opts).ids.length;
const t1 = process.hrtime.bigint();
console.log(JSON.stringify({ ns_per_encode: Number(t1 - t0) / n, tokens }));
