// BPE merge rules (tiktoken semantics) on hand-made vocabularies, and the heap merge against
// tiktoken's linear rescan.
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "test_vocab.h"
#include "tokenizer/bpe.h"

namespace ktier::tok {
namespace {

using test::byte_vocab;

std::vector<uint32_t> linear(const RankTable& t, std::string_view s) {
  std::vector<uint32_t> out;
  bpe_merge_linear(t, s, out);
  return out;
}
std::vector<uint32_t> heap(const RankTable& t, std::string_view s) {
  std::vector<uint32_t> out;
  bpe_merge_heap(t, s, out);
  return out;
}
std::vector<uint32_t> encode(const RankTable& t, std::string_view s) {
  std::vector<uint32_t> out;
  bpe_encode(t, s, out);
  return out;
}

TEST(RankTable, FindsEveryTokenAndNothingElse) {
  const RankTable t(byte_vocab({"ab", "abc", std::string("\x00\x01", 2)}));
  for (uint32_t b = 0; b < 256; ++b) EXPECT_EQ(t.find(std::string(1, static_cast<char>(b))), b);
  EXPECT_EQ(t.find("ab"), 256u);
  EXPECT_EQ(t.find("abc"), 257u);
  EXPECT_EQ(t.find(std::string("\x00\x01", 2)), 258u);
  EXPECT_EQ(t.find("abcd"), kNoRank);
  EXPECT_EQ(t.find(""), kNoRank);
  EXPECT_EQ(t.bytes(257), "abc");
  EXPECT_EQ(t.size(), 259u);
}

TEST(Bpe, LowestRankConcatenationMergesFirst) {
  // "bc" (256) ranks below "ab" (257): a|bc, then "abc" is not in the table.
  const RankTable t(byte_vocab({"bc", "ab"}));
  EXPECT_EQ(linear(t, "abc"), (std::vector<uint32_t>{'a', 256}));
  EXPECT_EQ(heap(t, "abc"), (std::vector<uint32_t>{'a', 256}));
  // Swapped ranks give the other split.
  const RankTable u(byte_vocab({"ab", "bc"}));
  EXPECT_EQ(linear(u, "abc"), (std::vector<uint32_t>{256, 'c'}));
  EXPECT_EQ(heap(u, "abc"), (std::vector<uint32_t>{256, 'c'}));
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
  // "aaa": the pair "aa" occurs at 0 and at 1 with the same rank; the left one merges.
  const RankTable t(byte_vocab({"aa"}));
  EXPECT_EQ(linear(t, "aaa"), (std::vector<uint32_t>{256, 'a'}));
  EXPECT_EQ(heap(t, "aaa"), (std::vector<uint32_t>{256, 'a'}));
  // "aaaaa" -> aa aa a, and with "aaaa" -> aaaa a.
  EXPECT_EQ(linear(t, "aaaaa"), (std::vector<uint32_t>{256, 256, 'a'}));
  const RankTable u(byte_vocab({"aa", "aaaa"}));
  EXPECT_EQ(linear(u, "aaaaa"), (std::vector<uint32_t>{257, 'a'}));
  EXPECT_EQ(heap(u, "aaaaa"), (std::vector<uint32_t>{257, 'a'}));
}

TEST(Bpe, MergesUseConcatenationsOfCurrentParts) {
  // After "ab" and "cd" merge, the next candidate is "abcd" (parts ab+cd), not "bc".
  const RankTable t(byte_vocab({"ab", "cd", "bc", "abcd"}));
  EXPECT_EQ(linear(t, "abcd"), (std::vector<uint32_t>{259}));
  const RankTable u(byte_vocab({"ab", "cd", "abc"}));  // "abc" is not ab+cd: never formed
  EXPECT_EQ(linear(u, "abcd"), (std::vector<uint32_t>{256, 257}));
  EXPECT_EQ(heap(u, "abcd"), (std::vector<uint32_t>{256, 257}));
}

TEST(Bpe, WholePieceLookupComesFirst) {
  // "xyz" is in the table but unreachable by merges ("xy"/"yz" absent): bpe_encode finds it,
  // the merge loop alone cannot.
  const RankTable t(byte_vocab({"xyz"}));
  EXPECT_EQ(encode(t, "xyz"), (std::vector<uint32_t>{256}));
  EXPECT_EQ(linear(t, "xyz"), (std::vector<uint32_t>{'x', 'y', 'z'}));
  EXPECT_TRUE(encode(t, "").empty());
}

// A random vocabulary grown by merging random adjacent pairs of sample strings, so that the
// merge loop has real work (and many equal-rank repeats) to do.
RankTable random_vocab(std::mt19937& rng, const std::string& alphabet, int n_merges) {
  std::vector<std::string> v = byte_vocab();
  std::vector<std::string> pool(alphabet.size());
  for (size_t i = 0; i < alphabet.size(); ++i) pool[i] = std::string(1, alphabet[i]);
  std::vector<std::string> seen(v.begin(), v.end());
  for (int i = 0; i < n_merges; ++i) {
    const std::string m = pool[rng() % pool.size()] + pool[rng() % pool.size()];
    if (m.size() > 12 || std::find(v.begin(), v.end(), m) != v.end()) continue;
    v.push_back(m);
    pool.push_back(m);
  }
  return RankTable(v);
}

TEST(Bpe, HeapAndLinearAgreeOnRandomInput) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    const std::string alphabet = round % 2 ? "ab " : "abcde \n";
    const RankTable t = random_vocab(rng, alphabet, 300);
    for (int k = 0; k < 50; ++k) {
      std::string s(1 + rng() % 400, ' ');
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
      ASSERT_EQ(linear(t, s), heap(t, s)) << "round " << round << " input '" << s << "'";
    }
  }
}

TEST(Bpe, LongRunIsNotQuadratic) {
  // 200,000 spaces with a vocabulary of space runs: the heap merge must finish quickly
  // (tiktoken's linear rescan needs ~10^10 steps here).
  std::vector<std::string> merges;
  for (int n = 2; n <= 64; n *= 2) merges.push_back(std::string(n, ' '));
  const RankTable t(byte_vocab(merges));
  const std::string s(200000, ' ');
  const double t0 = test::thread_cpu_seconds();
  const auto ids = encode(t, s);
  const double secs = test::thread_cpu_seconds() - t0;  // CPU time: robust on a busy machine
  ASSERT_EQ(ids.size(), 200000u / 64 + (200000 % 64 ? 1 : 0));
  EXPECT_LT(secs, 5.0);  // quadratic behaviour would take minutes
}

}  // namespace
}  // namespace ktier::tok
