// `ktier pack -m DIR -o PACKDIR [--force] [-q]`: writes the trunk pack of the checkpoint in DIR
// (every non-expert tensor, one 4096-aligned record per layer, plus manifest.json; see
// src/pack/pack_writer.h and docs/FORMAT.md). The summary goes to stdout, progress to stderr.
// Exit codes: 0 ok, 1 I/O failure, 2 bad flags or config, or PACKDIR already holding a pack
// without --force, 3 a corrupt checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "format/checkpoint.h"
#include "pack/pack_writer.h"

namespace ktier::cli {
namespace {

struct PackArgs {
  std::string model_dir;
  std::string out_dir;
  bool force = false;
  bool quiet = false;
};

Status run_pack_command(const PackArgs& a) {
  // Refuse an existing pack before the (possibly long) checkpoint validation.
  KTIER_RETURN_IF_ERROR(pack::check_pack_output(a.out_dir, a.force));
  // Positioned reads: the copy is sequential and large, and needs no mapping of the shards.
  auto ckpt = format::Checkpoint::open(a.model_dir, format::OpenMode::kPread);
  if (!ckpt.is_ok()) return ckpt.status();
  pack::PackOptions o;
  o.out_dir = a.out_dir;
  o.force = a.force;
  o.progress = !a.quiet;
  auto report = pack::write_trunk_pack(*ckpt, o);
  if (!report.is_ok()) return report.status();
  std::fputs(pack::format_pack_report(*report).c_str(), stdout);
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace

void register_pack_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "pack", "Write the trunk pack of a checkpoint: its non-expert tensors as one aligned record per "
              "layer, with a checksummed manifest (experts stay in the shards)");
  // Owned by the callback below, which lives as long as the app.
  auto args = std::make_shared<PackArgs>();
  sub->add_option("-m,--model", args->model_dir, "model directory (config.json + safetensors shards)")
      ->required();
  sub->add_option("-o,--output", args->out_dir, "pack directory (created; gets trunk.pack and manifest.json)")
      ->required();
  sub->add_flag("--force", args->force, "replace a pack already in the output directory");
  sub->add_flag("-q,--quiet", args->quiet, "no progress meter");
  sub->callback([args, &exit_code] { exit_code = finish(run_pack_command(*args)); });
}

}  // namespace ktier::cli
