// Tokenizer loading and validation, special tokens, decoding, streaming, round trips.
#include <cstdio>
#include <random>

#include <gtest/gtest.h>

#include "common/test_paths.h"
#include "test_vocab.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace ktier::tok {
namespace {

namespace fs = std::filesystem;
using test::byte_vocab;
using test::fresh_dir;
using test::write_file;
using Ids = std::vector<uint32_t>;

Tokenizer make(std::vector<AddedToken> added = {}, uint32_t n_added = 0,
               SplitPattern p = SplitPattern::kK3, std::vector<std::string> merges = test::demo_merges()) {
  auto t = Tokenizer::from_parts(byte_vocab(merges), std::move(added), n_added, p);
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(t).value();
}

// ---- loading and validation ----------------------------------------------------------------

fs::path write_tokenizer(const std::string& name, const std::string& model, const std::string& config) {
  const fs::path d = fresh_dir(name);
  write_file(d / "tiktoken.model", model);
  write_file(d / "tokenizer_config.json", config);
  return d;
}

const char* kConfig = R"({"added_tokens_decoder": {
  "258": {"content": "<|a|>", "special": true},
  "260": {"content": "<|open|>", "special": false}}})";

TEST(TokenizerLoad, LoadsFolderAndNamesReservedIds) {
  const auto d = write_tokenizer("load_ok", test::tiktoken_text(byte_vocab({"ab", "cd"})), kConfig);
  auto t = Tokenizer::load(d);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->n_ranks(), 258u);
  EXPECT_EQ(t->vocab_size(), 261u);  // added block 258..260 (largest configured id)
  EXPECT_EQ(t->added_token_id("<|a|>"), 258u);
  EXPECT_EQ(t->added_token_id("<|reserved_token_259|>"), 259u);
  EXPECT_EQ(t->added_token_id("<|open|>"), 260u);
  EXPECT_FALSE(t->added_token_id("<|nope|>").has_value());
  EXPECT_EQ(t->encode("abcd"), (Ids{256, 257}));
}

TEST(TokenizerLoad, ToleratesCrLfAndEmptyLines) {
  std::string model;
  const auto v = byte_vocab({"ab"});
  for (size_t r = 0; r < v.size(); ++r) model += test::b64(v[r]) + " " + std::to_string(r) + "\r\n" + (r % 50 ? "" : "\n");
  const auto d = write_tokenizer("crlf", model, "{}");
  auto t = Tokenizer::load(d);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->n_ranks(), 257u);
  EXPECT_EQ(t->vocab_size(), 257u + 256u);  // "{}": no added_tokens_decoder -> K3 default block
}

TEST(TokenizerLoad, AddedBlockSizeRule) {
  const std::string model = test::tiktoken_text(byte_vocab());
  auto none = Tokenizer::load(write_tokenizer("rule_none", model, R"({"added_tokens_decoder": {}})"));
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->vocab_size(), 256u);
  auto k3_default = Tokenizer::load(write_tokenizer("rule_default", model, R"({"model_max_length": 5})"));
  ASSERT_TRUE(k3_default.is_ok());
  EXPECT_EQ(k3_default->vocab_size(), 512u);  // K3's 256 reserved ids
  EXPECT_EQ(k3_default->added_token_id("<|reserved_token_511|>"), 511u);
  // A bare tiktoken.model file: no added ids.
  const auto d = fresh_dir("rule_file");
  write_file(d / "vocab.tiktoken", model);
  auto bare = Tokenizer::load(d / "vocab.tiktoken");
  ASSERT_TRUE(bare.is_ok());
  EXPECT_EQ(bare->vocab_size(), 256u);
}

struct BadCase {
  const char* name;
  std::string model;
  std::string config;
  int exit_code;
  const char* message;  // substring the error must contain
};

