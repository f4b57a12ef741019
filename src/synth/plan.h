#pragma once
// The tensor inventory of a synthetic checkpoint, in file order, with how each tensor's values
// are drawn (K3-MODEL.md §3-§5).
//
// Files: shard k (1-based, k = 1..L) holds decoder layer k−1; shard L+1 holds the model-level
// tensors (embedding, lm_head, final norm, output AttnRes pair). Names are
// `model-{k:05d}-of-{L+1:06d}.safetensors`, the release's spelling with its six-digit total.
//
// Order inside a shard: the layer's non-expert ("trunk") tensors sorted by (dtype size
// descending, name) — F32 before BF16, alphabetical — the order the release's writer produces;
// then the routed experts in lexicographic order of their names (0, 1, 10, 100, …, 11, …), each
// expert's tensors one contiguous run: w1.weight_packed, w1.weight_scale, w2.weight_packed,
// w2.weight_scale, w3.weight_packed, w3.weight_scale (MXFP4), or w1.weight, w2.weight,
// w3.weight (plain float).
//
// Dtypes as released: BF16 matrices and norms; F32 conv1d, A_log, dt_bias, o_norm and
// e_score_correction_bias; U8 packed experts. A_log has max(D, H_k) elements, the first H_k a
// ramp, the rest exactly 0 (decision D1).
//
// Values (all seeded, per tensor stream; rng.h):
//   matrices [out, in]    N(0, σ²), σ = gain · 2^u / sqrt(in), u ~ U(−1, 1) drawn once per
//                         matrix: a log-uniform spread of 4× around 1/sqrt(fan_in), which gives
//                         BF16 exponent bytes the spread of trained weights. gain 1, except
//                         routed experts (gain 1.7, u ~ U(−½, ½)), chosen so that at K3 widths
//                         the MXFP4 scale bytes sit at 120–122 like the release.
//   embed_tokens          like a matrix of fan-in E (σ = 2^u / sqrt(E)), lm_head's scale family.
//                         Its first use is an RMSNorm, so the absolute scale matters little, and
//                         one family keeps the high-byte entropy of embedding + head in the
//                         trained range (a unit-σ embedding next to a 1/sqrt(E) head gave 3.5 bits).
//   RMSNorm gains         1 + 0.05·N(0,1) (BF16; KDA o_norm the same in F32).
//   *_res_proj            0.02·N(0,1): small AttnRes scoring vectors, so depth mixing starts near
//                         uniform and the model is not chaotic.
//   router gate.weight    a matrix as above (logits of RMS-normalised inputs have std 0.5–2);
//   e_score_correction    0.02·N(0,1) (F32): steers selection a little without dominating it.
//   A_log                 linspace(−0.4, 1.2, H_k), then zeros.
//   dt_bias               0.1·N(0,1); conv1d weights 0.3·N(0,1).
// Routed experts draw from the stream named after the logical matrix (`…experts.{e}.w1`), so the
// MXFP4 and plain-float variants of one seed hold the same numbers: plain experts store the
// MXFP4 round trip of those values whenever the input width is a multiple of 32 (exact in F32
// and BF16), and the raw values otherwise.

#include <cstdint>
#include <string>
#include <vector>

#include "format/safetensors_writer.h"
#include "synth/shape.h"
#include "synth/values.h"

namespace ktier::synth {

enum class TensorGroup : uint8_t {
  kTrunk,   // per-layer non-expert tensors
  kModel,   // embedding, lm_head, final norm, output AttnRes pair
  kExpert,  // routed experts
};

struct PlannedTensor {
  format::TensorDecl decl;  // stored name, dtype, shape
  ValueSpec values;
  Encoding encoding = Encoding::kBF16;
  TensorGroup group = TensorGroup::kTrunk;
  // The logical [rows, cols] matrix whose values this tensor stores (value index r·cols + c).
  // For kMxfp4Packed / kMxfp4Scale this differs from decl.shape.
  int64_t rows = 0;
  int64_t cols = 0;
};

struct PlannedShard {
  std::string file_name;
  std::vector<PlannedTensor> tensors;  // file order
};

struct Plan {
  std::vector<PlannedShard> shards;  // shards[k-1] = file k
  uint64_t data_bytes() const;       // sum of all tensor bytes (the index's total_size)
};

Plan build_plan(const SynthShape& shape, ExpertFormat format, uint64_t seed);

std::string shard_file_name(int64_t k, int64_t n);  // model-{k:05d}-of-{n:06d}.safetensors

// Value spec of a named weight as build_plan draws it (for tests).
// `name` is the stored name, or for routed experts the logical `…experts.{e}.w{1,2,3}`.
ValueSpec matrix_values(uint64_t seed, const std::string& name, int64_t fan_in, double gain,
                        double log2_spread);

}  // namespace ktier::synth
