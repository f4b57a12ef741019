#pragma once
// The strata flags that `run` and `eval` share (docs/STRATA.md §6, docs/TUNING.md):
//   --policy temperature|lru|lfu|static   placement of the expert RAM tier (memory dial)
//   --lookahead D                         router lookahead depth, 0 = off (default: 1, or 0
//                                         where the memory budget or --vram has no room for it)
//   --no-lookahead-refresh                no second prediction of layer l+1 after layer l's FFN
//   --profile TRACE                       a recorded trace seeding the policy (temperatures;
//                                         the ranking of `static`)

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "runtime/engine.h"

namespace ktier::cli {

struct StrataArgs {
  std::string policy = "temperature", profile;
  std::optional<int> lookahead;  // nullopt: automatic (runtime::choose_lookahead)
  bool no_refresh = false;
};
void add_strata_options(CLI::App* sub, StrataArgs& a);
// Fills the engine options; reads the profile. Status::usage for an unknown policy or a profile
// recorded from a model of another shape; the trace reader's errors for the file (exit 1/3).
Status apply_strata_options(const StrataArgs& a, runtime::EngineOptions& eo);

}  // namespace ktier::cli
