#pragma once
// The ktier routing trace (`.ktrace`), version 1: what the engine asked for, for every token and
// MoE layer, and what router lookahead predicted. Byte-for-byte layout: docs/STRATA.md §2.
//
//   header (64 bytes, xxh64-checked) | block* | footer (32 bytes, xxh64-checked)
//   block = block header (24 bytes: magic, step count, payload bytes, xxh64 of the payload)
//           + payload (the steps of the block, back to back)
//
// A *step* is one request set: one token at one MoE layer, i.e. the top-k experts the router
// chose there (with routing weights) plus the predictions made right after that layer's
// attention for layers layer+1 .. layer+depth of the same token, and (flag kTraceFlagRefresh)
// the refresh: its own experts as predicted just before its attention. Steps appear in the order the
// engine issued them (request order), which is what a replay consumes.
//
// Usage (the engine, `--trace FILE`):
//   KTIER_ASSIGN_OR_RETURN(TraceWriter w, TraceWriter::create(path, header));
//   for each token, for each MoE layer: KTIER_RETURN_IF_ERROR(w.append(step));
//   KTIER_RETURN_IF_ERROR(w.close());   // without close() the file has no footer: readers
//                                        // refuse it (a run that stopped inside a token)
//
// Reading: read_trace(path) loads and validates a whole file; TraceReader streams it block by
// block. Any byte that does not check out is Status::corrupt (exit 3) naming the file and the
// block / step at fault; a missing file or a folder is Status::usage (exit 2), an unreadable one
// Status::runtime (exit 1).
// Neither class is thread-safe; use one per thread.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"

namespace ktier::strata {

// Largest expert_bytes a trace may state: 1 GiB, ~60x K3's expert. Byte totals are products of
// it with counts up to 2^32 (layers x experts), which must stay inside uint64.
inline constexpr uint64_t kMaxExpertBytes = uint64_t{1} << 30;

inline constexpr char kTraceMagic[8] = {'K', 'T', 'I', 'E', 'R', 'T', 'R', 'C'};
inline constexpr uint32_t kTraceVersion = 1;
inline constexpr uint32_t kTraceHeaderBytes = 64;
inline constexpr uint32_t kTraceBlockHeaderBytes = 24;
inline constexpr uint32_t kTraceFooterBytes = 32;
// The writer closes a block every this many steps (or earlier, where the next step would take
// it past kTraceMaxBlockPayload): a block is the unit of checksum and of loss when a run dies
// (the file is then rejected for its missing footer, see docs/STRATA.md).
inline constexpr uint32_t kTraceStepsPerBlock = 1024;
// Readers refuse blocks larger than this (a corrupt size field must not allocate gigabytes).
inline constexpr uint32_t kTraceMaxBlockPayload = 64u << 20;

// Header flags.
inline constexpr uint32_t kTraceFlagWeights = 1u << 0;    // routing weights were recorded
inline constexpr uint32_t kTraceFlagConverted = 1u << 1;  // converted from conformance int32 pairs
inline constexpr uint32_t kTraceFlagRefresh = 1u << 2;    // every step carries its refresh list

// The deepest lookahead a trace records (its header and steps hold depths in a byte).
inline constexpr int kMaxTraceLookahead = 255;

// The most (layer, expert) keys a trace may name, num_layers × experts_per_layer: replay and
// `trace info` keep arrays per key, so a header of 65,535 × 65,535 would ask for tens of GB
// before a step is read. K3 has 93 × 896 = 83,328; this allows 50 times that.
inline constexpr uint64_t kMaxTraceKeys = uint64_t{1} << 22;

struct TraceHeader {
  uint32_t version = kTraceVersion;
  uint32_t num_layers = 0;         // decoder layers; every step's layer is < num_layers
  uint32_t first_moe_layer = 0;    // layers below it are dense (K3: 1)
  uint32_t experts_per_layer = 0;  // routed experts per MoE layer (K3: 896), <= 65535
  uint32_t top_k = 0;              // experts chosen per token per layer (K3: 16), <= 255
  uint32_t lookahead_depth = 0;    // prediction depths recorded per step, <= 255 (0: none)
  uint64_t expert_bytes = 0;       // bytes of one routed expert as stored (K3: 17,547,264),
                                   // 1..kMaxExpertBytes
  uint32_t flags = 0;              // kTraceFlag*
};

// One chosen or predicted expert. `weight` is the routing weight for a chosen expert and the
// predicted (normalised top-k) weight for a prediction; 0 when not recorded.
struct ExpertWeight {
  uint16_t expert = 0;
  float weight = 0.0f;
};

struct TraceStep {
  uint32_t pass = 0;      // forward pass (engine step) that issued it; a prefill chunk is one pass
  uint32_t position = 0;  // token position in the sequence
  uint16_t layer = 0;     // decoder layer
  std::vector<ExpertWeight> chosen;  // the router's top-k, in selection order; distinct experts
  // predicted[d-1]: experts predicted for layer + d of the same token, highest weight first.
  std::vector<std::vector<ExpertWeight>> predicted;
  // The lookahead refresh (docs/STRATA.md §4): this step's own experts as predicted after the
  // previous layer's FFN, before this layer's attention, highest weight first. Stored only when
  // the header has kTraceFlagRefresh; may be empty (nothing was predicted).
  std::vector<ExpertWeight> refreshed;
};

struct Trace {
  TraceHeader header;
  std::vector<TraceStep> steps;  // request order
};

// Checks a header's fields for consistency; usage error naming `what` (a file or "header").
Status validate_trace_header(const TraceHeader& header, const std::string& what);

// A profile (`--profile`) seeds a policy whose keys are layer x experts_per_layer + expert: it
// must have been recorded on a model of the same layers, experts per layer and first MoE layer
// as `target` (the run's model, or the trace replayed). Usage error naming `what` otherwise.
Status check_profile_shape(const TraceHeader& profile, const TraceHeader& target,
                           const std::string& what);

class TraceWriter {
 public:
  // Creates (truncates) `path` and writes the header. REQUIRES: nothing; a header that fails
  // validate_trace_header() is a usage error.
  static Result<TraceWriter> create(const std::filesystem::path& path, const TraceHeader& header);

