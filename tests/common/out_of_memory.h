#pragma once
// Running work out of memory at one allocation after another, as `serve` meets a
// std::bad_alloc, catches it and goes on with the same engine (tests/common/failing_new.h).

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <new>
#include <string>

#include "tests/common/failing_new.h"
#include "tests/common/fresh_seed.h"
#include "common/status.h"

namespace ktier::test {

// Runs `attempt` with one allocation of the calling thread failing: every `stride`-th from a
// fresh offset below `stride` (each run tries others), until an attempt makes fewer allocations
// than that, which must then succeed. After each failure (thrown out of `attempt`, or caught
// inside it), `after_failure(k, s)` checks what it left (gtest assertions; the first failing one
// ends the loop): `s` is what the attempt returned, or Status::out_of_memory when the
// std::bad_alloc came out of it. Returns the failures tried.
inline long fail_allocations_in_turn(
    const std::string& test, long stride, const std::function<Status()>& attempt,
    const std::function<void(long k, const Status& s)>& after_failure) {
  const long first = static_cast<long>(fresh_seed(test.c_str()) % static_cast<uint64_t>(stride));
  long failures = 0;
  for (long k = first;; k += stride) {
    if (failures == 20'000) {
      ADD_FAILURE() << "the attempt never got through";
      break;
    }
    Status s;
    bool failed = false;
    {
      // Disarmed however the attempt ends (another exception too, on its way to gtest).
      struct Armed {
        explicit Armed(long at) { fail_allocation_after(at); }
        ~Armed() { fail_allocation_after(-1); }
      } armed(k);
      try {
        s = attempt();
      } catch (const std::bad_alloc&) {
        failed = true;
        s = Status::out_of_memory("std::bad_alloc came out of the attempt");
      }
      // Thrown out, or caught inside and turned into an error (or a fallback): it came.
      failed = failed || !allocation_failure_pending();
    }
    if (!failed) {  // the attempt made fewer than k + 1 allocations
      EXPECT_TRUE(s.is_ok()) << s.message();
      break;
    }
    ++failures;
    after_failure(k, s);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) break;
  }
  std::printf("[oom] %s: %ld allocations failed in turn (stride %ld, first %ld)\n",
              test.c_str(), failures, stride, first);
  return failures;
}

}  // namespace ktier::test
