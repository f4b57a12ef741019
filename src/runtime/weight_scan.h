#pragma once
// Where non-finite logits came from: the checkpoint's weights are scanned only on that error
// path (no sound checkpoint holds a NaN, and reading K3's whole trunk at every start would cost
// what a run's load costs again), so that the error names the tensor and its shard as well as
// the position.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "common/status.h"
#include "format/checkpoint.h"

namespace ktier::runtime {

// The first NaN or infinite element of a float tensor the model reads — the embedding, every
// layer's trunk tensors in layer order, the head — as "TENSOR in SHARD: element I is NaN" (or
// "infinite"); nullopt when all are finite (then activations overflowed, or a pack's bytes
// differ from the shards'). Routed experts are not scanned: MXFP4 codes hold no NaN (a scale
// byte 0xFF is a zero block, NUMERICS.md). Reads each tensor in pieces from its shard.
// Errors: the shard's read errors (Status::runtime); Status::interrupted when Ctrl-C (or
// serve's SIGTERM) arrives while a live InterruptRequest catches it (K3's trunk takes up to a
// minute to read).
// `part` limits the scan to one layer's tensors (0..L-1) or to the head's (kHeadPart: lm_head,
// the final norm, the output AttnRes pair); kAllParts scans everything.
inline constexpr int64_t kAllParts = -1, kHeadPart = -2;
Result<std::optional<std::string>> find_nonfinite_weight(const format::Checkpoint& ckpt,
                                                         int64_t part = kAllParts);

// Where a pass whose stream turned non-finite after MoE layer `layer` may have overflowed, when
// every trunk weight is finite: the experts it routed to (`experts`, repeats allowed). Their
// MXFP4 scale tensors are read (on K3 1 MB per expert) and the first scale byte (w2's first,
// whose products reach the stream unbounded, then w1's, w3's; each in expert id order) that is
// 253 or 254 (a block whose values pass 32-bit floats' range) or 64 or more above the median of
// all their blocks' bytes (2^64 times the typical block: a top bit set by damage; a trained
// model's blocks span far less) is named as "TENSOR in SHARD: block B's scale is 2^X (byte S),
// ...". nullopt where none is, or where the checkpoint's experts are not MXFP4. Errors: the
// shards' read errors (Status::runtime).
Result<std::optional<std::string>> find_damaged_expert_scale(const format::Checkpoint& ckpt,
                                                             int64_t layer,
                                                             std::span<const int32_t> experts);

// The same for plain-float experts (small test models; K3's are MXFP4): the first NaN or
// infinity in the tensors of the experts layer `layer` routed to, w2's first, as
// find_nonfinite_weight names it. nullopt where they are finite, or not plain floats.
Result<std::optional<std::string>> find_nonfinite_expert(const format::Checkpoint& ckpt,
                                                         int64_t layer,
                                                         std::span<const int32_t> experts);

// Whether `s` is check_logits' error (runtime/generator.h): logits that are not finite; or
// model::check_router_scores' (a router's scores).
bool is_nonfinite_logits(const Status& s);

}  // namespace ktier::runtime
