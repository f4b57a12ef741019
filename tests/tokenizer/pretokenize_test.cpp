// The split patterns on targeted strings: every alternative, its backtracking, and the
// differences between K3 and o200k. Expected pieces were worked out by hand from the regex
// and agree with js-tiktoken (tools/tokenizer/xcheck.py checks the same engine at scale).
#include <random>

#include <gtest/gtest.h>

#include "test_vocab.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace ktier::tok {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(std::string_view text, SplitPattern p = SplitPattern::kK3) {
  std::vector<std::string_view> v;
  split_pieces(text, p, v);
  return Pieces(v.begin(), v.end());
}
Pieces k3(std::string_view t) { return split(t, SplitPattern::kK3); }
Pieces o2(std::string_view t) { return split(t, SplitPattern::kO200k); }

Pieces chunks(std::string_view text, size_t max_chunk, size_t max_run) {
  std::vector<std::string_view> v;
  chunk_long_input(text, ChunkLimits{max_chunk, max_run}, v);
  return Pieces(v.begin(), v.end());
}

TEST(UnicodeTables, ClassesOfSampleCodePoints) {
  EXPECT_EQ(cp_bits('A'), kCpLu);
  EXPECT_EQ(cp_bits('a'), kCpLl);
  EXPECT_EQ(cp_bits(0x01C5), kCpLt);  // ǅ
  EXPECT_EQ(cp_bits(0x02B0), kCpLm);  // ʰ
  EXPECT_EQ(cp_bits(0x4E2D), kCpLo | kCpHAN);  // 中
  EXPECT_EQ(cp_bits(0x3042), kCpLo);  // あ (Hiragana, not Han)
  EXPECT_EQ(cp_bits(0x3005), kCpLm | kCpHAN);  // 々
  EXPECT_EQ(cp_bits(0x3007), kCpN | kCpHAN);   // 〇 (Nl)
  EXPECT_EQ(cp_bits(0x2E80), kCpHAN);          // ⺀ (So)
  EXPECT_EQ(cp_bits(0x20000), kCpLo | kCpHAN);  // CJK Ext. B
  EXPECT_EQ(cp_bits(0x0301), kCpM);
  EXPECT_EQ(cp_bits('7'), kCpN);
  EXPECT_EQ(cp_bits(0x00BD), kCpN);  // ½ (No)
  EXPECT_EQ(cp_bits(' '), kCpWS | kCpPYSPACE);
  EXPECT_EQ(cp_bits(0x0085), kCpWS | kCpPYSPACE);  // NEL: White_Space
  EXPECT_EQ(cp_bits(0x001C), kCpPYSPACE);          // Python-space only
  EXPECT_EQ(cp_bits(0xFEFF), 0);                   // BOM: not White_Space (JS \s differs)
  EXPECT_EQ(cp_bits(0x200B), 0);                   // ZWSP: Cf
  EXPECT_EQ(cp_bits(0x110000), 0);
  EXPECT_EQ(cp_bits(kInvalidCp), 0);
  EXPECT_STREQ(kUnicodeVersion, "15.0.0");
}

