#include "common/debug_env.h"

#include <cstdlib>
#include <string>

namespace ktier {
namespace {

// A whole number in [1, limit) when `name` is set and not empty.
Status read_positive(const char* name, uint64_t limit, std::optional<uint64_t>& out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return Status::ok();
  const std::string s = text;
  const bool digits = s.find_first_not_of("0123456789") == std::string::npos && s.size() <= 19;
  const uint64_t v = digits ? std::strtoull(s.c_str(), nullptr, 10) : 0;
  if (!digits || v == 0 || v >= limit)
    return Status::usage(std::string(name) + "=\"" + s + "\": must be a whole number from 1 to " +
                         std::to_string(limit - 1) + " (docs/TUNING.md)");
  out = v;
  return Status::ok();
}

Result<DebugEnv> read_debug_env() {
  DebugEnv env;
  KTIER_RETURN_IF_ERROR(read_positive("KTIER_DEBUG_MEM_AVAILABLE_MIB", uint64_t{1} << 40,
                                      env.mem_available_mib));
  KTIER_RETURN_IF_ERROR(read_positive("KTIER_DEBUG_SERVE_LOAD_DELAY_MS", uint64_t{1} << 31,
                                      env.serve_load_delay_ms));
  if (const char* t = std::getenv("KTIER_DEBUG_SERVE_THROW"); t != nullptr && *t != '\0') {
    const std::string s = t;
    if (s != "0" && s != "1")
      return Status::usage("KTIER_DEBUG_SERVE_THROW=\"" + s +
                           "\": must be 0 or 1 (docs/TUNING.md)");
    env.serve_throw = s == "1";
  }
  return env;
}

}  // namespace

const Result<DebugEnv>& debug_env() {
  static const Result<DebugEnv> env = read_debug_env();
  return env;
}

}  // namespace ktier