TEST(TokenizerLoad, RejectsBadFilesWithFileAndLine) {
  const std::string good = test::tiktoken_text(byte_vocab({"ab"}));
  std::string dup = good + test::b64("cd") + " 256\n";
  // Rank 257 skipped: 258 lines hold tokens (the empty ones none), so 258 is out of range.
  std::string gap = good + test::b64("cd") + " 258\n\n\r\n\n";
  std::string bad64 = good + "Y!== 257\n";
  std::string nonpadded = good + "YWJj" "ZA 257\n";
  std::string no_rank = good + test::b64("cd") + "\n";
  std::string neg_rank = good + test::b64("cd") + " -1\n";
  std::string dup_bytes = good + test::b64("ab") + " 257\n";
  // 258 lines (the last ends in "\n"), so 258 is one past the last possible rank.
  std::string past_lines = good + test::b64("cd") + " 258\n";
  std::string missing_byte;  // byte 0x41 absent
  for (int b = 0, r = 0; b < 256; ++b) {
    if (b != 0x41) missing_byte += test::b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(r++) + "\n";
  }
  const std::vector<BadCase> cases = {
      {"dup_rank", dup, "{}", 3, "tiktoken.model:258: duplicate rank 256 (also on line 257)"},
      {"gap", gap, "{}", 3,
       "rank 258 is out of range (the file has 258 token lines, so ranks must lie below that)"},
      {"bad_base64", bad64, "{}", 3, "tiktoken.model:258: token 'Y!==' is not valid base64"},
      {"unpadded", nonpadded, "{}", 3, "tiktoken.model:258:"},
      {"no_rank", no_rank, "{}", 3, "tiktoken.model:258: expected '<base64> <rank>'"},
      {"neg_rank", neg_rank, "{}", 3, "rank '-1' is not a decimal number"},
      {"dup_bytes", dup_bytes, "{}", 3, "tiktoken.model: ranks 256 and 257 have the same bytes"},
      {"past_lines", past_lines, "{}", 3,
       "rank 258 is out of range (the file has 258 token lines, so ranks must lie below that)"},
      {"missing_byte", missing_byte, "{}", 3, "tiktoken.model: the single byte 0x41 has no rank"},
      {"bad_json", good, "{\"added_tokens_decoder\": ", 3, "tokenizer_config.json: not a JSON object"},
      {"nul", good, std::string("{}") + '\0' + "junk", 3, "tokenizer_config.json: not a JSON object: it holds a NUL byte at byte 2"},
      {"id_in_ranks", good, R"({"added_tokens_decoder": {"5": {"content": "x"}}})", 3, "inside the rank range"},
      {"bad_key", good, R"({"added_tokens_decoder": {"x": {"content": "x"}}})", 3, "not a decimal id"},
      {"no_content", good, R"({"added_tokens_decoder": {"300": {"special": true}}})", 3, "string \"content\""},
      {"dup_content", good, R"({"added_tokens_decoder": {"257": {"content": "<|x|>"}, "258": {"content": "<|x|>"}}})",
       3, "tokenizer_config.json: added tokens 257 and 258 have the same content '<|x|>'"},
      {"reserved_clash", good, R"({"added_tokens_decoder": {"257": {"content": "<|reserved_token_258|>"}, "259": {"content": "y"}}})",
       3, "added tokens 257 and 258 (not listed: its default name) have the same content"},
  };
  for (const auto& c : cases) {
    const auto d = write_tokenizer(std::string("bad_") + c.name, c.model, c.config);
    auto t = Tokenizer::load(d);
    ASSERT_FALSE(t.is_ok()) << c.name;
    EXPECT_EQ(t.status().exit_code(), c.exit_code) << c.name << ": " << t.status().message();
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << c.name << ": " << t.status().message();
  }
}

TEST(TokenizerLoad, MissingFilesAreUsageErrorsNamingThePath) {
  const auto d = fresh_dir("missing");
  auto t = Tokenizer::load(d);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().exit_code(), 2);
  EXPECT_NE(t.status().message().find((d / "tiktoken.model").string()), std::string::npos);
  write_file(d / "tiktoken.model", test::tiktoken_text(byte_vocab()));
  t = Tokenizer::load(d);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().exit_code(), 2);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
  t = Tokenizer::load(d / "nowhere");
  EXPECT_EQ(t.status().exit_code(), 2);
}

// ---- special tokens ------------------------------------------------------------------------

std::vector<AddedToken> markers(uint32_t base) {
  return {{base, "<|a|>", true}, {base + 1, "<|a", true}, {base + 2, "[EOS]", true}, {base + 3, "<|open|>", false}};
}

TEST(TokenizerEncode, SpecialTokensOnlyWhenAllowed) {
  const uint32_t n = static_cast<uint32_t>(byte_vocab(test::demo_merges()).size());
  const Tokenizer t = make(markers(n), 6);
  Ids ordinary;
  t.encode_ordinary("x<|a|>y", ordinary);
  EXPECT_EQ(t.encode("x<|a|>y"), ordinary);  // default: markers are text
  EXPECT_EQ(t.encode("x<|a|>y", true), (Ids{'x', n, 'y'}));
  EXPECT_EQ(t.encode("<|a|><|a", true), (Ids{n, n + 1}));        // longest at a position
  EXPECT_EQ(t.encode("<|a[EOS]", true), (Ids{n + 1, n + 2}));
  EXPECT_EQ(t.encode("[EOS]hello<|open|>", true), (Ids{n + 2, t.encode("hello")[0], n + 3}));
  EXPECT_EQ(t.encode("<|reserved_token_" + std::to_string(n + 5) + "|>", true), (Ids{n + 5}));
  EXPECT_EQ(t.encode("<|", true), (Ids{'<', '|'}));
  // Text around a marker is split on its own: the space before "world" stays with it.
  EXPECT_EQ(t.encode("hello<|a|> world", true), (Ids{t.encode("hello")[0], n, t.encode(" world")[0]}));
}

