#pragma once
// Output of `ktier trace replay`: the table, the CSV, the JSON and the PNG plot
// (docs/STRATA.md §6 lists every column and key).

#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"
#include "strata/replay.h"
#include "strata/trace_summary.h"

namespace ktier::strata {

// The policy x budget table: slots, hits, hit rate (and per-tier hit rates by bytes when there
// is more than one memory tier), bytes read from the backing store, prefetch columns when used.
std::string format_replay_table(const std::vector<ReplayResult>& results, bool with_prefetch);

// One row per (policy, budget); columns in docs/STRATA.md §6.2. All results must share the tier
// layout (same tier names in the same order). Both writers go through io::write_output_file (a
// path that is our own stdout is appended to, not truncated).
Status write_replay_csv(const std::filesystem::path& path,
                        const std::vector<ReplayResult>& results);

// {"trace": ..., "summary": {...}, "results": [{"policy", "budget", "hits", "requests",
//  "hit_rate", "bytes_read", "tiers": [{"name", "capacity_bytes", "slots", "hits", "requests",
//  "hit_rate_bytes"}], "links": [...], "prefetch": {...}}]}
Status write_replay_json(const std::filesystem::path& path, const std::string& trace_name,
                         const TraceSummary& summary, const ReplayParams& params,
                         const std::vector<ReplayResult>& results);

// Draws `png` (the --plot path) from `results` with tools/plot_replay.py under /usr/bin/python3
// (matplotlib, Agg). The script reads a CSV and writes the image in private files without names
// (unlinked at creation, opened through /dev/fd: nothing is left behind even if ktier is killed),
// and the image is written to `png` by io::write_output_file, so no file beside `png` is touched
// and errors name `png` in one line. A missing interpreter, script or matplotlib
// is Status::runtime (exit 1) saying what to install. `ceiling_rate` (0..1) is drawn as the
// compulsory-miss ceiling; pass a negative value to omit.
Status plot_replay(const std::vector<ReplayResult>& results, const std::filesystem::path& png,
                   const std::string& title, double ceiling_rate);

// Where tools/plot_replay.py is looked for: the source tree this binary was built from, then
// tools/ next to or above the executable. Empty if not found.
std::filesystem::path find_plot_script();

}  // namespace ktier::strata
