// Placeholder: replaced by the real 'synth' subcommand in this same change set.
#include "cli/commands.h"

namespace ktier::cli {

void register_synth_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("synth", "(not implemented yet)");
  sub->callback([&exit_code] { exit_code = finish(Status::runtime("synth is not implemented yet")); });
}

}  // namespace ktier::cli
