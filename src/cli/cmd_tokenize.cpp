// Placeholder: replaced by the real 'tokenize' subcommand in this same change set.
#include "cli/commands.h"

namespace ktier::cli {

void register_tokenize_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("tokenize", "(not implemented yet)");
  sub->callback([&exit_code] { exit_code = finish(Status::runtime("tokenize is not implemented yet")); });
}

}  // namespace ktier::cli
