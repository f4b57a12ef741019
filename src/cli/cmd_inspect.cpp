// Placeholder: replaced by the real 'inspect' subcommand in this same change set.
#include "cli/commands.h"

namespace ktier::cli {

void register_inspect_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("inspect", "(not implemented yet)");
  sub->callback([&exit_code] { exit_code = finish(Status::runtime("inspect is not implemented yet")); });
}

}  // namespace ktier::cli
