// Rank table and BPE merges. See bpe.h for the contract.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "common/check.h"

namespace ktier::tok {
namespace {

// A fast 64-bit hash for short byte strings: 8-byte words folded with multiply-xorshift.
uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  }
  h ^= h >> 33;  // murmur3 fmix64: every input bit reaches the low (index) and high (tag) bits
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

RankTable::RankTable(const std::vector<std::string>& tokens_by_rank) {
  size_t total = 0;
  for (const auto& t : tokens_by_rank) total += t.size();
  arena_.reserve(total);
  offsets_.reserve(tokens_by_rank.size() + 1);
  for (const auto& t : tokens_by_rank) {
    arena_ += t;
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  size_t cap = 16;
  while (cap < tokens_by_rank.size() * 2) cap <<= 1;  // load factor <= 0.5
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (uint32_t r = 0; r < tokens_by_rank.size(); ++r) {
    const std::string_view b = bytes(r);
    const uint64_t h = hash_bytes(b);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.rank_plus_1 == 0) {
        s = {r + 1, tag};
        break;
      }
      if (s.tag == tag && bytes(s.rank_plus_1 - 1) == b) {  // duplicate: the first rank wins
        if (!duplicate_) duplicate_ = std::make_pair(s.rank_plus_1 - 1, r);
        break;
      }
    }
  }
}

uint32_t RankTable::find(std::string_view b) const {
  if (slots_.empty()) return kNoRank;
  const uint64_t h = hash_bytes(b);
  const auto tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot s = slots_[i];
    if (s.rank_plus_1 == 0) return kNoRank;
    if (s.tag == tag && bytes(s.rank_plus_1 - 1) == b) return s.rank_plus_1 - 1;
  }
}

void bpe_merge_linear(const RankTable& ranks, std::string_view piece,
                      std::vector<uint32_t>& out) {
  // tiktoken's _byte_pair_merge: parts[i] = (start of part i, rank of part i ++ part i+1).
  const size_t n = piece.size();
  if (n == 0) return;
  struct Part {
    uint32_t start;
    uint32_t rank;
  };
  // Short pieces (the common case) use a stack buffer; this path is O(n^2) anyway, so callers
  // send long pieces to the heap merge.
  constexpr size_t kStack = 256;
  Part stack_parts[kStack];
  std::vector<Part> heap_parts;
  Part* parts = stack_parts;
  if (n + 1 > kStack) {
    heap_parts.resize(n + 1);
    parts = heap_parts.data();
  }
  size_t count = n + 1;  // parts[0..count): starts, the last one is the end sentinel
  auto pair_rank = [&](size_t i) {  // rank of parts[i] ++ parts[i+1], given parts as they are
    if (i + 2 >= count) return kNoRank;
    return ranks.find(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
  };
  for (size_t i = 0; i <= n; ++i) parts[i] = {static_cast<uint32_t>(i), kNoRank};
  for (size_t i = 0; i + 1 < n; ++i) parts[i].rank = pair_rank(i);
  while (count > 2) {
    uint32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 2 < count; ++i) {
      if (parts[i].rank < best) {
        best = parts[i].rank;
        at = i;
      }
    }
    if (best == kNoRank) break;
    std::copy(parts + at + 2, parts + count, parts + at + 1);
    --count;
    parts[at].rank = pair_rank(at);
    if (at > 0) parts[at - 1].rank = pair_rank(at - 1);
  }
  for (size_t i = 0; i + 1 < count; ++i) {
    const uint32_t r = ranks.find(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start));
    KTIER_CHECK(r != kNoRank);  // single bytes are validated at load; merges exist by construction
    out.push_back(r);
  }
}

void bpe_merge_heap(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out) {
  // Parts form a doubly linked list over byte offsets. A heap entry proposes merging the part
  // starting at `start` with its right neighbour ending at `end`; it is stale when either part
  // has changed since (the left part died, or the right neighbour's end moved). Popping the
  // smallest (rank, start) is exactly tiktoken's "lowest rank, leftmost on ties".
  const size_t n = piece.size();
  if (n == 0) return;
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> next(n), prev(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : kNone;
    prev[i] = i > 0 ? i - 1 : kNone;
  }
  auto end_of = [&](size_t i) { return next[i] == kNone ? n : next[i]; };
  struct Entry {
    uint32_t rank;
    size_t start;
    size_t end;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : start > o.start;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto propose = [&](size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const size_t end = end_of(next[left]);
    const uint32_t r = ranks.find(piece.substr(left, end - left));
    if (r != kNoRank) heap.push({r, left, end});
  };
  for (size_t i = 0; i + 1 < n; ++i) propose(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    if (!alive[e.start] || next[e.start] == kNone || end_of(next[e.start]) != e.end) continue;
    const size_t right = next[e.start];
    alive[right] = 0;
    next[e.start] = next[right];
    if (next[right] != kNone) prev[next[right]] = e.start;
    propose(e.start);
    propose(prev[e.start]);
  }
  for (size_t i = 0; i != kNone; i = next[i]) {
    const uint32_t r = ranks.find(piece.substr(i, end_of(i) - i));
    KTIER_CHECK(r != kNoRank);
    out.push_back(r);
  }
}

void bpe_encode(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out) {
  if (piece.empty()) return;
  if (const uint32_t r = ranks.find(piece); r != kNoRank) {
    out.push_back(r);
    return;
  }
  if (piece.size() >= kBpeHeapThreshold) {
    bpe_merge_heap(ranks, piece, out);
  } else {
    bpe_merge_linear(ranks, piece, out);
  }
}

}  // namespace ktier::tok