TEST(Utf8, DecodesWellFormedAndRejectsTheRest) {
  auto dec = [](std::string_view s) {
    return decode_utf8(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  };
  EXPECT_EQ(dec("\xE4\xB8\xAD").cp, 0x4E2Du);
  EXPECT_EQ(dec("\xF0\x9F\x98\x80").len, 4u);
  for (const char* bad : {"\x80", "\xC0\xAF", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\xE4\xB8", "\xF0\x9F\x98"}) {
    const auto d = dec(bad);
    EXPECT_EQ(d.cp, kInvalidCp) << bad;
    EXPECT_EQ(d.len, 1u) << bad;
  }
}

TEST(SplitK3, HanRunsAreTheirOwnPieces) {
  EXPECT_EQ(k3("你好世界"), Pieces({"你好世界"}));
  EXPECT_EQ(k3("中文English混合"), Pieces({"中文", "English", "混合"}));
  EXPECT_EQ(k3("北京市 Pascal"), Pieces({"北京市", " Pascal"}));
  EXPECT_EQ(k3("日本語のテキスト"), Pieces({"日本語", "のテキスト"}));  // kana are not Han
  EXPECT_EQ(k3("你好123"), Pieces({"你好", "123"}));
  EXPECT_EQ(k3("你好。世界！"), Pieces({"你好", "。", "世界", "！"}));  // Script=Han, not scx
  EXPECT_EQ(k3("〇々"), Pieces({"〇々"}));  // Han numeral (Nl) and iteration mark (Lm)
  EXPECT_EQ(k3("!⺀"), Pieces({"!⺀"}));    // a Han radical is a symbol inside a symbol run
  EXPECT_EQ(k3("⺀!"), Pieces({"⺀", "!"}));  // ... but starts a Han run
  EXPECT_EQ(k3(" 中"), Pieces({" ", "中"}));  // Han is a letter: never the optional prefix
}

TEST(SplitO200k, HanIsAnOrdinaryLetter) {
  EXPECT_EQ(o2("中文English混合"), Pieces({"中文English混合"}));
  EXPECT_EQ(o2("日本語のテキスト"), Pieces({"日本語のテキスト"}));
  EXPECT_EQ(o2("北京市 Pascal"), Pieces({"北京市", " Pascal"}));
}

TEST(SplitK3, LetterAlternatives) {
  EXPECT_EQ(k3("Hello world"), Pieces({"Hello", " world"}));
  EXPECT_EQ(k3("helloWorld"), Pieces({"hello", "World"}));
  EXPECT_EQ(k3("HELLOworld"), Pieces({"HELLOworld"}));  // 2: upper* then lower+
  EXPECT_EQ(k3("McDonald"), Pieces({"Mc", "Donald"}));
  EXPECT_EQ(k3("THIS IS"), Pieces({"THIS", " IS"}));     // 3: upper+
  EXPECT_EQ(k3("ǅemal"), Pieces({"ǅemal"}));             // Lt is upper-ish
  EXPECT_EQ(k3("ʰa"), Pieces({"ʰa"}));                   // Lm is both
  EXPECT_EQ(k3("Aʰ"), Pieces({"Aʰ"}));                   // 2 after U* gives back ʰ to L+
  EXPECT_EQ(k3("ABʰC"), Pieces({"ABʰ", "C"}));           // 2 gives back "C", keeps ʰ as L+
  EXPECT_EQ(k3("\tb"), Pieces({"\tb"}));                 // a tab is a possible prefix
  EXPECT_EQ(k3("\nb"), Pieces({"\n", "b"}));             // a newline is not
  EXPECT_EQ(k3("$x"), Pieces({"$x"}));
  EXPECT_EQ(k3("1a"), Pieces({"1", "a"}));                // a digit is not
}

TEST(SplitK3, ContractionsAreCaseInsensitive) {
  for (const char* w : {"don't", "DON'T", "Don'T", "it's", "IT'S", "we're", "WE'RE", "We'rE", "you've",
                        "YOU'VE", "I'm", "I'M", "I'll", "I'LL", "I'lL", "he'd", "HE'D"}) {
    EXPECT_EQ(k3(w), Pieces({w})) << w;
    EXPECT_EQ(o2(w), Pieces({w})) << w;
  }
  EXPECT_EQ(k3("it'ſ"), Pieces({"it'ſ"}));  // U+017F folds to s
  EXPECT_EQ(k3("it’s"), Pieces({"it", "’s"}));  // a curly apostrophe is not the contraction
  EXPECT_EQ(k3("x'sy"), Pieces({"x's", "y"}));
  EXPECT_EQ(k3("DON'Te"), Pieces({"DON'T", "e"}));
  EXPECT_EQ(k3("'s"), Pieces({"'s"}));  // prefix ' + letter s
  EXPECT_EQ(k3("a'x"), Pieces({"a", "'x"}));
  EXPECT_EQ(k3("a're'"), Pieces({"a're", "'"}));
  EXPECT_EQ(k3("I'LLL"), Pieces({"I'LL", "L"}));
}

TEST(SplitK3, DigitsOneToThree) {
  EXPECT_EQ(k3("1234567"), Pieces({"123", "456", "7"}));
  EXPECT_EQ(k3("١٢٣٤"), Pieces({"١٢٣", "٤"}));  // Arabic-Indic digits
  EXPECT_EQ(k3("x²³½"), Pieces({"x", "²³½"}));    // No
  EXPECT_EQ(k3("ⅫⅫ1"), Pieces({"ⅫⅫ1"}));        // Nl
  EXPECT_EQ(k3("12a34"), Pieces({"12", "a", "34"}));
  EXPECT_EQ(k3(" 12"), Pieces({" ", "12"}));
}

TEST(SplitK3, SymbolRuns) {
  EXPECT_EQ(k3("a  !!!\n\nb"), Pieces({"a", " ", " !!!\n\n", "b"}));
  EXPECT_EQ(k3("!?\r\n"), Pieces({"!?\r\n"}));
  EXPECT_EQ(k3(" ..."), Pieces({" ..."}));
  EXPECT_EQ(k3("\t..."), Pieces({"\t", "..."}));  // only U+0020 is the optional space
  EXPECT_EQ(k3("👨‍👩‍👧"), Pieces({"👨‍👩‍👧"}));       // emoji and ZWJ are symbols
  EXPECT_EQ(k3("a\xEF\xBB\xBF" "b"), Pieces({"a", "\xEF\xBB\xBF" "b"}));  // BOM: a prefix, not a space
}

TEST(SplitPatterns, SlashAfterSymbolNewlinesOnlyInO200k) {
  EXPECT_EQ(k3("!\n/x"), Pieces({"!\n", "/x"}));
  EXPECT_EQ(o2("!\n/x"), Pieces({"!\n/", "x"}));
  EXPECT_EQ(k3("//\n//"), Pieces({"//\n", "//"}));
  EXPECT_EQ(o2("//\n//"), Pieces({"//\n//"}));
}

TEST(SplitK3, WhitespaceRules) {
  EXPECT_EQ(k3("  \n"), Pieces({"  \n"}));                      // 6
  EXPECT_EQ(k3("abc  \n  "), Pieces({"abc", "  \n", "  "}));    // 6, then 7 at the end
  EXPECT_EQ(k3("hello   "), Pieces({"hello", "   "}));          // 7: trailing spaces whole
  EXPECT_EQ(k3("a    b"), Pieces({"a", "   ", " b"}));          // 7 leaves one space
  EXPECT_EQ(k3("a\n\n  b"), Pieces({"a", "\n\n", " ", " b"}));
  EXPECT_EQ(k3("a \n b"), Pieces({"a", " \n", " b"}));
  EXPECT_EQ(k3("a\r\n\r\nb"), Pieces({"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(k3("x \t "), Pieces({"x", " \t "}));
  EXPECT_EQ(k3("a \t1"), Pieces({"a", " ", "\t", "1"}));         // 7 then 8 (one space before a digit)
  EXPECT_EQ(k3("  \n  \n x"), Pieces({"  \n  \n", " x"}));     // 6 gives back to the last newline
  EXPECT_EQ(k3(" "), Pieces({" "}));
  EXPECT_EQ(k3("\xC2\x85\xC2\x85" "b"), Pieces({"\xC2\x85", "\xC2\x85" "b"}));  // NEL is \s
  EXPECT_EQ(k3("a\xE3\x80\x80\xE3\x80\x80"), Pieces({"a", "\xE3\x80\x80\xE3\x80\x80"}));
}

TEST(SplitK3, CombiningMarks) {
  EXPECT_EQ(k3("\xCC\x81" "a"), Pieces({"\xCC\x81" "a"}));  // a mark is a prefix candidate
  EXPECT_EQ(k3(" \xCC\x81"), Pieces({" \xCC\x81"}));        // and a lower-ish letter
  EXPECT_EQ(k3("e\xCC\x81t\xCC\x81"), Pieces({"e\xCC\x81t\xCC\x81"}));
  EXPECT_EQ(k3("1\xCC\x81"), Pieces({"1", "\xCC\x81"}));
}

TEST(SplitK3, InvalidUtf8IsASymbolByteByByte) {
  EXPECT_EQ(k3("ab\xFF" "cd"), Pieces({"ab", "\xFF" "cd"}));
  EXPECT_EQ(k3("\xC0\xAF"), Pieces({"\xC0\xAF"}));
  EXPECT_EQ(k3("x\xE4\xB8"), Pieces({"x", "\xE4\xB8"}));  // truncated 中 at the end
  EXPECT_EQ(k3("\xE4\xB8 "), Pieces({"\xE4\xB8", " "}));
  EXPECT_EQ(k3("\xED\xA0\x80"), Pieces({"\xED\xA0\x80"}));  // an encoded surrogate: 3 bad bytes
}

TEST(Split, PiecesTileAnyByteString) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "Z", " ", "\n", "\r", "'", "s", "1", "!", "/", "\xFF", "\xE4",
                                  "\xB8", "\xAD", "\xCC\x81", "中", "ʰ", "ǅ", "\t", "\xC2\x85"};
  for (int round = 0; round < 300; ++round) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 80);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % std::size(alphabet)];
    for (const auto p : {SplitPattern::kK3, SplitPattern::kO200k}) {
      const Pieces pieces = split(s, p);
      std::string joined;
      for (const auto& x : pieces) {
        ASSERT_FALSE(x.empty());
        joined += x;
      }
      ASSERT_EQ(joined, s);
    }
  }
}

