#pragma once
// Sizes on the command line: one grammar for every flag that takes one (--ram, --vram,
// --block-size, bench --bytes, trace replay's budget lists).
//
//   "4096", "8e9", "1.5G"   a number (decimals and exponents allowed), then an optional unit:
//   K, M, G, T              powers of 1024 ("8G" = 8 GiB, as --ram has always read it)
//   KiB, MiB, GiB, TiB      powers of 1024
//   KB, MB, GB, TB          powers of 1000 ("8GB" = 8e9 bytes, the conformance README's budgets)
//   B                       bytes
// Units are case-insensitive; spaces are not allowed. The result is floor(number * unit).

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ktier {

// Largest size accepted: 2^60 bytes (1 EiB); anything larger is a typo, not a machine, and
// would overflow slot arithmetic.
inline constexpr uint64_t kMaxSizeBytes = uint64_t{1} << 60;

// Status::usage "FLAG: 'TEXT' is not a size (e.g. ...)" for anything else, negative, NaN or
// above kMaxSizeBytes (without "FLAG: " when `flag` is empty).
Result<uint64_t> parse_size(std::string_view text, std::string_view flag = {});

// `bytes` for people, in the units parse_size reads as powers of 1024, with two decimals in the
// largest unit that keeps the number at 1.00 or more: "812 B", "3.50 KiB", "117.19 MiB",
// "1.50 GiB".
std::string format_size(uint64_t bytes);

}  // namespace ktier
