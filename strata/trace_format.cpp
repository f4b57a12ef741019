// The .ktrace reader and writer. Layout: docs/STRATA.md §2 (every field little-endian).
#include "strata/trace_format.h"

#include <xxhash.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>
#include <utility>

#include "io/output_file.h"
#include "io/read_file.h"

namespace ktier::strata {
namespace {

constexpr char kBlockMagic[4] = {'K', 'T', 'B', '1'};
constexpr char kFooterMagic[4] = {'K', 'T', 'E', 'N'};
constexpr size_t kStepFixedBytes = 12;    // pass, position, layer, chosen count, depth count
constexpr size_t kExpertWeightBytes = 6;  // u16 expert, f32 weight

void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v));
  out.push_back(static_cast<uint8_t>(v >> 8));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_f32(std::vector<uint8_t>& out, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  put_u32(out, v);
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
float get_f32(const uint8_t* p) {
  const uint32_t v = get_u32(p);
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

std::vector<uint8_t> encode_header(const TraceHeader& h) {
  std::vector<uint8_t> out;
  out.insert(out.end(), kTraceMagic, kTraceMagic + 8);
  put_u32(out, h.version);
  put_u32(out, kTraceHeaderBytes);
  put_u32(out, h.num_layers);
  put_u32(out, h.first_moe_layer);
  put_u32(out, h.experts_per_layer);
  put_u32(out, h.top_k);
  put_u32(out, h.lookahead_depth);
  put_u32(out, h.flags);
  put_u64(out, h.expert_bytes);
  put_u64(out, 0);  // reserved
  put_u64(out, XXH64(out.data(), out.size(), 0));
  return out;
}

// Checks one list of (expert, weight) against the header. `what` names it in messages.
Status check_experts(const std::vector<ExpertWeight>& list, const TraceHeader& h, bool distinct,
                     const std::string& what) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].expert >= h.experts_per_layer) {
      return Status::corrupt(what + ": expert " + std::to_string(list[i].expert) +
                             " is out of range (experts_per_layer " +
                             std::to_string(h.experts_per_layer) + ")");
    }
    if (!distinct) continue;
    for (size_t j = 0; j < i; ++j) {
      if (list[j].expert == list[i].expert) {
        return Status::corrupt(what + ": expert " + std::to_string(list[i].expert) +
                               " is chosen twice");
      }
    }
  }
  return Status::ok();
}

// Validates a step against the header; corrupt status (the caller re-labels it for the writer).
Status check_step(const TraceStep& s, const TraceHeader& h, const std::string& what) {
  if (s.layer >= h.num_layers) {
    return Status::corrupt(what + ": layer " + std::to_string(s.layer) + " >= num_layers " +
                           std::to_string(h.num_layers));
  }
  if (s.layer < h.first_moe_layer && !s.chosen.empty()) {
    return Status::corrupt(what + ": layer " + std::to_string(s.layer) +
                           " is dense (first_moe_layer " + std::to_string(h.first_moe_layer) +
                           ") but routes " +
                           std::to_string(s.chosen.size()) + " experts");
  }
  if (s.chosen.size() > h.top_k) {
    return Status::corrupt(what + ": " + std::to_string(s.chosen.size()) +
                           " chosen experts > top_k " + std::to_string(h.top_k));
  }
  if (s.predicted.size() > h.lookahead_depth) {
    return Status::corrupt(what + ": " + std::to_string(s.predicted.size()) +
                           " prediction depths > lookahead_depth " +
                           std::to_string(h.lookahead_depth));
  }
  KTIER_RETURN_IF_ERROR(check_experts(s.chosen, h, /*distinct=*/true, what + " (chosen)"));
  for (size_t d = 0; d < s.predicted.size(); ++d) {
    if (s.predicted[d].size() > 255) {
      return Status::corrupt(what + ": more than 255 predictions at depth " +
                             std::to_string(d + 1));
    }
    KTIER_RETURN_IF_ERROR(check_experts(s.predicted[d], h, /*distinct=*/true,
                                        what + " (depth " + std::to_string(d + 1) + ")"));
  }
  if (!(h.flags & kTraceFlagRefresh) && !s.refreshed.empty())
    return Status::corrupt(what + ": a refresh list without the header's refresh flag");
  if (s.refreshed.size() > 255) return Status::corrupt(what + ": more than 255 refreshed experts");
  return check_experts(s.refreshed, h, /*distinct=*/true, what + " (refresh)");
}

