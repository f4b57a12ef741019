// `ktier pack -m DIR -o PACKDIR [--compress [--block-size SIZE]] [--force] [-q]`: writes the
// trunk pack of the checkpoint in DIR (every non-expert tensor, one 4096-aligned record per layer,
// plus manifest.json; with --compress the layer records are stored as independently compressed
// blocks, manifest version 2; see src/pack/pack_writer.h and docs/FORMAT.md). The summary goes to
// stdout, progress to stderr.
// Exit codes: 0 ok, 1 I/O failure, 2 bad flags or config, or PACKDIR already holding a pack
// without --force, 3 a corrupt checkpoint.
#include <algorithm>
#include <cstdio>
#include <thread>
#include <memory>
#include <string>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "common/size.h"
#include "format/checkpoint.h"
#include "pack/block_codec.h"
#include "pack/pack_writer.h"
#include "runtime/engine.h"

namespace ktier::cli {
namespace {

struct PackArgs {
  std::string model_dir;
  std::string out_dir;
  bool force = false;
  bool quiet = false;
  bool compress = false;
  std::string block_size;  // SIZE (K/M/G suffixes); only with --compress
  int threads = 0;         // 0: one per hardware thread
};

Status run_pack_command(const PackArgs& a) {
  pack::PackOptions o;
  if (!a.block_size.empty() && !a.compress) return Status::usage("--block-size needs --compress");
  if (a.compress) {
    o.block_size = pack::kDefaultBlockSize;
    if (!a.block_size.empty()) {
      KTIER_ASSIGN_OR_RETURN(o.block_size, parse_size(a.block_size, "--block-size"));
      // 0 would mean "no compression" to the writer: with --compress it is a mistake.
      if (o.block_size == 0) return Status::usage("--block-size 0: a compressed pack needs blocks");
      KTIER_RETURN_IF_ERROR(pack::check_block_size(o.block_size));
    }
  }
  o.threads = runtime::resolve_threads(a.threads);
  // Refuse an existing pack before the (possibly long) checkpoint validation.
  KTIER_RETURN_IF_ERROR(pack::check_pack_output(a.out_dir, a.force));
  // Positioned reads: the copy is sequential and large, and needs no mapping of the shards.
  auto ckpt = format::Checkpoint::open(a.model_dir, format::OpenMode::kPread);
  if (!ckpt.is_ok()) return ckpt.status();
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
  auto* compress = sub->add_flag("--compress", args->compress,
                "store layer records as zstd blocks, bf16 split into high/low byte planes (lossless; "
                "manifest version 2)");
  sub->add_option("--block-size", args->block_size,
                  "inflated bytes per compressed block, a multiple of 4K (default 4M; K/M/G "
                  "suffixes); memory about 3 x this per compressing thread");
  // A plain pack is one sequential copy: threads would be ignored, so they are refused.
  add_threads_option(sub, args->threads, "Compressing threads (with --compress)")->needs(compress);
  sub->callback([args, &exit_code] { exit_code = finish(run_pack_command(*args)); });
}

}  // namespace ktier::cli
