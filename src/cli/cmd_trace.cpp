// Placeholder: replaced by the real 'trace' subcommand (strata, issue 5).
#include "cli/commands.h"

namespace ktier::cli {

void register_trace_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("trace", "(not implemented yet)");
  sub->callback([&exit_code] { exit_code = finish(Status::runtime("trace is not implemented yet")); });
}

}  // namespace ktier::cli
