// Writes js-tiktoken's o200k_base vocabulary as a ktier tokenizer folder:
//   OUT/tiktoken.model         "<base64> <rank>" lines, ranks 0..n-1 (o200k: 199,998 ranks)
//   OUT/tokenizer_config.json  {"added_tokens_decoder": {...}} with o200k's special tokens
// and prints a one-line JSON summary. Usage: node export_ranks.mjs OUT
//
// js-tiktoken stores ranks compressed as lines "! <offset> <b64> <b64> ..." (consecutive ranks
// from offset); this expands them the same way js-tiktoken's Tiktoken constructor does.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import o200k from "js-tiktoken/ranks/o200k_base";

const out = process.argv[2];
if (!out) {
  console.error("usage: node export_ranks.mjs OUT_DIR");
  process.exit(2);
}
const byRank = [];
for (const line of o200k.bpe_ranks.split("\n")) {
  if (!line) continue;
  const [, offsetStr, ...tokens] = line.split(" ");
  const offset = Number.parseInt(offsetStr, 10);
  tokens.forEach((tok, i) => {
    if (byRank[offset + i] !== undefined) throw new Error(`rank ${offset + i} twice`);
    byRank[offset + i] = tok;
  });
}
for (let r = 0; r < byRank.length; r++) {
  if (byRank[r] === undefined) throw new Error(`rank ${r} missing`);
}
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "tiktoken.model"), byRank.map((t, r) => `${t} ${r}\n`).join(""));
const added = {};
for (const [content, id] of Object.entries(o200k.special_tokens)) {
  added[String(id)] = { content, special: true };
}
writeFileSync(join(out, "tokenizer_config.json"),
  JSON.stringify({ added_tokens_decoder: added }, null, 1) + "\n");
console.log(JSON.stringify({ ranks: byRank.length, special_tokens: o200k.special_tokens,
  pat_str: o200k.pat_str }));