TEST(Split, LinearOnLongRuns) {
  std::string s;
  for (int i = 0; i < 50000; ++i) s += "ABCDEFGHIJ";  // 500k upper-case letters: rule 2 fails, 3 wins
  s += std::string(300000, ' ') + "x" + std::string(300000, '\n');
  const double t0 = test::thread_cpu_seconds();
  const Pieces p = k3(s);
  const double secs = test::thread_cpu_seconds() - t0;  // CPU time: robust on a busy machine
  EXPECT_EQ(p.size(), 4u);  // letters, spaces but one, " x", newlines
  EXPECT_LT(secs, 5.0);  // quadratic behaviour would take minutes
}

TEST(ChunkLongInput, CutsRunsLikeTheReference) {
  EXPECT_EQ(chunks("aaaaaaa", 0, 3), Pieces({"aaa", "aaa", "a"}));
  EXPECT_EQ(chunks("ab   cd", 0, 2), Pieces({"ab  ", " cd"}));
  EXPECT_EQ(chunks("aaa", 0, 3), Pieces({"aaa"}));
  EXPECT_EQ(chunks("中中中中中", 0, 2), Pieces({"中中", "中中", "中"}));  // code points, not bytes
  EXPECT_EQ(chunks("\xFF\xFF\xFF", 0, 2), Pieces({"\xFF\xFF", "\xFF"}));  // invalid: non-space
  EXPECT_EQ(chunks("a\x1C\x1C\x1C" "b", 0, 2), Pieces({"a\x1C\x1C", "\x1C" "b"}));  // Python space
  EXPECT_EQ(chunks("", 0, 2), Pieces({}));
}

TEST(ChunkLongInput, CutsChunksAndRestartsRuns) {
  EXPECT_EQ(chunks("abcdefghij", 4, 0), Pieces({"abcd", "efgh", "ij"}));
  // The run counter restarts in each chunk: "aaa|aaa" with max_run 4 needs no run cut.
  EXPECT_EQ(chunks("aaaaaa", 3, 4), Pieces({"aaa", "aaa"}));
  EXPECT_EQ(chunks("aaaaaaaa", 6, 4), Pieces({"aaaa", "aa", "aa"}));
  EXPECT_EQ(chunks("ab", 0, 0), Pieces({"ab"}));
}

}  // namespace
}  // namespace ktier::tok
