#pragma once
// The debugging environment variables ktier itself reads (docs/TUNING.md lists them; the
// test-only emulated CUDA module reads its own). Read once, on first use, and checked by main()
// before any command runs: a bad value is a usage error (exit 2) naming the variable, never an
// abort or a value silently read as 0.

#include <cstdint>
#include <optional>

#include "common/status.h"

namespace ktier {

struct DebugEnv {
  // KTIER_DEBUG_MEM_AVAILABLE_MIB: stands in for /proc/meminfo's MemAvailable, in MiB.
  std::optional<uint64_t> mem_available_mib;
  // KTIER_DEBUG_SERVE_LOAD_DELAY_MS: serve's wait before it loads the model, in ms.
  std::optional<uint64_t> serve_load_delay_ms;
  // KTIER_DEBUG_SERVE_THROW=1: every serve answer's first text throws std::bad_alloc.
  bool serve_throw = false;
};

// The variables as read at the first call (thread-safe); Status::usage naming the variable and
// its value when one is not of its documented form. Unset or empty = not given.
const Result<DebugEnv>& debug_env();

}  // namespace ktier
