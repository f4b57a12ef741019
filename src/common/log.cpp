#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace ktier {

Status set_log_level(const std::string& level) {
  static const bool installed = [] {
    auto logger = spdlog::stderr_color_mt("ktier");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)installed;
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    return Status::usage("--log-level: unknown level '" + level +
                         "' (use trace, debug, info, warn, error or off)");
  spdlog::set_level(lvl);
  return Status::ok();
}

}  // namespace ktier