// Routing and prediction weights are router scores: finite and >= 0, and all 0 when the header
// says none were recorded (flags bit 0 clear). The writer refuses others, so no trace it
// finishes fails this on reading.
Status check_weights(const TraceStep& s, const TraceHeader& h, const std::string& what) {
  const bool recorded = (h.flags & kTraceFlagWeights) != 0;
  const auto check = [&](const std::vector<ExpertWeight>& list, const std::string& which) {
    for (const ExpertWeight& e : list) {
      const bool finite = e.weight >= 0.0f && std::isfinite(e.weight);
      if (finite && (recorded || e.weight == 0.0f)) continue;  // no message built per weight
      const std::string head = what + " (" + which + "): expert " + std::to_string(e.expert) +
                               " has weight " + std::to_string(e.weight);
      if (!finite) return Status::corrupt(head + ", not a finite number >= 0");
      return Status::corrupt(head + ", but the header says no weights were recorded "
                             "(flags bit 0 clear)");
    }
    return Status::ok();
  };
  KTIER_RETURN_IF_ERROR(check(s.chosen, "chosen"));
  for (size_t d = 0; d < s.predicted.size(); ++d)
    KTIER_RETURN_IF_ERROR(check(s.predicted[d], "depth " + std::to_string(d + 1)));
  return check(s.refreshed, "refresh");
}

void encode_step(std::vector<uint8_t>& out, const TraceStep& s, const TraceHeader& h) {
  put_u32(out, s.pass);
  put_u32(out, s.position);
  put_u16(out, s.layer);
  out.push_back(static_cast<uint8_t>(s.chosen.size()));
  out.push_back(static_cast<uint8_t>(s.predicted.size()));
  for (const ExpertWeight& e : s.chosen) put_u16(out, e.expert);
  for (const ExpertWeight& e : s.chosen) put_f32(out, e.weight);
  for (const auto& depth : s.predicted) {
    out.push_back(static_cast<uint8_t>(depth.size()));
    for (const ExpertWeight& e : depth) put_u16(out, e.expert);
    for (const ExpertWeight& e : depth) put_f32(out, e.weight);
  }
  if (!(h.flags & kTraceFlagRefresh)) return;
  out.push_back(static_cast<uint8_t>(s.refreshed.size()));
  for (const ExpertWeight& e : s.refreshed) put_u16(out, e.expert);
  for (const ExpertWeight& e : s.refreshed) put_f32(out, e.weight);
}

// Reads `count` (expert, weight) pairs stored as count u16 then count f32.
bool decode_list(const uint8_t*& p, const uint8_t* end, size_t count,
                 std::vector<ExpertWeight>& out) {
  if (static_cast<size_t>(end - p) < count * kExpertWeightBytes) return false;
  out.resize(count);
  for (size_t i = 0; i < count; ++i) out[i].expert = get_u16(p + 2 * i);
  p += 2 * count;
  for (size_t i = 0; i < count; ++i) out[i].weight = get_f32(p + 4 * i);
  p += 4 * count;
  return true;
}

// `err` is errno read before anything that allocates (a successful malloc may still change it).
Status io_error(int err, const std::string& path, std::string_view what) {
  return Status::runtime(path + ": " + std::string(what) + ": " + std::strerror(err));
}

// Reads up to `n` bytes: fewer only at the end of the file. A read that fails (EIO from a dying
// disk) is a runtime error, exit 1, not the corrupt-input "truncated" a short count reads as.
Result<size_t> read_up_to(std::FILE* file, void* dst, size_t n, const std::string& path) {
  const size_t got = std::fread(dst, 1, n, file);
  if (got < n && std::ferror(file)) return io_error(errno, path, "cannot read the trace");
  return got;
}

}  // namespace

