// The progress meter of long writes and loads (common/progress.h), stderr captured: disabled
// meters print nothing, finish() always ends with the totals, and finish_if_shown() stays quiet
// for work that ended before the first progress line (every test's short loads).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/progress.h"

namespace ktier {
namespace {

std::string run(bool enabled, bool only_if_shown,
                std::chrono::milliseconds log_interval = std::chrono::seconds(10)) {
  testing::internal::CaptureStderr();
  ProgressMeter meter("loading trunk", 3'000'000, enabled, log_interval);
  meter.update(1'000'000);
  meter.update(3'000'000);
  if (only_if_shown)
    meter.finish_if_shown(3'000'000);
  else
    meter.finish(3'000'000);
  return testing::internal::GetCapturedStderr();
}

TEST(ProgressMeter, FinishEndsWithTheTotals) {
  const std::string out = run(true, false);
  EXPECT_NE(out.find("loading trunk: 3.0 MB / 3.0 MB (100%)"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressMeter, QuietWhenDisabledOrOverBeforeTheFirstLine) {
  EXPECT_EQ(run(false, false), "");
  EXPECT_EQ(run(false, true), "");
  EXPECT_EQ(run(true, true), "");  // stderr is not a terminal here: the first line is due at 10 s
}

// Work that lasts past the first line (here: a zero interval) prints its lines, one per
// update, and the final one.
TEST(ProgressMeter, LongWorkShowsProgressThenTheFinalLine) {
  const std::string out = run(true, true, std::chrono::milliseconds(0));
  EXPECT_NE(out.find("loading trunk: 1.0 MB / 3.0 MB (33%)"), std::string::npos) << out;
  EXPECT_NE(out.find("loading trunk: 3.0 MB / 3.0 MB (100%)"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;
}

}  // namespace
}  // namespace ktier
