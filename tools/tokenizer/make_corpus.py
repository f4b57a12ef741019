#!/usr/bin/python3
"""Builds the deterministic tokenizer cross-check corpus (seeded; no network, no data files).

    /usr/bin/python3 tools/tokenizer/make_corpus.py OUT_DIR [--seed N] [--min-bytes N]

Writes OUT_DIR/corpus.jsonl (one JSON object per line: {"name": ..., "text": ...}) and
OUT_DIR/corpus.txt (all texts concatenated, UTF-8). The corpus goes to the build folder and is
never committed. Same seed and same Python minor version -> byte-identical output.

Documents cover: English prose with contractions in mixed case, source code in several
languages (LF, CRLF, tabs), Chinese / Japanese (kana + kanji) / Korean, emoji (skin tones, ZWJ
sequences, flags, keycaps, tag sequences), whitespace runs, numbers in many scripts,
punctuation runs, Arabic / Hebrew / Devanagari / Cyrillic / Greek / Thai, combining marks,
and "odd" text (below), plus two fuzz families: code-point soup drawn per general category
and dense concatenations of the characters each split-pattern alternative cares about.

Invalid UTF-8 cannot be cross-checked: the JavaScript engine only sees strings decoded from
UTF-8. So the corpus is valid UTF-8 throughout and the "odd" documents use valid text that
looks like trouble: U+FFFD, C0/C1 controls (incl. NUL, U+001C..U+001F, U+0085), DEL, BOM in the
middle of text, zero-width (non-)joiners and spaces, bidi controls, private use, noncharacters,
U+2028/U+2029, unusual spaces, and literal spellings of broken byte sequences ("\\xC0\\xAF",
"%C0%AF", mojibake). Invalid-byte handling is covered by the C++ unit tests instead.

Every code point used is assigned in Unicode 14.0 (Python's unicodedata), or is a
noncharacter, so its properties are the same in ktier's tables (Unicode 15.0) and in Node's
ICU; tests/tokenizer checks the tables against V8 for every code point assigned in 15.0.
Whitespace runs stay at a few hundred characters because js-tiktoken's BPE is quadratic in
piece length (and slow); 25,000-character runs are covered by the C++ unit tests.
"""
import argparse
import json
import os
import random
import sys
import unicodedata

WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from not have "
    "they this which you were her all she there would their we him been has when who will more "
    "no if out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made after "
    "also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three "
    "tokenizer inference engine expert memory tensor kernel latency throughput cache shard "
    "quantization attention router gradient checkpoint benchmark deterministic"
).split()
NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Eve", "François", "Gödel", "Hélène", "Ivan", "Jürgen",
         "Kimi", "Ljubljana", "McDonald", "O'Brien", "NASA", "HTTPServer", "iPhone", "eBay"]
CONTRACTIONS = ["don't", "DON'T", "Don't", "it's", "IT'S", "It'S", "we're", "WE'RE", "We'Re",
                "you've", "YOU'VE", "I'm", "I'M", "i'M", "I'll", "I'LL", "I'lL", "he'd", "HE'D",
                "they'll", "can't", "won't", "isn't", "it'ſ", "IT'ſ", "don’t", "o'clock", "rock'n'roll",
                "'s", "'S", "'re", "'ll'", "''", "'t'd'm", "DON'Te", "x'sy", "ʼs", "dogʼs"]
PUNCT_RUNS = ["...", "!!!", "???", "?!", "---", "***", "///", "//", "\\\\", "<<>>", "&&", "||",
              "=>", "->", "::", ";;", "#!/", "@@", "%%", "^^", "~~~", "```", "\"'", "'\"",
              "«»", "“”", "‘’", "—", "–", "…", "•", "·", "¡¿", "§¶", "†‡", "‰", "©®™", "€$¥£",
              "。", "、", "「」", "『』", "【】", "！？", "，", "：", "；", "·•", "〈〉", "〜"]
CHINESE = ["你好世界", "我们今天讨论语言模型的推理引擎", "中华人民共和国", "北京市", "人工智能",
           "这是一个测试", "机器学习和深度学习", "天气很好", "汉字", "简体中文与繁體中文",
           "专家混合模型", "量化", "分词器", "长文本", "龍", "〇", "々", "⺀⺁⼀⼁", "𠀀𠀁𠀂", "𪚥"]
