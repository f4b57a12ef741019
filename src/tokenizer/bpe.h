#pragma once
// Byte-pair encoding over a tiktoken rank table (K3-MODEL §8.4 step 3).
//
// RankTable maps byte strings to ranks (rank = token id) with an open-addressing hash over one
// byte arena. bpe_encode() applies tiktoken's rule to one piece:
//   * the whole piece is a vocabulary entry -> its rank;
//   * otherwise start from single bytes and repeatedly merge the adjacent pair whose
//     concatenation has the lowest rank, the leftmost such pair on ties, until no adjacent
//     concatenation is in the table.
// Short pieces use tiktoken's linear rescan; long pieces (long whitespace or digit-free runs)
// use a lazy-deletion min-heap keyed by (rank, start offset), which makes the same choices in
// O(n log n) instead of O(n^2). Both are exposed so the tests can check them against each other.
// Precondition for bpe_encode: every single byte has a rank (the loader validates this), so
// encoding cannot fail.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ktier::tok {

inline constexpr uint32_t kNoRank = 0xFFFFFFFFu;

class RankTable {
 public:
  RankTable() = default;
  // Takes tokens indexed by rank. Duplicate byte strings keep the first rank; the caller
  // rejects them through first_duplicate().
  explicit RankTable(const std::vector<std::string>& tokens_by_rank);

  // (first rank, later rank) of the first duplicated byte string, if any.
  std::optional<std::pair<uint32_t, uint32_t>> first_duplicate() const { return duplicate_; }

  uint32_t find(std::string_view bytes) const;  // kNoRank if absent
  std::string_view bytes(uint32_t rank) const {
    return std::string_view(arena_).substr(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
  }
  uint32_t size() const { return static_cast<uint32_t>(offsets_.size()) - 1; }

 private:
  std::string arena_;
  std::vector<uint32_t> offsets_{0};  // size() + 1 entries
  // Open addressing with linear probing, load factor <= 0.5. A slot holds rank + 1 (0 = empty)
  // and the upper 32 bits of the key's hash, so most mismatches cost no byte comparison.
  struct Slot {
    uint32_t rank_plus_1 = 0;
    uint32_t tag = 0;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  std::optional<std::pair<uint32_t, uint32_t>> duplicate_;
};

// Pieces at least this long (bytes) use the heap merge.
inline constexpr size_t kBpeHeapThreshold = 128;

// Appends the ranks of one piece to `out`.
void bpe_encode(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);

// The two merge strategies without the whole-piece shortcut; for tests and benchmarks.
void bpe_merge_linear(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);
void bpe_merge_heap(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);

}  // namespace ktier::tok
