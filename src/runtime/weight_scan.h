#pragma once
// Where non-finite logits came from: the checkpoint's weights are scanned only on that error
// path (no sound checkpoint holds a NaN, and reading K3's whole trunk at every start would cost
// what a run's load costs again), so that the error names the tensor and its shard as well as
// the position.

#include <optional>
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

// Whether `s` is check_logits' error (runtime/generator.h): logits that are not finite; or
// model::check_router_scores' (a router's scores).
bool is_nonfinite_logits(const Status& s);

}  // namespace ktier::runtime
