#include "common/size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>

namespace ktier {
namespace {

struct Unit {
  std::string_view name;  // lower case
  double factor;
};
constexpr Unit kUnits[] = {
    {"", 1},           {"b", 1},
    {"k", 0x1p10},     {"m", 0x1p20},     {"g", 0x1p30},     {"t", 0x1p40},
    {"kib", 0x1p10},   {"mib", 0x1p20},   {"gib", 0x1p30},   {"tib", 0x1p40},
    {"kb", 1e3},       {"mb", 1e6},       {"gb", 1e9},       {"tb", 1e12},
};

}  // namespace

Result<uint64_t> parse_size(std::string_view text, std::string_view flag) {
  const auto bad = [&](const char* why) {
    return Status::usage((flag.empty() ? std::string() : std::string(flag) + ": ") + "'" +
                         std::string(text) + "' " + why +
                         " (e.g. 512M, 8G = 8 GiB, 16GiB, 8GB = 8e9 bytes, 1073741824)");
  };
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || text.empty()) return bad("is not a size");
  std::string unit(p, end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (!(value >= 0) || !std::isfinite(value)) return bad("is not a size");
    const double bytes = value * u.factor;
    if (bytes > static_cast<double>(kMaxSizeBytes)) return bad("is larger than 1 EiB");
    return static_cast<uint64_t>(std::floor(bytes));
  }
  return bad("has an unknown unit");
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kNames[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  // 1023.996 KiB would print as "1024.00 KiB": it is 1.00 MiB.
  while (v >= 1023.995 && u + 1 < std::size(kNames)) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kNames[u]);
  return buf;
}

}  // namespace ktier