  TraceWriter(TraceWriter&& other) noexcept;
  TraceWriter& operator=(TraceWriter&& other) noexcept;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  ~TraceWriter();  // closes the file without a footer if close() was not called

  // Appends one step. A step that does not fit the header (layer, expert id, count, depth,
  // duplicate chosen expert) is a usage error and nothing is written.
  Status append(const TraceStep& step);
  // Flushes the last block and writes the footer. The writer is unusable afterwards.
  Status close();

  uint64_t steps_written() const { return steps_written_; }

 private:
  TraceWriter() = default;
  Status flush_block();

  std::FILE* file_ = nullptr;
  std::string path_;
  TraceHeader header_;
  std::vector<uint8_t> payload_;  // the block being filled
  uint32_t block_steps_ = 0;
  uint64_t blocks_written_ = 0;
  uint64_t steps_written_ = 0;
  // A block write that failed: every later append() and close() returns it (the file holds a
  // part of a block; a footer counting the rest would not match it).
  Status failed_;
};

class TraceReader {
 public:
  // Opens `path` and reads and checks the header.
  static Result<TraceReader> open(const std::filesystem::path& path);

  TraceReader(TraceReader&& other) noexcept;
  TraceReader& operator=(TraceReader&& other) noexcept;
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;
  ~TraceReader();

  const TraceHeader& header() const { return header_; }

  // Reads the next block's steps into `out` (cleared first). Returns false at the footer, after
  // checking it (counts and checksum) and that nothing follows it.
  Result<bool> next_block(std::vector<TraceStep>& out);

 private:
  TraceReader() = default;

  std::FILE* file_ = nullptr;
  std::string path_;
  TraceHeader header_;
  uint64_t offset_ = 0;  // bytes consumed
  uint64_t blocks_read_ = 0;
  uint64_t steps_read_ = 0;
  bool done_ = false;
};

// Reads and validates a whole trace.
Result<Trace> read_trace(const std::filesystem::path& path);
// Writes a whole trace (TraceWriter::create, append each step, close).
Status write_trace(const std::filesystem::path& path, const Trace& trace);

// True if `path` is a regular file that starts with kTraceMagic (used to give a helpful hint for
// other formats). Anything else is not opened (a FIFO read once already would wait for a second
// writer) and is false.
bool looks_like_ktier_trace(const std::filesystem::path& path);

}  // namespace ktier::strata
