// Budget parsing and number formatting for the replay CLI.
#include "strata/budget.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/size.h"

namespace ktier::strata {

Result<Budget> parse_budget(std::string_view item, uint64_t expert_bytes, std::string_view option) {
  auto bad = [&](const std::string& why) {
    return Status::usage(std::string(option) + ": '" + std::string(item) + "' " + why +
                         " (examples: 8GB, 16GiB, 16G, 8e9, 455x = 455 experts)");
  };
  std::string s;
  for (char c : item) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  if (s.empty()) return bad("is empty");
  if (expert_bytes == 0) return bad("needs the expert size (--expert-bytes)");
  Budget b;
  b.label = s;
  if (s.back() == 'x' || s.back() == 'X') {  // a number of experts
    double value = 0;
    const char* last = s.data() + s.size() - 1;
    const auto [p, ec] = std::from_chars(s.data(), last, value);
    if (ec != std::errc() || p != last || !(value >= 0) || value != std::floor(value) ||
        value * static_cast<double>(expert_bytes) > static_cast<double>(kMaxSizeBytes)) {
      return bad("is not a whole number of experts in range");
    }
    b.slots = static_cast<uint64_t>(value);
    b.bytes = b.slots * expert_bytes;
    return b;
  }
  const Result<uint64_t> bytes = parse_size(s, option);
  if (!bytes.is_ok()) return Status::usage(bytes.status().message() + "; or 455x = 455 experts");
  b.bytes = *bytes;
  b.slots = b.bytes / expert_bytes;
  return b;
}

Result<std::vector<Budget>> parse_slot_list(std::string_view list, uint64_t expert_bytes,
                                            std::string_view option) {
  std::vector<Budget> out;
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, comma - start);
    start = comma + 1;
    auto bad = [&](const std::string& why) {
      return Status::usage(std::string(option) + ": '" + std::string(item) + "' " + why +
                           " (e.g. " + std::string(option) + " 455,911)");
    };
    std::string_view digits = item;  // spaces around it allowed, as in --ram lists
    while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.front())))
      digits.remove_prefix(1);
    while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.back())))
      digits.remove_suffix(1);
    if (!digits.empty() && (digits.back() == 'x' || digits.back() == 'X'))
      digits.remove_suffix(1);
    uint64_t n = 0;
    const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec == std::errc::result_out_of_range) return bad("is too many experts");
    if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size())
      return bad("is not a whole number of experts");
    if (expert_bytes == 0) return bad("needs the expert size (--expert-bytes)");
    if (n > kMaxSizeBytes / expert_bytes)
      return bad("is more experts than " + format_bytes(kMaxSizeBytes) + " hold");
    out.push_back({std::to_string(n) + "x", n * expert_bytes, n});
  }
  return out;
}

Result<std::vector<Budget>> parse_budget_list(std::string_view list, uint64_t expert_bytes,
                                              std::string_view option) {
  std::vector<Budget> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    KTIER_ASSIGN_OR_RETURN(Budget b,
                           parse_budget(list.substr(start, comma - start), expert_bytes, option));
    out.push_back(std::move(b));
    start = comma + 1;
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  static const char* kNames[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof(buf),
                  v >= 100  ? "%.0f %s"
                  : v >= 10 ? "%.1f %s"
                            : "%.2f %s",
                  v, kNames[u]);
  return buf;
}

std::string format_count(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace ktier::strata