TEST(TokenizerEncode, LongInputChunkingFollowsTheReference) {
  const Tokenizer k3 = make({}, 0, SplitPattern::kK3, {"aa", "aaaa"});
  const Tokenizer o2 = make({}, 0, SplitPattern::kO200k, {"aa", "aaaa"});
  const uint32_t aa = 256, aaaa = 257;
  EXPECT_EQ(k3.encode("aaaaa"), (Ids{aaaa, 'a'}));
  EXPECT_EQ(k3.encode_with_limits("aaaaa", false, {0, 2}), (Ids{aa, aa, 'a'}));
  EXPECT_EQ(k3.encode_with_limits("aaaaa", false, {3, 0}), (Ids{aa, 'a', aa}));
  EXPECT_EQ(o2.encode_with_limits("aaaaa", false, {0, 2}), (Ids{aaaa, 'a'}));  // o200k: no chunking
  // The default run limit is 25,000 code points: with "aaa" merged after "aa", 25,001 a's give
  // 12,499 aa + aaa in one piece but 12,500 aa + a when cut before the last.
  const Tokenizer k3_odd = make({}, 0, SplitPattern::kK3, {"aa", "aaa"});
  const uint32_t aaa = 257;
  const std::string run(25001, 'a');
  Ids cut(12500, aa), whole(12499, aa);
  cut.push_back('a');
  whole.push_back(aaa);
  EXPECT_EQ(k3_odd.encode_with_limits(run, false, {0, 0}), whole);
  EXPECT_EQ(k3_odd.encode(run), cut);
  EXPECT_EQ(k3_odd.encode_with_limits(run, false, {0, 25000}), cut);
}

// ---- decoding ------------------------------------------------------------------------------

TEST(TokenizerDecode, BytesContentsAndErrors) {
  const uint32_t n = static_cast<uint32_t>(byte_vocab(test::demo_merges()).size());
  const Tokenizer t = make(markers(n), 6);
  EXPECT_EQ(t.decode(Ids{'h', 'i'}).value(), "hi");
  EXPECT_EQ(t.decode(Ids{n + 3, 'x', n}).value(), "<|open|>x<|a|>");
  EXPECT_EQ(t.decode(Ids{n + 3, 'x', n}, true).value(), "<|open|>x");  // <|open|> is not "special"
  EXPECT_EQ(t.decode(Ids{n + 4}).value(), "<|reserved_token_" + std::to_string(n + 4) + "|>");
  const auto bad = t.decode(Ids{'a', n + 6});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().exit_code(), 2);
  EXPECT_NE(bad.status().message().find(std::to_string(n + 6)), std::string::npos);
}

TEST(TokenizerDecode, ShownAsTextHidesStopsMarkupAndUnknownIds) {
  const uint32_t n = static_cast<uint32_t>(byte_vocab(test::demo_merges()).size());
  const Tokenizer t = make(markers(n), 6);  // ids n .. n+5; <|a|> special, <|open|> not
  const std::vector<int32_t> stops = {int32_t('z'), int32_t(n + 2)};
  const auto shown = [&](uint32_t id, bool special = false) {
    return shown_as_text(t, stops, static_cast<int32_t>(id), special);
  };
  EXPECT_TRUE(shown('h'));
  EXPECT_FALSE(shown('z'));                  // a stop id ends the answer
  EXPECT_FALSE(shown(n + 2, true));          // even with special ones shown
  EXPECT_FALSE(shown(n));                    // special: markup
  EXPECT_TRUE(shown(n, true));
  EXPECT_TRUE(shown(n + 3));                 // an added token that is not special
  EXPECT_FALSE(shown(n + 6, true));          // past the tokenizer (the model's own)
  EXPECT_FALSE(shown_as_text(t, stops, -1, true));
}

TEST(StreamingDecoder, HoldsBackPartialUtf8) {
  const Tokenizer t = make({}, 0, SplitPattern::kK3, {});  // byte-level: one id per byte
  StreamingDecoder s(t);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, 4 bytes -> 4 ids
  EXPECT_EQ(s.push('a').value(), "a");
  EXPECT_EQ(s.push(0xF0).value(), "");
  EXPECT_EQ(s.push(0x9F).value(), "");
  EXPECT_EQ(s.push(0x98).value(), "");
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_EQ(s.push(0x80).value(), emoji);
  EXPECT_EQ(s.push(0xE4).value(), "");
  EXPECT_EQ(s.push(0xB8).value(), "");
  EXPECT_EQ(s.flush(), "\xE4\xB8");  // a truncated sequence at the end comes out raw
  EXPECT_EQ(s.flush(), "");
  // Bytes that can never complete are passed through at once.
  EXPECT_EQ(s.push(0xFF).value(), "\xFF");
  EXPECT_EQ(s.push(0xE0).value(), "");
  EXPECT_EQ(s.push(0x80).value(), "\xE0\x80");  // E0 80 is an overlong prefix: never valid
  EXPECT_FALSE(s.push(100000).is_ok());
}

