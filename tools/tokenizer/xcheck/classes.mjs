// Prints V8's view of the character classes ktier's tables encode, as run-length lines
// "FIRST_HEX BITS" (bits as in src/tokenizer/unicode_tables.h; WS here is ECMAScript's \s, and
// PYSPACE is not computed). Surrogates get 0. Usage: node classes.mjs OUT.txt
import { writeFileSync } from "node:fs";

const tests = [
  [1 << 0, /\p{Lu}/u], [1 << 1, /\p{Ll}/u], [1 << 2, /\p{Lt}/u], [1 << 3, /\p{Lm}/u],
  [1 << 4, /\p{Lo}/u], [1 << 5, /\p{M}/u], [1 << 6, /\p{N}/u], [1 << 7, /\s/u],
  [1 << 8, /\p{Script=Han}/u],
];
const lines = [`# node ${process.versions.node} icu ${process.versions.icu} unicode ${process.versions.unicode}`];
let prev = -1;
for (let cp = 0; cp <= 0x10FFFF; cp++) {
  let bits = 0;
  if (cp < 0xD800 || cp > 0xDFFF) {
    const s = String.fromCodePoint(cp);
    for (const [bit, re] of tests) if (re.test(s)) bits |= bit;
  }
  if (bits !== prev) {
    lines.push(`${cp.toString(16)} ${bits}`);
    prev = bits;
  }
}
writeFileSync(process.argv[2], lines.join("\n") + "\n");