Status validate_trace_header(const TraceHeader& h, const std::string& what) {
  auto bad = [&](const std::string& msg) { return Status::usage(what + ": " + msg); };
  if (h.version != kTraceVersion) {
    return bad("trace version " + std::to_string(h.version) + " is not supported (this ktier " +
               "reads version " + std::to_string(kTraceVersion) + ")");
  }
  if (h.num_layers == 0 || h.num_layers > 65535) return bad("num_layers must be 1..65535");
  if (h.first_moe_layer >= h.num_layers) return bad("first_moe_layer must be < num_layers");
  if (h.experts_per_layer == 0 || h.experts_per_layer > 65535) {
    return bad("experts_per_layer must be 1..65535");
  }
  if (uint64_t{h.num_layers} * h.experts_per_layer > kMaxTraceKeys) {
    return bad("num_layers " + std::to_string(h.num_layers) + " x experts_per_layer " +
               std::to_string(h.experts_per_layer) + " is over the " +
               std::to_string(kMaxTraceKeys) + " (layer, expert) keys a trace may name");
  }
  if (h.top_k == 0 || h.top_k > 255 || h.top_k > h.experts_per_layer) {
    return bad("top_k must be 1..min(255, experts_per_layer)");
  }
  if (h.lookahead_depth > 255) return bad("lookahead_depth must be 0..255");
  if (h.expert_bytes == 0 || h.expert_bytes > kMaxExpertBytes)
    return bad("expert_bytes must be 1.." + std::to_string(kMaxExpertBytes));
  if (h.flags & ~(kTraceFlagWeights | kTraceFlagConverted | kTraceFlagRefresh))
    return bad("unknown flag bits set");
  return Status::ok();
}

Status check_profile_shape(const TraceHeader& profile, const TraceHeader& target,
                           const std::string& what) {
  if (profile.num_layers == target.num_layers &&
      profile.experts_per_layer == target.experts_per_layer &&
      profile.first_moe_layer == target.first_moe_layer)
    return Status::ok();
  const auto shape = [](const TraceHeader& h) {
    return std::to_string(h.num_layers) + " layers of " + std::to_string(h.experts_per_layer) +
           " experts (MoE from " + std::to_string(h.first_moe_layer) + ")";
  };
  return Status::usage(what + ": recorded from a model with " + shape(profile) + ", not " +
                       shape(target));
}

// ---------------------------------------------------------------------------------- writer

Result<TraceWriter> TraceWriter::create(const std::filesystem::path& path,
                                        const TraceHeader& header) {
  KTIER_RETURN_IF_ERROR(validate_trace_header(header, path.string()));
  TraceWriter w;
  w.path_ = path.string();
  w.header_ = header;
  KTIER_ASSIGN_OR_RETURN(w.file_, io::open_output_stream(w.path_, "cannot create the trace file"));
  const std::vector<uint8_t> bytes = encode_header(header);
  if (std::fwrite(bytes.data(), 1, bytes.size(), w.file_) != bytes.size()) {
    return io_error(errno, w.path_, "cannot write the trace header");
  }
  return w;
}

TraceWriter::TraceWriter(TraceWriter&& o) noexcept { *this = std::move(o); }

TraceWriter& TraceWriter::operator=(TraceWriter&& o) noexcept {
  if (this == &o) return *this;
  if (file_) std::fclose(file_);
  file_ = std::exchange(o.file_, nullptr);
  path_ = std::move(o.path_);
  header_ = o.header_;
  payload_ = std::move(o.payload_);
  block_steps_ = o.block_steps_;
  blocks_written_ = o.blocks_written_;
  steps_written_ = o.steps_written_;
  failed_ = std::move(o.failed_);
  return *this;
}

TraceWriter::~TraceWriter() {
  if (file_) std::fclose(file_);
}

