#pragma once
// `ktier synth`: writes a synthetic checkpoint in exactly the released layout (K3-MODEL.md §2-§8)
// at any scale: config.json, generation_config.json, one shard per decoder layer plus one for the
// model-level tensors, model.safetensors.index.json, tiktoken.model and tokenizer_config.json.
// What goes into the files is described in shape.h (presets), plan.h (tensors, order, values),
// values.h (MXFP4), tokenizer_gen.h (ids) and config_gen.h (config).
//
// Guarantees:
//  * Deterministic: the same options and seed give byte-identical files, whatever the thread
//    count (every value is a pure function of seed, tensor name and element index; rng.h).
//  * Interrupt-safe: every file is written under a temporary name and renamed when complete;
//    config.json and then model.safetensors.index.json are renamed last, so a directory without
//    the index is never a finished checkpoint. With `force`, the index and config of an earlier
//    checkpoint in `out_dir` are removed first, then its other known files (shards, partial
//    files, tokenizer files); unrelated files are left alone.
//  * Bounded memory: bytes are generated in units of at most 8 MiB, or one whole MXFP4 expert
//    matrix with its scales (5.8 MB at K3 widths), by `threads` workers into a ring of
//    2·threads + 2 slots, and written in file order by the calling thread (~55 MB peak RSS for
//    every preset). The routing measurement afterwards maps the checkpoint and runs a 64-token
//    forward pass, which touches (page cache, not private memory) the trunk and the experts used.
//  * Errors: a non-empty `out_dir` without `force`, an unknown preset or an invalid shape →
//    Status::usage (exit 2); any I/O failure → Status::runtime (exit 1) naming the file.
//    Never throws.

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>

#include "common/status.h"
#include "synth/routing_stats.h"
#include "synth/shape.h"

namespace ktier::synth {

struct SynthOptions {
  std::string preset = "tiny";
  std::filesystem::path out_dir;
  uint64_t seed = 0;
  ExpertFormat experts = ExpertFormat::kMxfp4;
  bool force = false;
  ShapeOverrides overrides;
  int threads = 0;        // generator threads; 0 = hardware concurrency
  bool progress = false;  // progress meter on stderr
  // Headers and metadata files only: each shard's data section is left as a hole (zeros, no
  // disk space where the file system keeps holes) and no routing is measured. The layout and
  // sizes are the real ones, for `ktier plan`, `inspect` and the readers; what it decodes to
  // means nothing (every weight is 0).
  bool shapes_only = false;
};

struct SynthReport {
  SynthShape shape;
  ExpertFormat experts = ExpertFormat::kMxfp4;
  uint64_t seed = 0;
  std::filesystem::path out_dir;
  int64_t shards = 0;
  int64_t tensors = 0, trunk_tensors = 0, model_tensors = 0, expert_tensors = 0;
  uint64_t trunk_bytes = 0, model_bytes = 0, expert_bytes = 0;  // tensor data
  uint64_t disk_bytes = 0;  // every file written, headers and metadata files included
  double seconds = 0.0;     // wall time of the whole run
  int64_t ranks = 0, merges_learned = 0, added_begin = 0;
  double trunk_high_byte_entropy = 0.0;  // BF16 high byte over the layers' non-expert tensors
  double model_high_byte_entropy = 0.0;  // ... over embedding, lm_head and the model-level norms
  std::array<uint64_t, 256> scale_bytes{};  // MXFP4 E8M0 scale histogram
  RoutingStats routing;  // measured with the forward pass after the files are written
  bool shapes_only = false;  // SynthOptions::shapes_only: no data, no routing measured
};

Result<SynthReport> run_synth(const SynthOptions& options);

// Multi-line human summary (what `ktier synth` prints to stdout).
std::string format_report(const SynthReport& report);

}  // namespace ktier::synth
