// Conversion of the conformance int32-pair routing trace. Structure rules: conformance_trace.h.
#include "strata/conformance_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/read_file.h"

namespace ktier::strata {
namespace {

// The shared conformance trace is 0.8 MB. Each record read becomes a step's worth of memory
// (up to ~150 bytes at top_k 1), so the input is bounded: 64 MiB is 8 million records, at
// most ~1.2 GB decoded.
constexpr size_t kMaxConformanceTraceBytes = size_t{64} << 20;

constexpr size_t kRecordBytes = 8;  // int32 layer, int32 expert
constexpr int32_t kMaxLayer = 65534;

int32_t get_i32(const uint8_t* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

}  // namespace

Result<Trace> read_conformance_trace(const std::filesystem::path& path,
                                     const ConformanceTraceOptions& options) {
  const std::string name = path.string();
  std::error_code ec;
  // A folder or a device (/dev/zero) would read as an error or without end: refused by name. A
  // pipe is read (`trace convert <(zcat x.bin.gz) out`), up to kMaxConformanceTraceBytes.
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st) || std::filesystem::is_character_file(st) ||
      std::filesystem::is_block_file(st))
    return Status::usage(name + ": not a file or a pipe (the conformance trace is a file of int32 "
                                "(layer, expert) pairs)");
  // Not waiting for a FIFO's writer: one without reads as empty.
  int open_errno = 0;
  Result<int> fd = io::open_file_or_pipe(path, &open_errno);
  std::FILE* f = fd.is_ok() ? ::fdopen(*fd, "rb") : nullptr;
  if (!f) {
    const int err = fd.is_ok() ? errno : open_errno;
    if (fd.is_ok()) ::close(*fd);
    if (err == ENOENT)
      return Status::usage(name + ": no such file (the conformance trace lives in "
                                  "../shared/conformance/expert_trace.bin)");
    if (!fd.is_ok() && err == 0) return fd.status();
    return Status::runtime(name + ": cannot open the conformance trace: " + std::strerror(err) +
                           " (it lives in ../shared/conformance/expert_trace.bin)");
  }
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    bytes.insert(bytes.end(), buf, buf + n);
    if (bytes.size() > kMaxConformanceTraceBytes) {
      std::fclose(f);
      return Status::usage(name + ": over " + std::to_string(kMaxConformanceTraceBytes >> 20) +
                           " MiB, more than a conformance trace holds (the shared one is 0.8 MB)");
    }
  }
  const int read_errno = std::ferror(f) != 0 ? errno : 0;
  std::fclose(f);
  if (read_errno != 0) return Status::runtime(name + ": read error: " + std::strerror(read_errno));

  const size_t k = options.top_k;
  if (k == 0 || k > 255 || options.experts_per_layer == 0 || options.experts_per_layer > 65535) {
    return Status::usage(
        "conformance conversion: top_k must be 1..255 and experts_per_layer "
        "1..65535");
  }
  // (Checked before the records: a group of more than experts_per_layer distinct experts
  // cannot exist, and each would read as an expert appearing twice, a corrupt file.)
  if (k > options.experts_per_layer)
    return Status::usage("conformance conversion: top_k " + std::to_string(k) +
                         " exceeds experts_per_layer " +
                         std::to_string(options.experts_per_layer));
  const size_t records = bytes.size() / kRecordBytes;
  if (bytes.size() % kRecordBytes != 0) {
    return Status::corrupt(name + ": size " + std::to_string(bytes.size()) +
                           " is not a multiple of 8 (record " + std::to_string(records) +
                           " is truncated)");
  }
  if (records == 0 || records % k != 0) {
    return Status::corrupt(name + ": " + std::to_string(records) +
                           " records is not a positive multiple of top_k " + std::to_string(k) +
                           " (the last group, from record " +
                           std::to_string(records - records % k) + ", is incomplete)");
  }

  // Decode every group of k records into (layer, experts), checking ids and distinctness. A
  // layer is at most kMaxLayer and leaves its keys within the trace's (layers x experts).
  const int32_t last_layer = static_cast<int32_t>(std::min<uint64_t>(
      kMaxLayer, kMaxTraceKeys / options.experts_per_layer - 1));
  const size_t groups = records / k;
  std::vector<uint16_t> group_layer(groups);
  Trace trace;
  trace.steps.resize(groups);
  int32_t min_layer = kMaxLayer, max_layer = -1;
  for (size_t g = 0; g < groups; ++g) {
    TraceStep& step = trace.steps[g];
    step.chosen.resize(k);
    for (size_t j = 0; j < k; ++j) {
      const size_t r = g * k + j;
      const int32_t layer = get_i32(&bytes[r * kRecordBytes]);
      const int32_t expert = get_i32(&bytes[r * kRecordBytes + 4]);
      const std::string at = name + ": record " + std::to_string(r) + " (byte " +
                             std::to_string(r * kRecordBytes) + ")";
      if (layer < 0 || layer > last_layer) {
        return Status::corrupt(at + ": layer " + std::to_string(layer) + " is out of range 0.." +
                               std::to_string(last_layer) + " (a trace names at most " +
                               std::to_string(kMaxTraceKeys) + " (layer, expert) keys, " +
                               std::to_string(options.experts_per_layer) + " experts a layer)");
      }
      if (expert < 0 || expert >= static_cast<int32_t>(options.experts_per_layer)) {
        return Status::corrupt(at + ": expert " + std::to_string(expert) + " is out of range 0.." +
                               std::to_string(options.experts_per_layer - 1));
      }
      if (j == 0) {
        group_layer[g] = static_cast<uint16_t>(layer);
      } else if (layer != group_layer[g]) {
        return Status::corrupt(at + ": layer " + std::to_string(layer) + " inside a group of " +
                               std::to_string(k) + " that started at layer " +
                               std::to_string(group_layer[g]) + " (record " +
                               std::to_string(g * k) + ")");
      }
      for (size_t i = 0; i < j; ++i) {
        if (step.chosen[i].expert == expert) {
          return Status::corrupt(at + ": expert " + std::to_string(expert) +
                                 " appears twice in the group starting at record " +
                                 std::to_string(g * k));
        }
      }
      step.chosen[j].expert = static_cast<uint16_t>(expert);
    }
    step.layer = group_layer[g];
    min_layer = std::min<int32_t>(min_layer, step.layer);
    max_layer = std::max<int32_t>(max_layer, step.layer);
  }

  // Infer passes: see the header comment.
  uint32_t pass = 0;
  int32_t pass_last_layer = -1;
  size_t g = 0;
  while (g < groups) {
    const size_t pass_start = g;
    if (group_layer[g] != min_layer) {
      return Status::corrupt(name + ": record " + std::to_string(g * k) + ": pass " +
                             std::to_string(pass) + " starts at layer " +
                             std::to_string(group_layer[g]) + ", expected layer " +
                             std::to_string(min_layer));
    }
    size_t positions = 0;
    while (g + positions < groups && group_layer[g + positions] == min_layer) ++positions;
    int32_t layer = min_layer;
    while (g < groups && (g == pass_start || group_layer[g] != min_layer)) {
      for (size_t t = 0; t < positions; ++t, ++g) {
        if (g >= groups || group_layer[g] != layer) {
          return Status::corrupt(
              name + ": record " + std::to_string(std::min(g, groups) * k) + ": pass " +
              std::to_string(pass) + " has " + std::to_string(positions) + " positions but layer " +
              std::to_string(layer) + " has only " + std::to_string(t) + " groups");
        }
        trace.steps[g].pass = pass;
        trace.steps[g].position = static_cast<uint32_t>(t);
      }
      if (g < groups && group_layer[g] == layer) {
        return Status::corrupt(name + ": record " + std::to_string(g * k) + ": pass " +
                               std::to_string(pass) + " has " + std::to_string(positions) +
                               " positions but layer " + std::to_string(layer) +
                               " has more groups");
      }
      if (g < groups && group_layer[g] != min_layer && group_layer[g] != layer + 1) {
        return Status::corrupt(name + ": record " + std::to_string(g * k) + ": pass " +
                               std::to_string(pass) + " jumps from layer " + std::to_string(layer) +
                               " to layer " + std::to_string(group_layer[g]));
      }
      ++layer;
    }
    if (pass_last_layer >= 0 && layer - 1 != pass_last_layer) {
      return Status::corrupt(name + ": record " + std::to_string(pass_start * k) + ": pass " +
                             std::to_string(pass) + " ends at layer " + std::to_string(layer - 1) +
                             ", earlier passes at layer " + std::to_string(pass_last_layer));
    }
    pass_last_layer = layer - 1;
    ++pass;
  }

  TraceHeader& h = trace.header;
  h.num_layers = static_cast<uint32_t>(max_layer) + 1;
  h.first_moe_layer = static_cast<uint32_t>(min_layer);
  h.experts_per_layer = options.experts_per_layer;
  h.top_k = static_cast<uint32_t>(k);
  h.lookahead_depth = 0;
  h.expert_bytes = options.expert_bytes;
  h.flags = kTraceFlagConverted;
  KTIER_RETURN_IF_ERROR(validate_trace_header(h, "conformance conversion"));
  return trace;
}

}  // namespace ktier::strata