TEST(StreamingDecoder, IncompleteSuffixRules) {
  EXPECT_EQ(incomplete_utf8_suffix(""), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xC3"), 1u);
  EXPECT_EQ(incomplete_utf8_suffix("\xC3\xA9"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("\xE4\xB8"), 2u);
  EXPECT_EQ(incomplete_utf8_suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("\xED\xA0"), 0u);  // would be a surrogate
  EXPECT_EQ(incomplete_utf8_suffix("\xF4\x90"), 0u);  // above U+10FFFF
  EXPECT_EQ(incomplete_utf8_suffix("\xF0\x80"), 0u);  // overlong
  EXPECT_EQ(incomplete_utf8_suffix("\xC0"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("\x80\x80\x80"), 0u);
}

// After every push, what came out is the whole text so far less exactly the bytes that may still
// complete a character: a final well-formed sequence cut short (utf8_maximal_subpart, not the
// decoder's own rule), nothing more and nothing less; all of it once flushed.
TEST(StreamingDecoder, ConcatenationEqualsDecode) {
  const auto may_complete = [](const std::string& text) -> size_t {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t k = 1; k <= 3 && k <= text.size(); ++k) {
      const unsigned char* at = p + text.size() - k;
      if ((*at & 0xC0) == 0x80) continue;  // a continuation byte: its lead is further back
      // A lead (C2..F4) whose bytes so far are all well-formed, and not yet a character.
      const bool lead = *at >= 0xC2 && *at <= 0xF4;
      return lead && utf8_maximal_subpart(at, k) == k && decode_utf8(at, k).cp == kInvalidCp ? k
                                                                                             : 0;
    }
    return 0;
  };
  const Tokenizer bytes = make({}, 0, SplitPattern::kK3, {});  // one id per byte: more cuts
  const Tokenizer merged = make();
  std::mt19937 rng(99);
  size_t held_rounds = 0;
  for (int round = 0; round < 400; ++round) {
    const Tokenizer& t = round % 2 ? bytes : merged;
    Ids ids(rng() % 40);
    for (auto& id : ids) {
      // Byte ids biased to UTF-8 leads and continuations, so that characters are cut often.
      id = rng() % t.vocab_size();
      if (&t == &bytes && rng() % 2) id = 0x80 + rng() % 0x78;
    }
    StreamingDecoder s(t);
    std::string streamed;
    for (size_t i = 0; i < ids.size(); ++i) {
      streamed += s.push(ids[i]).value();
      const std::string so_far = t.decode(Ids(ids.begin(), ids.begin() + i + 1)).value();
      const size_t hold = may_complete(so_far);
      held_rounds += hold > 0;
      ASSERT_EQ(streamed, so_far.substr(0, so_far.size() - hold)) << "round " << round;
      ASSERT_EQ(s.pending_bytes(), hold);
    }
    streamed += s.flush();
    ASSERT_EQ(streamed, t.decode(ids).value());
  }
  EXPECT_GT(held_rounds, 100u) << "too few cut characters to test holding back";
}

// ---- round trips ---------------------------------------------------------------------------

TEST(TokenizerRoundTrip, RandomBytes) {
  const Tokenizer k3 = make(), o2 = make({}, 0, SplitPattern::kO200k);
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    std::string s(rng() % 200, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 8 ? "ab \n\xE4\xB8\xAD'"[rng() % 8] : rng());
    ASSERT_EQ(k3.decode(k3.encode(s)).value(), s);
    ASSERT_EQ(o2.decode(o2.encode(s)).value(), s);
  }
}

TEST(TokenizerRoundTrip, CorpusSamples) {
  // A small corpus from the same generator the cross-check uses.
  const fs::path d = fresh_dir("corpus");
  const std::string cmd = "/usr/bin/python3 " + (test::source_dir() / "tools/tokenizer/make_corpus.py").string() +
                          " " + d.string() + " --min-bytes 150000 --seed 7 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::FILE* f = std::fopen((d / "corpus.txt").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  ASSERT_GE(text.size(), 150000u);
  const uint32_t n = static_cast<uint32_t>(byte_vocab(test::demo_merges()).size());
  const Tokenizer t = make(markers(n), 6);
  for (size_t start = 0; start < text.size(); start += 5000) {
    const std::string part = text.substr(start, 5000);
    ASSERT_EQ(t.decode(t.encode(part)).value(), part) << "at byte " << start;
    ASSERT_EQ(t.decode(t.encode(part, true)).value(), part) << "at byte " << start;
  }
}

}  // namespace
}  // namespace ktier::tok
