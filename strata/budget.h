#pragma once
// Tier budgets on the command line: comma lists of sizes (docs/STRATA.md §6).
//
//   "8GB,16GB"   sizes as every size flag reads them (common/size.h): KB..TB powers of 1000,
//   "8GiB", "8G"   KiB..TiB and K..T powers of 1024, a plain number bytes ("8e9", "1.5GB")
//   "455x"       a number of experts (slots); bytes = slots * expert_bytes
// Units are case-insensitive; spaces around and inside an item are ignored (unlike a single size
// flag). Slots for a byte budget = floor(bytes / expert_bytes), as in the
// conformance README §10.3 (8 GB -> 455 slots at 17,547,264 bytes per expert).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ktier::strata {

struct Budget {
  std::string label;  // the item as given, e.g. "8GB" or "455x"
  uint64_t bytes = 0;
  uint64_t slots = 0;
};

// `option` names the flag in messages ("--ram"). Usage error on anything malformed.
Result<Budget> parse_budget(std::string_view item, uint64_t expert_bytes, std::string_view option);
// `--slots 455,911`: comma-separated counts of experts (decimal, an optional trailing x), each a
// Budget labelled "455x"; a usage error quoting the item as given otherwise.
Result<std::vector<Budget>> parse_slot_list(std::string_view list, uint64_t expert_bytes,
                                            std::string_view option);
Result<std::vector<Budget>> parse_budget_list(std::string_view list, uint64_t expert_bytes,
                                              std::string_view option);

// "8 GB", "455 MB", "1.23 TB" (decimal units, 3 significant digits) for tables.
std::string format_bytes(uint64_t bytes);
// 100096 -> "100,096".
std::string format_count(uint64_t n);

}  // namespace ktier::strata
