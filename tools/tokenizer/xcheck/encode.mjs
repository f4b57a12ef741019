// Encodes the cross-check corpus with js-tiktoken (o200k_base ranks).
//
//   node encode.mjs MODE CORPUS.jsonl OUT.jsonl [MAX_CHUNK MAX_RUN]
//   node encode.mjs MODE --whole CORPUS.txt OUT.txt [MAX_CHUNK MAX_RUN]
//
// MODE o200k: js-tiktoken's o200k pat_str (White_Space and case folding spelled out, see
// patterns.mjs), plain tiktoken (no chunking). MODE k3: the K3 pattern with the o200k ranks and
// the K3 reference wrapper's chunking (default limits 400000 / 25000 code points).
// Special tokens are never allowed: marker strings in the corpus are ordinary text.
// Per-document output: one JSON line {"name", "ids"} per corpus line; --whole writes the ids of
// the whole file comma-separated. Prints {"documents", "ids", "seconds"} on stdout.
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";
import { K3_PATTERN, kimiChunks, o200kPattern } from "./patterns.mjs";

const args = process.argv.slice(2);
const mode = args.shift();
const whole = args[0] === "--whole";
if (whole) args.shift();
const [input, output, maxChunkStr, maxRunStr] = args;
if (!["o200k", "k3"].includes(mode) || !input || !output) {
  console.error("usage: node encode.mjs o200k|k3 [--whole] INPUT OUTPUT [MAX_CHUNK MAX_RUN]");
  process.exit(2);
}
const maxChunk = maxChunkStr === undefined ? 400000 : Number(maxChunkStr);
const maxRun = maxRunStr === undefined ? 25000 : Number(maxRunStr);

const pat = mode === "o200k" ? o200kPattern(o200k.pat_str) : K3_PATTERN;
const enc = new Tiktoken({ ...o200k, pat_str: pat });
const encodeText = (text) => {
  if (mode === "o200k") return enc.encode(text, [], []);
  const ids = [];
  for (const chunk of kimiChunks(text, maxChunk, maxRun)) {
    for (const id of enc.encode(chunk, [], [])) ids.push(id);
  }
  return ids;
};

const t0 = process.hrtime.bigint();
let nDocs = 0;
let nIds = 0;
if (whole) {
  const ids = encodeText(readFileSync(input, "utf8"));
  nDocs = 1;
  nIds = ids.length;
  writeFileSync(output, ids.join(",") + "\n");
} else {
  const lines = [];
  for (const line of readFileSync(input, "utf8").split("\n")) {
    if (!line) continue;
    const doc = JSON.parse(line);
    const ids = encodeText(doc.text);
    nDocs += 1;
    nIds += ids.length;
    lines.push(JSON.stringify({ name: doc.name, ids }));
  }
  writeFileSync(output, lines.join("\n") + "\n");
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({ documents: nDocs, ids: nIds, seconds }));
