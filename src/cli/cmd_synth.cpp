// `ktier synth`: writes a synthetic checkpoint in the released K3 layout (src/synth/synth.h).
//
//   ktier synth --preset tiny|demo|k3-slice -o DIR [--seed N] [--float-experts
//               [--expert-dtype f32|bf16]] [--shapes-only] [--force] [shape flags...]
//
// Shape flags override the preset (see src/synth/shape.h); --mla-layers takes 0-based layer
// indices and becomes the 1-based full_attn_layers of config.json. Shapes are bounded so that
// ktier loads what synth writes and memory holds the plan (shape.h: L <= 4096, top-k <= 64, at
// most 2^21 expert tensors), and refused before anything is written when their tensors alone
// exceed the output file system's free space (with --shapes-only: refused after the first shard
// when the file system does not keep its hole). The summary goes to stdout, progress to stderr.
// Exit codes: 0 ok, 1 I/O failure or too little disk space, 2 bad flags or a non-empty DIR
// without --force (with it, one holding checkpoint files synth did not write: its .ktier-synth
// marker is missing).

#include <cstdio>
#include <memory>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "synth/synth.h"

namespace ktier::cli {
namespace {

struct SynthArgs {
  synth::SynthOptions options;
  std::string out_dir;
  bool float_experts = false;
  std::string expert_dtype = "f32";
  bool quiet = false;
  // Shape flags: CLI11 2.1 has no std::optional options, so each value is paired with its
  // Option* and copied into the overrides only when given.
  struct IntFlag {
    const char* name;
    const char* help;
    std::optional<int64_t> synth::ShapeOverrides::*field;
    int64_t value = 0;
    CLI::Option* option = nullptr;
  };
  std::vector<IntFlag> int_flags;
  std::vector<int64_t> mla_layers;
  CLI::Option* mla_option = nullptr;
  CLI::Option* dtype_option = nullptr;
};

Status run_synth_command(SynthArgs& a) {
  synth::SynthOptions o = a.options;
  o.out_dir = a.out_dir;
  for (auto& f : a.int_flags)
    if (f.option->count() > 0) o.overrides.*(f.field) = f.value;
  if (a.mla_option->count() > 0) o.overrides.mla_layers = a.mla_layers;
  if (a.dtype_option->count() > 0 && !a.float_experts)
    return Status::usage("--expert-dtype needs --float-experts (MXFP4 experts have no float dtype)");
  if (a.float_experts)
    o.experts = a.expert_dtype == "bf16" ? synth::ExpertFormat::kBF16 : synth::ExpertFormat::kF32;
  o.progress = !a.quiet;
  auto report = synth::run_synth(o);
  if (!report.is_ok()) return report.status();
  const std::string text = synth::format_report(*report);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace

void register_synth_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "synth", "Write a synthetic Kimi K3-family checkpoint in the released layout (config, shards, "
               "index, tokenizer)");
  // Owned by the callback below, which lives as long as the app.
  auto args = std::make_shared<SynthArgs>();
  sub->add_option("--preset", args->options.preset,
                  "tiny (~4 MB), demo (~2.8 GB) or k3-slice (~12 GB)")
      ->required()
      ->check(CLI::IsMember({"tiny", "demo", "k3-slice"}));
  sub->add_option("-o,--output", args->out_dir, "output directory (created; must be empty unless --force)")
      ->required();
  add_seed_option(sub, args->options.seed, "random seed; same seed, same bytes");
  sub->add_flag("--shapes-only", args->options.shapes_only,
                "write the headers and metadata files only: every shard has its real size but its "
                "data are a hole (zeros taking no disk space; refused on a file system without "
                "sparse files), for `ktier plan` and `inspect` at full scale (e.g. --preset "
                "k3-slice --layers 93 --experts 896 is K3's layout); the index says so, and "
                "every command that opens it warns that what it decodes means nothing");
  sub->add_flag("--float-experts", args->float_experts,
                "store routed experts as plain float `.weight` tensors (the MXFP4 round trip of the "
                "same values) instead of MXFP4");
  args->dtype_option = sub->add_option("--expert-dtype", args->expert_dtype, "f32 or bf16 (with --float-experts)")
                           ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_flag("--force", args->options.force,
                "overwrite the checkpoint an earlier synth wrote in the output directory (one "
                "whose checkpoint files have no .ktier-synth marker beside them is refused)");
  add_threads_option(sub, args->options.threads, "Generator threads (at most 64 are used)");
  sub->add_flag("-q,--quiet", args->quiet, "no progress meter");

  using O = synth::ShapeOverrides;
  args->int_flags = {
      {"--layers", "decoder layers L (MLA placement follows the default rule unless --mla-layers)", &O::layers},
      {"--hidden", "hidden width E", &O::hidden},
      {"--vocab", "vocabulary size V (added ids take the top of it)", &O::vocab},
      {"--kda-heads", "KDA heads", &O::kda_heads},
      {"--kda-head-dim", "KDA head dim", &O::kda_head_dim},
      {"--mla-heads", "MLA heads", &O::mla_heads},
      {"--q-lora", "MLA q_lora_rank", &O::q_lora},
      {"--kv-lora", "MLA kv_lora_rank", &O::kv_lora},
      {"--qk-nope", "MLA qk_nope_head_dim", &O::qk_nope},
      {"--qk-rope", "MLA qk_rope_head_dim", &O::qk_rope},
      {"--v-head", "MLA v_head_dim", &O::v_head},
      {"--experts", "routed experts per MoE layer", &O::experts},
      {"--top-k", "experts per token", &O::top_k},
      {"--latent", "routed expert latent width (routed_expert_hidden_size)", &O::latent},
      {"--expert-inter", "expert intermediate width (moe_intermediate_size)", &O::expert_inter},
      {"--dense-inter", "dense FFN width of layer 0 (intermediate_size)", &O::dense_inter},
      {"--shared-experts", "shared experts (fused width = expert-inter x this)", &O::shared_experts},
      {"--block-size", "AttnRes block size S", &O::block_size},
  };
  for (auto& f : args->int_flags) f.option = sub->add_option(f.name, f.value, f.help);
  // Given twice, the last list counts, as every option's last value does: each one replaces
  // the one before (CLI11 would join a list option's values).
  args->mla_option = sub->add_option("--mla-layers", args->mla_layers,
                                     "0-based MLA layers, comma separated (written 1-based)")
                         ->delimiter(',')
                         ->trigger_on_parse();

  sub->callback([args, &exit_code] { exit_code = finish(run_synth_command(*args)); });
}

}  // namespace ktier::cli