Status TraceWriter::append(const TraceStep& step) {
  if (!failed_.is_ok()) return failed_;
  if (!file_) return Status::usage(path_ + ": append after close");
  Status s = check_step(step, header_, "step " + std::to_string(steps_written_));
  if (s.is_ok()) s = check_weights(step, header_, "step " + std::to_string(steps_written_));
  if (!s.is_ok()) return Status::usage(path_ + ": cannot record " + s.message());
  const size_t before = payload_.size();
  encode_step(payload_, step, header_);
  if (payload_.size() > kTraceMaxBlockPayload && block_steps_ > 0) {
    // Wide steps (top_k and depth near their limits): the block closes early, so that no block
    // is larger than readers take. One step is far below the limit (check_step bounds it).
    std::vector<uint8_t> last(payload_.begin() + static_cast<std::ptrdiff_t>(before),
                              payload_.end());
    payload_.resize(before);
    KTIER_RETURN_IF_ERROR(flush_block());
    payload_ = std::move(last);
  }
  ++block_steps_;
  ++steps_written_;
  if (block_steps_ == kTraceStepsPerBlock) return flush_block();
  return Status::ok();
}

Status TraceWriter::flush_block() {
  if (block_steps_ == 0) return Status::ok();
  std::vector<uint8_t> head;
  head.insert(head.end(), kBlockMagic, kBlockMagic + 4);
  put_u32(head, block_steps_);
  put_u64(head, payload_.size());
  put_u64(head, XXH64(payload_.data(), payload_.size(), 0));
  if (std::fwrite(head.data(), 1, head.size(), file_) != head.size() ||
      std::fwrite(payload_.data(), 1, payload_.size(), file_) != payload_.size()) {
    const int err = errno;
    failed_ = io_error(err, path_, "cannot write trace block " + std::to_string(blocks_written_));
    return failed_;
  }
  payload_.clear();
  block_steps_ = 0;
  ++blocks_written_;
  return Status::ok();
}

Status TraceWriter::close() {
  if (!failed_.is_ok()) return failed_;
  if (!file_) return Status::usage(path_ + ": close called twice");
  KTIER_RETURN_IF_ERROR(flush_block());
  std::vector<uint8_t> foot;
  foot.insert(foot.end(), kFooterMagic, kFooterMagic + 4);
  put_u32(foot, 0);  // reserved
  put_u64(foot, blocks_written_);
  put_u64(foot, steps_written_);
  put_u64(foot, XXH64(foot.data(), foot.size(), 0));
  const bool ok = std::fwrite(foot.data(), 1, foot.size(), file_) == foot.size();
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) return io_error(errno, path_, "cannot finish the trace file");
  return Status::ok();
}

// ---------------------------------------------------------------------------------- reader

Result<TraceReader> TraceReader::open(const std::filesystem::path& path) {
  TraceReader r;
  r.path_ = path.string();
  // A file or a pipe (`<(zcat t.ktrace.gz)`); a FIFO is not waited for: one without a writer
  // reads as empty at once. A directory or a device is refused by name.
  int open_errno = 0;
  Result<int> fd = io::open_file_or_pipe(path, &open_errno);
  if (!fd.is_ok()) {  // a path the command line named that does not exist is a usage error
    if (open_errno == ENOENT) return Status::usage(r.path_ + ": no such trace file");
    return fd.status();
  }
  r.file_ = ::fdopen(*fd, "rb");
  if (!r.file_) {
    const int err = errno;
    ::close(*fd);
    return io_error(err, r.path_, "cannot open the trace");
  }
  uint8_t h[kTraceHeaderBytes];
  KTIER_ASSIGN_OR_RETURN(const size_t got, read_up_to(r.file_, h, sizeof(h), r.path_));
  if (got == 0 && !std::filesystem::is_regular_file(path))
    return Status::usage(r.path_ + ": a pipe that gave no bytes (no writer when it was opened, "
                         "or one that wrote nothing)");
  if (got >= 8 && std::memcmp(h, kTraceMagic, 8) != 0) {
    return Status::corrupt(r.path_ +
                           ": not a ktier trace (bad magic in the header). If it is the "
                           "conformance expert_trace.bin (int32 pairs), convert it first with "
                           "`ktier trace convert IN OUT`");
  }
  if (got < sizeof(h)) {
    return Status::corrupt(r.path_ + ": truncated in the header (" + std::to_string(got) + " of " +
                           std::to_string(kTraceHeaderBytes) + " bytes)");
  }
  if (XXH64(h, 56, 0) != get_u64(h + 56)) {
    return Status::corrupt(r.path_ + ": header checksum mismatch (the header bytes are corrupt)");
  }
  if (get_u32(h + 12) != kTraceHeaderBytes) {
    return Status::corrupt(r.path_ + ": header size field is " + std::to_string(get_u32(h + 12)) +
                           ", expected " + std::to_string(kTraceHeaderBytes));
  }
  TraceHeader& hd = r.header_;
  hd.version = get_u32(h + 8);
  hd.num_layers = get_u32(h + 16);
  hd.first_moe_layer = get_u32(h + 20);
  hd.experts_per_layer = get_u32(h + 24);
  hd.top_k = get_u32(h + 28);
  hd.lookahead_depth = get_u32(h + 32);
  hd.flags = get_u32(h + 36);
  hd.expert_bytes = get_u64(h + 40);
  if (get_u64(h + 48) != 0)  // reserved: a later version's field this reader would ignore
    return Status::corrupt(r.path_ + ": header bytes 48..55 (reserved) are not 0");
  const Status valid = validate_trace_header(hd, r.path_);
  if (!valid.is_ok()) return Status::corrupt(valid.message());
  r.offset_ = kTraceHeaderBytes;
  return r;
}

