#pragma once
// Logging goes through spdlog (stderr). Include <spdlog/spdlog.h> in .cpp files that log;
// this header only sets the level from --log-level.

#include <string>

#include "common/status.h"

namespace ktier {

// Accepts trace, debug, info, warn, error, off. Usage error on anything else.
Status set_log_level(const std::string& level);

}  // namespace ktier
