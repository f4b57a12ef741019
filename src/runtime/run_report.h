#pragma once
// The run report (issue 4 item 4): what a generation cost, as a table on stderr and as JSON
// (`ktier run --report-json FILE`).
//
// Per-token figures are decode-phase figures: counter deltas between the start of decode and the
// end, divided by the decode steps. "Read" means bytes ktier's I/O layer read from storage (the
// trunk ring, the expert tier's misses); a run without the memory dial maps the checkpoint and
// reports 0 read bytes (the page cache serves it).

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "runtime/generator.h"

namespace ktier::runtime {

// Counters of an engine at one moment.
struct EngineCounters {
  uint64_t trunk_bytes_read = 0, trunk_wait_ns = 0;
  ExpertCacheStats experts;  // zero without the memory dial
  VramTierStats vram;        // zero outside GPU mode
  uint64_t device_trunk_streamed = 0;  // GPU mode: trunk bytes copied to the device per layer
  uint64_t io_wait_ns = 0, io_bytes = 0, io_busy_ns = 0;
  uint64_t io_reads = 0, io_fixed_reads = 0;  // reads issued; of them into registered buffers
  uint64_t trunk_inflate_ns = 0;  // compressed packs: time spent inflating streamed blocks
  static EngineCounters of(const Engine& e);
  // A report window's start: begins the window in `e` (Engine::begin_report_window: prefetch
  // precision then counts only the prefetches issued inside it) and returns its counters.
  static EngineCounters start_window(Engine& e);
};

struct RunReport {
  GenerationStats gen;
  int64_t cached_prompt_tokens = 0;  // prompt tokens restored from --prompt-cache, not run
  bool stopped_at_stop_text = false;  // `serve`: a request's stop text ended it (not Ctrl-C)
  // The generation's limit was the context's end (-n -1, or a `serve` request's limit cut to
  // the positions -c leaves), not a token count asked for.
  bool limit_is_context_end = false;
  EngineCounters decode_start, decode_end;
  uint64_t peak_rss_bytes = 0;

  nlohmann::json to_json(const Engine& e) const;
  std::string to_table(const Engine& e) const;  // several lines, for stderr
};

}  // namespace ktier::runtime
