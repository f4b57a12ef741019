#include "io/fault_plan.h"

#include <algorithm>

#include "common/check.h"

namespace ktier::io {

size_t FaultPlan::add(FaultRule rule) {
  KTIER_CHECK(rule.every_nth >= 1);
  KTIER_CHECK(rule.begin < rule.end);
  KTIER_CHECK(rule.kind != FaultKind::kCorrupt || rule.corrupt_xor != 0);
  std::lock_guard lock(mu_);
  entries_.push_back(Entry{std::move(rule)});
  return entries_.size() - 1;
}

void FaultPlan::clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
}

uint64_t FaultPlan::fires(size_t index) const {
  std::lock_guard lock(mu_);
  KTIER_CHECK(index < entries_.size());
  return entries_[index].fires;
}

uint64_t FaultPlan::total_fires() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const Entry& e : entries_) n += e.fires;
  return n;
}

bool FaultPlan::matches(const FaultRule& r, const std::string& path, uint64_t offset,
                        uint64_t length) {
  if (!r.path_contains.empty() && path.find(r.path_contains) == std::string::npos) return false;
  const uint64_t end = offset + std::max<uint64_t>(length, 1);
  return offset < r.end && r.begin < end;
}

bool FaultPlan::count_and_fire(Entry& e) {
  if (e.rule.max_fires >= 0 && e.fires >= static_cast<uint64_t>(e.rule.max_fires)) return false;
  ++e.matches;
  if (e.matches % e.rule.every_nth != 0) return false;
  ++e.fires;
  return true;
}

AttemptFaults FaultPlan::on_attempt(const std::string& path, uint64_t offset, uint64_t length) {
  AttemptFaults out;
  std::lock_guard lock(mu_);
  for (Entry& e : entries_) {
    if (e.rule.kind == FaultKind::kCorrupt) continue;
    if (!matches(e.rule, path, offset, length) || !count_and_fire(e)) continue;
    switch (e.rule.kind) {
      case FaultKind::kEio: out.eio = true; break;
      case FaultKind::kShortRead: out.short_read = true; break;
      case FaultKind::kDelay: out.delay += e.rule.delay; break;
      case FaultKind::kCorrupt: break;
    }
  }
  return out;
}

void FaultPlan::on_chunk_done(const std::string& path, uint64_t offset, uint64_t length,
                              std::vector<CorruptSpan>& out) {
  std::lock_guard lock(mu_);
  for (Entry& e : entries_) {
    if (e.rule.kind != FaultKind::kCorrupt || length == 0) continue;
    if (!matches(e.rule, path, offset, length) || !count_and_fire(e)) continue;
    out.push_back(CorruptSpan{std::max(offset, e.rule.begin), std::min(offset + length, e.rule.end),
                              e.rule.corrupt_xor});
  }
}

}  // namespace ktier::io