TraceReader::TraceReader(TraceReader&& o) noexcept { *this = std::move(o); }

TraceReader& TraceReader::operator=(TraceReader&& o) noexcept {
  if (this == &o) return *this;
  if (file_) std::fclose(file_);
  file_ = std::exchange(o.file_, nullptr);
  path_ = std::move(o.path_);
  header_ = o.header_;
  offset_ = o.offset_;
  blocks_read_ = o.blocks_read_;
  steps_read_ = o.steps_read_;
  done_ = o.done_;
  return *this;
}

TraceReader::~TraceReader() {
  if (file_) std::fclose(file_);
}

Result<bool> TraceReader::next_block(std::vector<TraceStep>& out) {
  out.clear();
  if (done_) return false;
  const std::string where = path_ + ": block " + std::to_string(blocks_read_) + " (byte offset " +
                            std::to_string(offset_) + ")";
  uint8_t head[kTraceFooterBytes];  // the footer is the larger of the two heads
  KTIER_ASSIGN_OR_RETURN(size_t got, read_up_to(file_, head, 4, path_));
  if (got == 0) {
    return Status::corrupt(path_ + ": ends after " + std::to_string(steps_read_) +
                           " steps without its footer (truncated, or the recording run did not "
                           "finish)");
  }
  if (got < 4) return Status::corrupt(where + ": truncated");
  if (std::memcmp(head, kFooterMagic, 4) == 0) {
    KTIER_ASSIGN_OR_RETURN(got, read_up_to(file_, head + 4, kTraceFooterBytes - 4, path_));
    if (got != kTraceFooterBytes - 4) {
      return Status::corrupt(path_ + ": truncated in the footer");
    }
    if (XXH64(head, 24, 0) != get_u64(head + 24)) {
      return Status::corrupt(path_ + ": footer checksum mismatch");
    }
    if (get_u32(head + 4) != 0) return Status::corrupt(path_ + ": footer reserved field is not 0");
    if (get_u64(head + 8) != blocks_read_ || get_u64(head + 16) != steps_read_) {
      return Status::corrupt(path_ + ": footer counts (" + std::to_string(get_u64(head + 8)) +
                             " blocks, " + std::to_string(get_u64(head + 16)) +
                             " steps) do not match the file (" + std::to_string(blocks_read_) +
                             " blocks, " + std::to_string(steps_read_) + " steps)");
    }
    uint8_t extra;
    KTIER_ASSIGN_OR_RETURN(got, read_up_to(file_, &extra, 1, path_));
    if (got != 0) {
      return Status::corrupt(path_ + ": bytes follow the footer");
    }
    done_ = true;
    return false;
  }
  if (std::memcmp(head, kBlockMagic, 4) != 0) {
    return Status::corrupt(where + ": bad block magic (corrupt bytes)");
  }
  KTIER_ASSIGN_OR_RETURN(got, read_up_to(file_, head + 4, kTraceBlockHeaderBytes - 4, path_));
  if (got != kTraceBlockHeaderBytes - 4) {
    return Status::corrupt(where + ": truncated in the block header");
  }
  const uint32_t step_count = get_u32(head + 4);
  const uint64_t payload_bytes = get_u64(head + 8);
  const uint64_t checksum = get_u64(head + 16);
  if (payload_bytes > kTraceMaxBlockPayload || step_count == 0 ||
      payload_bytes < step_count * kStepFixedBytes) {
    return Status::corrupt(where + ": implausible block size (" + std::to_string(step_count) +
                           " steps in " + std::to_string(payload_bytes) + " bytes)");
  }
  std::vector<uint8_t> payload(payload_bytes);
  KTIER_ASSIGN_OR_RETURN(got, read_up_to(file_, payload.data(), payload.size(), path_));
  if (got != payload.size()) {
    return Status::corrupt(where + ": truncated (" + std::to_string(got) + " of " +
                           std::to_string(payload_bytes) + " payload bytes)");
  }
  if (XXH64(payload.data(), payload.size(), 0) != checksum) {
    return Status::corrupt(where + ": checksum mismatch (corrupt bytes in steps " +
                           std::to_string(steps_read_) + ".." +
                           std::to_string(steps_read_ + step_count - 1) + ")");
  }
  const uint8_t* p = payload.data();
  const uint8_t* end = p + payload.size();
  out.resize(step_count);
  for (uint32_t i = 0; i < step_count; ++i) {
    const std::string step_name = path_ + ": step " + std::to_string(steps_read_ + i);
    TraceStep& s = out[i];
    if (end - p < static_cast<ptrdiff_t>(kStepFixedBytes)) {
      return Status::corrupt(step_name + ": block payload ends inside the step");
    }
    s.pass = get_u32(p);
    s.position = get_u32(p + 4);
    s.layer = get_u16(p + 8);
    const size_t chosen = p[10];
    const size_t depths = p[11];
    p += kStepFixedBytes;
    if (!decode_list(p, end, chosen, s.chosen)) {
      return Status::corrupt(step_name + ": block payload ends inside the chosen experts");
    }
    s.predicted.resize(depths);
    for (size_t d = 0; d < depths; ++d) {
      const bool has_count = p != end;
      const size_t count = has_count ? *p++ : 0;
      if (!has_count || !decode_list(p, end, count, s.predicted[d])) {
        return Status::corrupt(step_name + ": block payload ends inside depth " +
                               std::to_string(d + 1));
      }
    }
    s.refreshed.clear();
    if (header_.flags & kTraceFlagRefresh) {
      const bool has_count = p != end;
      const size_t count = has_count ? *p++ : 0;
      if (!has_count || !decode_list(p, end, count, s.refreshed))
        return Status::corrupt(step_name + ": block payload ends inside the refresh list");
    }
    KTIER_RETURN_IF_ERROR(check_step(s, header_, step_name));
    KTIER_RETURN_IF_ERROR(check_weights(s, header_, step_name));
  }
  if (p != end) return Status::corrupt(where + ": payload has bytes after its last step");
  offset_ += kTraceBlockHeaderBytes + payload_bytes;
  ++blocks_read_;
  steps_read_ += step_count;
  return true;
}

Result<Trace> read_trace(const std::filesystem::path& path) {
  KTIER_ASSIGN_OR_RETURN(TraceReader reader, TraceReader::open(path));
  Trace trace;
  trace.header = reader.header();
  std::vector<TraceStep> block;
  while (true) {
    KTIER_ASSIGN_OR_RETURN(const bool more, reader.next_block(block));
    if (!more) break;
    for (TraceStep& s : block) trace.steps.push_back(std::move(s));
  }
  return trace;
}

Status write_trace(const std::filesystem::path& path, const Trace& trace) {
  KTIER_ASSIGN_OR_RETURN(TraceWriter writer, TraceWriter::create(path, trace.header));
  for (const TraceStep& s : trace.steps) KTIER_RETURN_IF_ERROR(writer.append(s));
  return writer.close();
}

bool looks_like_ktier_trace(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::FILE* f = std::fopen(path.string().c_str(), "rb");
  if (!f) return false;
  char magic[8];
  const bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, kTraceMagic, 8) == 0;
  std::fclose(f);
  return ok;
}

}  // namespace ktier::strata