JAPANESE = ["こんにちは", "日本語のテキスト", "東京都に住んでいます", "カタカナとひらがな",
            "ラーメンを食べたい", "コンピューター", "ｶﾀｶﾅ", "今日は良い天気ですね", "漢字かな交じり文",
            "ヴァイオリン", "ゝゞヽヾ", "〜ー〜", "トークナイザー", "一二三"]
KOREAN = ["안녕하세요", "한국어 텍스트도 시험합니다", "대한민국", "서울특별시", "토크나이저",
          "인공지능 모델", "ㄱㄴㄷㄹ", "한글", "가나다라마바사"]
SCRIPTS = {
    "arabic": ["مرحبا بالعالم", "اللغة العربية", "الذكاء الاصطناعي", "كِتَابٌ", "٠١٢٣٤٥٦٧٨٩", "ﷺ", "ـــ"],
    "hebrew": ["שלום עולם", "עִבְרִית", "בְּרֵאשִׁית", "תל אביב", "״", "׳"],
    "devanagari": ["नमस्ते दुनिया", "हिन्दी भाषा", "कृत्रिम बुद्धिमत्ता", "०१२३४५६७८९", "क्षत्रिय", "।", "॥"],
    "cyrillic": ["Привет мир", "Русский язык", "Москва", "ЁЛКА", "ёлка", "Україна", "Ґґ", "Mоscow"],
    "greek": ["Γειά σου κόσμε", "Ελληνικά", "ΑΘΗΝΑ", "ἀλήθεια", "ὦ", "Σίσυφος", "ς", "ΐ"],
    "thai": ["สวัสดีครับ", "ภาษาไทย", "กรุงเทพมหานคร", "๑๒๓"],
    "latin-ext": ["naïve café über", "Ærøskøbing", "ǅemal ǈubljana ǋegoš", "ß ẞ", "ﬁﬂ", "İstanbul ı",
                  "Å Å", "K K", "ʰʲʷ", "ꜰᴀᴋᴇ", "𝐀𝐁𝐂𝐚𝐛𝐜", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ⓐⓑ", "ℌℍℎ"],
}
EMOJI = ["😀", "🚀", "🔥", "👍", "👍🏻", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "❤️", "♥",
         "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "#️⃣", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "🧑🏽‍🚀", "👩🏾‍❤️‍💋‍👨🏻", "🫠", "☺︎", "✈", "🀄", "🂡"]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "-273.15", "1e-9",
           "6.022e23", "1,234,567", "1.234.567,89", "0xDEADBEEF", "0b1010", "2026-11-30",
           "12:34:56", "+1 (555) 010-9999", "٣٤٥", "१२३४", "１２３４", "²³", "½¼¾", "Ⅻ", "ⅻ",
           "①②③", "⑴", "𝟘𝟙𝟚", "〇一二", "፩፪", "໑໒", "𝟏𝟐𝟑𝟒"]
ODD = ["\ufffd", "\ufffd\ufffd", "\x00", "\x01\x02\x03", "\x07", "\x1b[31m", "\x1c\x1d\x1e\x1f",
       "\x7f", "\x80\x85\x9f", "\u0085", "\ufeff", "\u200b", "\u200c", "\u200d", "\u2060",
       "\u202e", "\u202d", "\u2066\u2069", "\u061c", "\ue000", "\uf8ff", "\U000f0000", "\U0010fffd",
       "\ufffe", "\uffff", "\ufdd0", "\u2028", "\u2029", "\u00a0", "\u202f", "\u2007", "\u3000",
       "\u180e", "\u1680", "\u205f", "\\xC0\\xAF", "%C0%AF", "\\u0000", "Ã©", "Ã¼ber", "â€™",
       "\\xF0\\x9F\\x98", "&#xFFFD;", "\u0301", "\u0301\u0302\u0303", "\u20dd", "\u034f",
       "\ufe0f", "\U000e0001", "\U000e0067", "<|endoftext|>", "<|endofprompt|>", "<|im_end|>",
       "[BOS]", "<|open|>", "<|reserved_token_163700|>", "<|", "|>"]
ZALGO_MARKS = [chr(c) for c in range(0x300, 0x370)] + ["\u0483", "\u0488", "\u1ab0", "\u20d0", "\u20e3"]


# Code points whose classes changed after Unicode 15.0 (ktier's tables) in the Unicode version
# of Node's ICU; kept out of the corpus (tools/tokenizer/xcheck.py KNOWN_PROPERTY_CHANGES).
CHANGED_AFTER_15 = {0x0295}


def assigned(c):
    return unicodedata.category(c) != "Cn"


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.by_cat = {}
        for cp in range(0x110000):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            cat = unicodedata.category(chr(cp))
            if cat in ("Cn", "Cs") or cp in CHANGED_AFTER_15:
                continue
            self.by_cat.setdefault(cat, []).append(cp)

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def word(self):
        w = self.pick(WORDS)
        roll = self.r.random()
        if roll < 0.08:
            w = w.upper()
        elif roll < 0.2:
            w = w.capitalize()
        elif roll < 0.23:
            w = "".join(ch.upper() if self.r.random() < 0.5 else ch for ch in w)
        return w

    def sentence(self):
        parts = []
        for _ in range(self.r.randint(4, 18)):
            roll = self.r.random()
            if roll < 0.08:
                parts.append(self.pick(CONTRACTIONS))
            elif roll < 0.13:
                parts.append(self.pick(NAMES))
            elif roll < 0.18:
                parts.append(self.pick(NUMBERS))
            else:
                parts.append(self.word())
            if self.r.random() < 0.1:
                parts[-1] += self.pick([",", ";", ":", " -", "'s", "s'", ")", "\"", "/"])
        s = " ".join(parts)
        return s[0].upper() + s[1:] + self.pick([".", ".", ".", "!", "?", "...", "?!", ":"])

    def prose(self):
        paras = []
        for _ in range(self.r.randint(1, 6)):
            paras.append(" ".join(self.sentence() for _ in range(self.r.randint(1, 7))))
        sep = self.pick(["\n\n", "\n", "\r\n\r\n", "\n \n", "  \n\n"])
        return sep.join(paras) + self.pick(["", "\n", " ", "  "])

    def ident(self):
        w = [self.pick(WORDS) for _ in range(self.r.randint(1, 3))]
        style = self.r.randrange(4)
        if style == 0:
            return "_".join(w)
        if style == 1:
            return w[0] + "".join(x.capitalize() for x in w[1:])
        if style == 2:
            return "".join(x.capitalize() for x in w)
        return "_".join(w).upper()

    def code(self):
        lang = self.r.randrange(8)
        i, j, k = self.ident(), self.ident(), self.ident()
        n = self.r.randint(0, 99999)
        ind = self.pick(["    ", "  ", "\t", "\t\t", "        "])
        if lang == 0:
            src = (f"#include <vector>\n// {self.sentence()}\nstatic int {i}(const std::vector<int>& {j}) {{\n"
                   f"{ind}int {k} = {n};\n{ind}for (size_t x = 0; x < {j}.size(); ++x) {k} += {j}[x] * 0x{n:X};\n"
                   f"{ind}if ({k} >= {n} && {k} != -1) return {k} >> 2;\n{ind}return {k}; /* {self.word()} */\n}}\n")
        elif lang == 1:
            src = (f"def {i}({j}, {k}=None):\n{ind}\"\"\"{self.sentence()}\"\"\"\n{ind}if {k} is None:\n"
                   f"{ind}{ind}{k} = [{n}, {n % 7}, 'x\\n', r\"\\s+\"]\n{ind}return {{'{j}': {j}, **{{}}}}  # {self.word()}\n")
        elif lang == 2:
            src = (f"export const {i} = async ({j}) => {{\n{ind}const {k} = await fetch(`/api/v1/{j}?n={n}`);\n"
                   f"{ind}return {k}?.ok ?? false; // {self.sentence()}\n}};\n")
        elif lang == 3:
            src = (f"fn {i}<'a>({j}: &'a [u8]) -> Result<Vec<u32>, String> {{\n{ind}let {k}: u64 = {n}_u64;\n"
                   f"{ind}Ok({j}.iter().map(|b| *b as u32).collect()) // {self.word()}\n}}\n")
        elif lang == 4:
            src = (f"SELECT {i}, COUNT(*) AS {j}\nFROM {k}\nWHERE {i} <> '{self.word()}' AND id > {n}\n"
                   f"GROUP BY 1\nORDER BY 2 DESC;\n")
        elif lang == 5:
            src = (f"#!/bin/bash\nset -euo pipefail\n{i}=\"${{1:-{n}}}\"\nfor f in ./{j}/*.txt; do\n"
                   f"{ind}grep -E '^[a-z]+$' \"$f\" | wc -l  # {self.word()}\ndone\n")
        elif lang == 6:
            src = (f"<div class=\"{i}\" data-n=\"{n}\">\n{ind}<p>{self.sentence()}</p>\n{ind}<a href=\"https://"
                   f"example.com/{j}/{k}.html\">&amp;&lt;&gt;</a>\n</div>\n")
        else:
            src = json.dumps({i: n, j: [self.word(), None, True, n / 7], k: {"s": self.sentence()}},
                             indent=self.r.choice([2, 4]), ensure_ascii=self.r.random() < 0.5) + "\n"
        if self.r.random() < 0.3:
            src = src.replace("\n", "\r\n")
        return src

    def cjk(self):
        out = []
        for _ in range(self.r.randint(3, 40)):
            roll = self.r.random()
            if roll < 0.3:
                out.append(self.pick(CHINESE))
            elif roll < 0.45:
                out.append("".join(chr(self.r.randint(0x4E00, 0x9FA5)) for _ in range(self.r.randint(1, 12))))
            elif roll < 0.65:
                out.append(self.pick(JAPANESE))
            elif roll < 0.8:
                out.append(self.pick(KOREAN))
            elif roll < 0.9:
                out.append(self.pick(PUNCT_RUNS))
            else:
                out.append(self.pick([self.word(), self.pick(NUMBERS), " ", "\u3000", "\n", "ＡＢＣ", "ａｂｃ"]))
            if self.r.random() < 0.3:
                out.append(self.pick(["", " ", "\n", "。", "、", "，"]))
        return "".join(out)

    def scripts(self):
        out = []
        for _ in range(self.r.randint(3, 30)):
            out.append(self.pick(self.pick(list(SCRIPTS.values()))))
            out.append(self.pick([" ", " ", ", ", ". ", "\n", "", "-", "'s ", " 123 "]))
        return "".join(out)

    def emoji(self):
        out = []
        for _ in range(self.r.randint(3, 40)):
            out.append(self.pick(EMOJI))
            if self.r.random() < 0.5:
                out.append(self.pick([" ", "", "\n", self.word(), "!", " 👍", "\u200d"]))
        return "".join(out)

    def whitespace(self):
        out = []
        for _ in range(self.r.randint(3, 30)):
            roll = self.r.random()
            if roll < 0.4:
                unit = self.pick([" ", "\t", "\n", "\r\n", "\r", " \n", "\t\n", "\u3000", "\u00a0",
                                  "\u2003", "\x0b", "\x0c", "\u0085", "\u2028"])
                reps = self.r.randint(1, 48) if self.r.random() < 0.9 else self.r.randint(49, 300)
                out.append(unit * reps)
            elif roll < 0.6:
                out.append("".join(self.pick([" ", "\t", "\n", "\r"]) for _ in range(self.r.randint(1, 60))))
            else:
                out.append(self.pick([self.word(), self.pick(NUMBERS), self.pick(PUNCT_RUNS), "中文", "😀"]))
        return "".join(out)

    def numbers(self):
        out = []
        for _ in range(self.r.randint(5, 60)):
            roll = self.r.random()
            if roll < 0.5:
                out.append(str(self.r.randint(0, 10 ** self.r.randint(1, 25))))
            else:
                out.append(self.pick(NUMBERS))
            out.append(self.pick([" ", ",", ", ", ".", "\n", "", "-", "/", "x", "%", " + ", "=", "a"]))
        return "".join(out)

    def punct(self):
        out = []
        for _ in range(self.r.randint(5, 60)):
            out.append(self.pick(PUNCT_RUNS) * self.r.randint(1, 4))
            out.append(self.pick(["", " ", "\n", "\r\n", "/\n", "\n\n", self.word(), " x", "//\r\n"]))
        return "".join(out)

    def marks(self):
        out = []
        for _ in range(self.r.randint(5, 40)):
            base = self.pick(["a", "E", "x", " ", "1", "", "中", "ß", "\n", "'", "й", "ǅ"])
            marks = "".join(self.pick(ZALGO_MARKS) for _ in range(self.r.randint(1, 8)))
            out.append(base + marks)
            if self.r.random() < 0.4:
                out.append(self.pick([" ", "s", "'s", "T", "\u0301'T"]))
        return unicodedata.normalize("NFD", "".join(out)) if self.r.random() < 0.3 else "".join(out)

    def odd(self):
        out = []
        for _ in range(self.r.randint(5, 50)):
            roll = self.r.random()
            if roll < 0.5:
                out.append(self.pick(ODD))
            elif roll < 0.7:
                out.append(self.word())
            else:
                out.append(self.pick([" ", "\n", "'s", "x", "1", "中", "😀", "!"]))
        return "".join(out)

    def soup(self):
        # Code points drawn per general category: every class the patterns look at, uniformly
        # across all assigned code points of that category.
        cats = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Zs", "Cc", "Cf",
                "Co", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zl", "Zp"]
        out = []
        for _ in range(self.r.randint(20, 300)):
            if self.r.random() < 0.3:
                out.append(self.pick([" ", "\n", "'", "s", "A", "a", "1", "中", "\r\n", "/"]))
            else:
                out.append(chr(self.pick(self.by_cat[self.pick(cats)])))
        return "".join(out)

    def dense(self):
        # The characters each alternative distinguishes, concatenated at random: prefixes,
        # upper/lower/modifier/other letters, marks, Han vs kana, digits of several scripts,
        # the contraction letters (incl. U+017F), newline variants, spaces of several kinds.
        alphabet = ["'", "'", "s", "S", "\u017f", "t", "T", "r", "R", "e", "E", "v", "m", "l", "L", "d", "D",
                    "A", "a", "Z", "\u01c5", "\u02b0", "\u00aa", "\u0301", "\u0903", "\u20dd", " ", " ", "  ",
                    "\t", "\n", "\r", "\r\n", "\n\n", "/", "!", ".", "1", "12", "\u0663", "\u00bd", "\u2167",
                    "\u4e2d", "\u2e80", "\u3007", "\u3005", "\u3042", "\u30fc", "\uac00", "\u3000", "\u00a0",
                    "\u0085", "\ufeff", "\u200b", "\u200d", "\U0001f600", "\U0001f3fb", "\ufffd", "\x00",
                    "\x1c", "\u2028", "\U00020000", "\u0416", "\u05d0", "\u0627", "$", "_", "-"]
        return "".join(self.pick(alphabet) for _ in range(self.r.randint(10, 400)))


KINDS = [("prose", 8), ("code", 6), ("cjk", 4), ("scripts", 3), ("emoji", 2), ("whitespace", 2),
         ("numbers", 2), ("punct", 2), ("marks", 2), ("odd", 3), ("soup", 3), ("dense", 4)]


def check_text(text):
    for ch in text:
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF:
            raise ValueError("surrogate in corpus")
        nonchar = (cp & 0xFFFE) == 0xFFFE or 0xFDD0 <= cp <= 0xFDEF
        if cp in CHANGED_AFTER_15:
            raise ValueError("U+%04X changed its classes after Unicode 15.0" % cp)
        if not assigned(ch) and not nonchar:
            raise ValueError("code point U+%04X is not assigned in Unicode %s"
                             % (cp, unicodedata.unidata_version))


def build(seed, min_bytes):
    g = Gen(seed)
    docs = []
    total = 0
    weights = [w for _, w in KINDS]
    while total < min_bytes:
        kind = g.r.choices([k for k, _ in KINDS], weights)[0]
        n = g.r.randint(1, 4)  # several generator outputs per document
        text = "".join(getattr(g, kind)() for _ in range(n))
        if g.r.random() < 0.15:  # mixed documents
            text += getattr(g, g.pick([k for k, _ in KINDS]))()
        check_text(text)
        docs.append({"name": "%s-%04d" % (kind, len(docs)), "text": text})
        total += len(text.encode("utf-8"))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--min-bytes", type=int, default=1_200_000)
    args = ap.parse_args()
    # A later Unicode would draw characters ktier's tables (15.0) do not know, and V8 does:
    # differences the cross-check would report as ktier's.
    if tuple(int(x) for x in unicodedata.unidata_version.split(".")[:2]) > (15, 0):
        sys.exit("make_corpus: this Python's Unicode is %s, later than ktier's tables (15.0.0); "
                 "run it with Debian 12's /usr/bin/python3 (Unicode 14.0.0)"
                 % unicodedata.unidata_version)
    os.makedirs(args.out_dir, exist_ok=True)
    docs = build(args.seed, args.min_bytes)
    with open(os.path.join(args.out_dir, "corpus.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    whole = "".join(d["text"] for d in docs).encode("utf-8")
    with open(os.path.join(args.out_dir, "corpus.txt"), "wb") as f:
        f.write(whole)
    print(json.dumps({"documents": len(docs), "bytes": len(whole),
                      "code_points": sum(len(d["text"]) for d in docs),
                      "unicodedata": unicodedata.unidata_version}))


if __name__ == "__main__":
    sys.exit(main())
