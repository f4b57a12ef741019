// The split patterns in JavaScript RegExp syntax (flags "u"), made to mean exactly what the
// Rust regex engine behind tiktoken means (see src/tokenizer/pretokenize.h):
//
//  * \s / \S are spelled out as the Unicode White_Space property. ECMAScript's \s differs
//    (it adds U+FEFF, lacks U+0085); Rust's regex crate and ktier use White_Space.
//  * (?i:'s|'t|...) is spelled out with Unicode simple case folding: "'s" also matches
//    "'ſ" (U+017F), as in Rust's regex crate. V8 11 has no (?i:...) modifier groups.
//  * [X&&[^\p{Han}]] (class intersection, not in JS) becomes (?:(?!\p{Script=Han})[X]);
//    \p{Han} is Script=Han (not Script_Extensions), as in Rust's regex crate.
//
// O200K_SHIPPED pins js-tiktoken's o200k pat_str; o200kPattern() checks that the installed
// package still ships it and applies only the first two rewrites.
export const WS = "\\t-\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000";
// Python's str.isspace() (bidi WS/B/S or Zs), used by the K3 reference's long-input chunking.
export const PY_SPACE = /^[\t-\r\x1C-\x20\x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]$/u;

export const O200K_SHIPPED =
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" +
  "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?" +
  "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" +
  "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?" +
  "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function spellOutSpace(pat) {
  const out = pat
    .replaceAll("[^\\s", `[^${WS}`)
    .replaceAll("(?!\\S)", `(?![^${WS}])`)
    .replaceAll("\\s", `[${WS}]`);
  if (out.includes("\\S")) throw new Error("unhandled \\S in pattern");
  return out;
}

export function o200kPattern(shipped) {
  if (shipped !== O200K_SHIPPED) {
    throw new Error("js-tiktoken's o200k pat_str differs from the pinned copy in patterns.mjs:\n" +
      shipped + "\nReview the difference before updating the pin.");
  }
  return spellOutSpace(shipped.replaceAll("'s|'S|", "'s|'S|'\\u017F|"));
}

const NOT_HAN = "(?!\\p{Script=Han})";
const UPPER = `(?:${NOT_HAN}[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])`;
const LOWER = `(?:${NOT_HAN}[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])`;
const CONTRACTION = "(?:'[sS\\u017F]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const PREFIX = "[^\\r\\n\\p{L}\\p{N}]";

// K3-MODEL §8.4's table, alternative by alternative.
export const K3_PATTERN = [
  "\\p{Script=Han}+",
  `${PREFIX}?${UPPER}*${LOWER}+${CONTRACTION}?`,
  `${PREFIX}?${UPPER}+${LOWER}*${CONTRACTION}?`,
  "\\p{N}{1,3}",
  ` ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*`,
  `[${WS}]*[\\r\\n]+`,
  `[${WS}]+(?![^${WS}])`,
  `[${WS}]+`,
].join("|");

// The K3 reference wrapper's long-input chunking (tokenization_kimi.py): cut every maxChunk
// code points, then wherever a run of Python-space or non-space code points would exceed
// maxRun. 0 disables a limit.
export function kimiChunks(text, maxChunk, maxRun) {
  const cps = Array.from(text);
  const out = [];
  const step = maxChunk > 0 ? maxChunk : Math.max(cps.length, 1);
  for (let i = 0; i < cps.length; i += step) {
    const s = cps.slice(i, i + step);
    let runLen = 0;
    let runSpace = PY_SPACE.test(s[0]);
    let start = 0;
    for (let k = 0; k < s.length; k++) {
      const sp = PY_SPACE.test(s[k]);
      if (sp !== runSpace) {
        runLen = 1;
        runSpace = sp;
      } else {
        runLen += 1;
        if (maxRun > 0 && runLen > maxRun) {
          out.push(s.slice(start, k).join(""));
          start = k;
          runLen = 1;
        }
      }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
}
