// The memory plan's arithmetic that needs no checkpoint (runtime/engine_plan.h).
#include "runtime/engine_plan.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace ktier::runtime {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20, kGiB = uint64_t{1} << 30;

// --preset auto's budget never shrinks as free memory grows (it fell from 1 GiB to 1 MiB as
// MemAvailable passed 2 GiB, so a machine with more free memory refused a run one with less
// made), and keeps its bounds: 55 % of MemTotal, 90 % of MemAvailable, and 2 GiB (half, below
// 4 GiB) left to the system.
TEST(AutoPresetBudget, NeverSmallerForMoreFreeMemory) {
  for (const uint64_t total : {6 * kGiB, 64 * kGiB}) {
    SCOPED_TRACE(total / kGiB);
    uint64_t before = 0;
    for (uint64_t avail = 16 * kMiB; avail <= total; avail += 16 * kMiB) {
      SCOPED_TRACE(avail / kMiB);
      const uint64_t budget = auto_preset_budget(total, avail);
      EXPECT_GE(budget, before);
      EXPECT_LE(budget, total / 100 * 55);
      EXPECT_LE(budget, avail / 10 * 9);
      EXPECT_LE(budget, avail > 4 * kGiB ? avail - 2 * kGiB : avail / 2);
      before = budget;
    }
  }
  EXPECT_EQ(auto_preset_budget(64 * kGiB, 2048 * kMiB), 1024 * kMiB);
  EXPECT_EQ(auto_preset_budget(64 * kGiB, 2050 * kMiB), 1025 * kMiB);
  EXPECT_EQ(auto_preset_budget(64 * kGiB, 10 * kGiB), 8 * kGiB);
  EXPECT_EQ(auto_preset_budget(64 * kGiB, 30 * kGiB), 27 * kGiB);  // 90 % of MemAvailable binds
  EXPECT_EQ(auto_preset_budget(100 * kGiB, 80 * kGiB), 55 * kGiB);  // 55 % of MemTotal binds
}

}  // namespace
}  // namespace ktier::runtime
