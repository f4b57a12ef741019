#include "synth/synth.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <exception>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "common/append_printf.h"
#include "common/check.h"
#include "common/on_exception.h"
#include "common/progress.h"
#include "format/safetensors_writer.h"
#include "io/output_file.h"
#include "synth/config_gen.h"
#include "synth/plan.h"
#include "synth/tokenizer_gen.h"
#include "synth/values.h"

namespace ktier::synth {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kConfigName = "config.json";
// Written first into every folder synth writes, so that --force replaces a checkpoint only where
// synth wrote it (a release's shards share synth's names: a mistyped -o must not delete them).
constexpr const char* kMarkerName = ".ktier-synth";
constexpr const char* kSmallFiles[] = {"generation_config.json", "tiktoken.model",
                                       "tokenizer_config.json"};
// Upper bound on one work unit of float bytes; a multiple of 32 elements of any dtype.
constexpr uint64_t kChunkBytes = 8ull << 20;
// Elements generated per inner step (fits L1/L2 together with its encoded bytes).
constexpr size_t kBlockElems = 8192;

// ---- output directory -------------------------------------------------------------------------

bool is_shard_name(const std::string& n) {
  // model-{5 digits}-of-{6 digits}.safetensors, optionally with the writer's ".partial" suffix.
  std::string base = n;
  if (base.size() > 8 && base.compare(base.size() - 8, 8, ".partial") == 0) base.resize(base.size() - 8);
  if (base.size() != 33 || base.compare(0, 6, "model-") != 0 || base.compare(11, 4, "-of-") != 0 ||
      base.compare(21, 12, ".safetensors") != 0)
    return false;
  for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19, 20})
    if (base[i] < '0' || base[i] > '9') return false;
  return true;
}

bool is_our_file(const std::string& n) {
  if (is_shard_name(n)) return true;
  std::string base = n;
  if (base.size() > 4 && base.compare(base.size() - 4, 4, ".tmp") == 0) base.resize(base.size() - 4);
  if (base == kIndexName || base == kConfigName) return true;
  for (const char* s : kSmallFiles)
    if (base == s) return true;
  return false;
}

Status remove_file(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  if (ec) return Status::runtime("cannot remove " + p.string() + ": " + ec.message());
  return Status::ok();
}

// Refuses (exit 1) a shape whose tensors cannot fit in the output directory's file system,
// before anything is planned or removed; `need` is min_data_bytes (a lower bound, so a refusal
// is always right). With --force, the checkpoint files it would replace count as free.
Status check_free_space(const fs::path& dir, long double need, bool force) {
  std::error_code ec;
  fs::path probe = fs::absolute(dir, ec);
  while (!ec && !fs::exists(probe, ec) && probe.has_relative_path()) probe = probe.parent_path();
  const fs::space_info space = fs::space(probe, ec);
  if (ec) return Status::ok();  // unknown: the writes will report a full disk
  long double have = static_cast<long double>(space.available);
  if (force && fs::is_directory(dir, ec))
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      // What the file holds on disk, not its length: a --shapes-only shard is mostly a hole.
      struct stat st {};
      if (::stat(it->path().c_str(), &st) == 0 && is_our_file(it->path().filename().string()))
        have += static_cast<long double>(st.st_blocks) * 512;
    }
  if (need <= have) return Status::ok();
  char text[160];
  std::snprintf(text, sizeof text,
                "needs at least %.4Lg GB for its tensors; the file system holding it has %.4Lg GB "
                "free", need / 1e9L, have / 1e9L);
  return Status::runtime("this shape (-o " + dir.string() + ") " + text +
                         " (reduce --experts, --layers, the widths or --vocab)");
}

// Creates `dir`, or empties the checkpoint files of a previous synth there (--force); refuses a
// non-empty folder without --force, and with it one holding checkpoint files but no synth marker
// (exit 2), and, before removing anything, a shape whose tensors need more than the free space
// (`need`, exit 1).
Status prepare_output_dir(const fs::path& dir, bool force, long double need) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  const bool exists = fs::exists(st);
  std::vector<fs::path> ours;  // the checkpoint files --force replaces, index and config first
  if (exists) {
    if (!fs::is_directory(st))
      return Status::usage(dir.string() + " exists and is not a directory");
    const bool empty = fs::is_empty(dir, ec);
    if (ec) return Status::runtime("cannot read " + dir.string() + ": " + ec.message());
    if (!empty && !force)
      return Status::usage(dir.string() + " is not empty; pass --force to overwrite a checkpoint there");
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (is_our_file(it->path().filename().string())) ours.push_back(it->path());
    if (ec) return Status::runtime("cannot list " + dir.string() + ": " + ec.message());
    // The marker is never removed (write_small_file replaces it): a synth stopped while it
    // empties the folder leaves its own files still marked for the next --force.
    std::error_code marker_ec;
    const bool marked = fs::exists(dir / kMarkerName, marker_ec);
    if (marker_ec)
      return Status::runtime("cannot read " + dir.string() + ": " + marker_ec.message());
    if (!ours.empty() && !marked)
      return Status::usage(dir.string() + " holds checkpoint files ktier synth did not " +
                           "write (" + ours.front().filename().string() + "; no " + kMarkerName +
                           " there): --force replaces only a synth checkpoint; remove them " +
                           "yourself or choose another -o");
    // Index and config first: from then on the old checkpoint no longer looks complete.
    const auto first = [](const fs::path& p) {
      return p.filename() == kIndexName || p.filename() == kConfigName;
    };
    std::stable_partition(ours.begin(), ours.end(), first);
  }
  KTIER_RETURN_IF_ERROR(check_free_space(dir, need, force));
  if (!exists) return io::create_output_dir(dir);
  for (const auto& p : ours) KTIER_RETURN_IF_ERROR(remove_file(p));
  return Status::ok();
}

// Writes `text` to dir/name through dir/name.tmp and a rename.
Status write_small_file(const fs::path& dir, const std::string& name, const std::string& text,
                        uint64_t* disk_bytes) {
  const fs::path final_path = dir / name;
  fs::path tmp = final_path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) {
      const std::string why = std::strerror(errno);  // set by the failing libc call on Linux
      std::error_code ec;
      fs::remove(tmp, ec);
      return Status::runtime("cannot write " + tmp.string() + ": " + why);
    }
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) return Status::runtime("cannot rename " + tmp.string() + " to " + final_path.string() + ": " + ec.message());
  *disk_bytes += text.size();
  return Status::ok();
}

// ---- work units --------------------------------------------------------------------------------

// A run of one tensor's bytes: elements [first, first + count), or for MXFP4 the whole packed
// tensor followed by its scale tensor.
struct Segment {
  uint32_t tensor = 0;
  uint64_t first = 0;  // first element (value index)
  uint64_t count = 0;  // elements
  uint64_t bytes = 0;
};

// A contiguous byte range of one shard's data section, produced by one call of produce(). Small
// tensors are batched into one unit (up to kBatchBytes) so that handing units between threads
// does not dominate small checkpoints.
struct WorkUnit {
  uint32_t shard = 0;
  std::vector<Segment> segments;
  uint64_t bytes = 0;
};

constexpr uint64_t kBatchBytes = 1ull << 20;

std::vector<WorkUnit> make_units(const Plan& plan) {
  std::vector<WorkUnit> units;
  auto add = [&](uint32_t shard, const Segment& seg) {
    if (units.empty() || units.back().shard != shard || units.back().bytes + seg.bytes > kBatchBytes)
      units.push_back({shard, {}, 0});
    units.back().segments.push_back(seg);
    units.back().bytes += seg.bytes;
  };
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    const auto shard = static_cast<uint32_t>(s);
    const auto& ts = plan.shards[s].tensors;
    for (size_t i = 0; i < ts.size(); ++i) {
      const PlannedTensor& t = ts[i];
      const auto ti = static_cast<uint32_t>(i);
      if (t.encoding == Encoding::kMxfp4Scale) continue;  // produced with its packed tensor
      if (t.encoding == Encoding::kMxfp4Packed) {
        add(shard, {ti, 0, static_cast<uint64_t>(t.rows * t.cols), t.decl.nbytes() + ts[i + 1].decl.nbytes()});
        continue;
      }
      const uint64_t size = dtype_size(t.decl.dtype);
      const uint64_t per = std::max<uint64_t>(32, kChunkBytes / size / 32 * 32);
      const uint64_t n = t.decl.numel();
      for (uint64_t first = 0; first < n; first += per) {
        const uint64_t count = std::min(per, n - first);
        add(shard, {ti, first, count, count * size});
      }
    }
  }
  return units;
}

struct UnitStats {
  HighByteHistogram trunk, model;
  std::array<uint64_t, 256> scales{};
  void clear() { *this = UnitStats(); }
};

// Writes the bytes of one segment to out[0 .. seg.bytes).
void produce_segment(const PlannedShard& shard, const Segment& seg, uint8_t* out,
                     std::vector<float>& scratch, UnitStats& stats) {
  const PlannedTensor& t = shard.tensors[seg.tensor];
  if (t.encoding == Encoding::kMxfp4Packed) {
    const size_t cols = static_cast<size_t>(t.cols);
    const size_t packed_bytes = static_cast<size_t>(t.rows) * cols / 2;
    scratch.resize(cols);
    for (size_t r = 0; r < static_cast<size_t>(t.rows); ++r) {
      generate_values(t.values, r * cols, cols, scratch.data());
      for (size_t g = 0; g < cols / kMxfp4Group; ++g) {
        const uint8_t s = mxfp4_quantize_group(scratch.data() + g * kMxfp4Group,
                                               out + r * cols / 2 + g * kMxfp4Group / 2);
        out[packed_bytes + r * (cols / kMxfp4Group) + g] = s;
        ++stats.scales[s];
      }
    }
    return;
  }
  HighByteHistogram* hist = t.group == TensorGroup::kTrunk   ? &stats.trunk
                            : t.group == TensorGroup::kModel ? &stats.model
                                                             : nullptr;
  const bool dequant = t.encoding == Encoding::kDequantF32 || t.encoding == Encoding::kDequantBF16;
  const bool bf16 = t.encoding == Encoding::kBF16 || t.encoding == Encoding::kDequantBF16;
  const size_t esize = bf16 ? 2 : 4;
  scratch.resize(kBlockElems);
  for (uint64_t off = 0; off < seg.count; off += kBlockElems) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlockElems, seg.count - off));
    generate_values(t.values, seg.first + off, n, scratch.data());
    // Segments start at multiples of 32 and quantisable matrices hold whole groups: n % 32 == 0.
    if (dequant) mxfp4_round_trip(scratch.data(), n);
    uint8_t* dst = out + off * esize;
    if (bf16)
      encode_bf16(scratch.data(), n, dst, hist);
    else
      encode_f32(scratch.data(), n, dst);
  }
}

void produce(const Plan& plan, const WorkUnit& u, std::vector<uint8_t>& out,
             std::vector<float>& scratch, UnitStats& stats) {
  out.resize(u.bytes);
  uint64_t off = 0;
  for (const Segment& seg : u.segments) {
    produce_segment(plan.shards[u.shard], seg, out.data() + off, scratch, stats);
    off += seg.bytes;
  }
}

// ---- the pipeline ------------------------------------------------------------------------------

// Workers produce units into a ring of slots; the calling thread writes them in order.
class Pipeline {
 public:
  Pipeline(const Plan& plan, const std::vector<WorkUnit>& units, int threads)
      : plan_(plan), units_(units), threads_(threads), slots_(static_cast<size_t>(2 * threads + 2)) {}

  // `consume(unit, bytes, stats)` runs on the calling thread, in unit order.
  template <typename Consume>
  Status run(Consume&& consume) {
    std::vector<std::thread> workers;
    try {
      for (int i = 0; i < threads_; ++i) workers.emplace_back([this] { work(); });
    } catch (const std::exception& e) {
      stop(workers);
      return Status::runtime(std::string("cannot start generator threads: ") + e.what());
    }
    // `consume` may throw (std::bad_alloc opening the next shard): joinable threads would then
    // be destroyed, which is std::terminate; joined first, the exception reaches run_synth.
    const OnException join_on_throw([&] { stop(workers); });
    Status status;
    for (size_t i = 0; i < units_.size() && status.is_ok(); ++i) {
      Slot& slot = slots_[i % slots_.size()];
      {
        std::unique_lock lock(mu_);
        cv_ready_.wait(lock, [&] { return slot.ready || !error_.empty() || out_of_memory_; });
        if (out_of_memory_) {
          status = Status::out_of_memory("out of memory while generating synthetic weights");
          break;
        }
        if (!error_.empty()) {
          status = Status::runtime(error_);
          break;
        }
      }
      status = consume(units_[i], slot.bytes, slot.stats);
      {
        std::lock_guard lock(mu_);
        slot.ready = false;
        consumed_ = i + 1;
      }
      cv_free_.notify_all();
    }
    stop(workers);
    return status;
  }

 private:
  struct Slot {
    std::vector<uint8_t> bytes;
    UnitStats stats;
    bool ready = false;
  };

  void work() {
    std::vector<float> scratch;
    for (;;) {
      size_t i;
      {
        std::unique_lock lock(mu_);
        if (next_ >= units_.size() || abort_) return;
        i = next_++;
        // Slot i % K is free once unit i − K has been written.
        cv_free_.wait(lock, [&] { return i < consumed_ + slots_.size() || abort_; });
        if (abort_) return;
      }
      Slot& slot = slots_[i % slots_.size()];
      try {
        slot.stats.clear();
        produce(plan_, units_[i], slot.bytes, scratch, slot.stats);
      } catch (const std::bad_alloc&) {  // reported by the calling thread, never escapes
        abort_run(/*out_of_memory=*/true, nullptr);
        return;
      } catch (const std::exception& e) {
        abort_run(/*out_of_memory=*/false, e.what());
        return;
      }
      {
        std::lock_guard lock(mu_);
        slot.ready = true;
      }
      cv_ready_.notify_all();
    }
  }

  void stop(std::vector<std::thread>& workers) {
    {
      std::lock_guard lock(mu_);
      abort_ = true;
    }
    cv_free_.notify_all();
    for (auto& w : workers) w.join();
  }

  // Ends the run from a generator thread; run() reports it on the calling thread. Out of memory
  // builds no message here (that could throw again); otherwise `what` says what failed.
  void abort_run(bool out_of_memory, const char* what) {
    std::lock_guard lock(mu_);
    if (out_of_memory) {
      out_of_memory_ = true;
    } else {
      error_ = std::string("generating synthetic weights failed: ") + what;
    }
    abort_ = true;
    cv_ready_.notify_all();
    cv_free_.notify_all();
  }

  const Plan& plan_;
  const std::vector<WorkUnit>& units_;
  int threads_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_ready_, cv_free_;
  size_t next_ = 0;      // next unit to hand out (guarded by mu_)
  size_t consumed_ = 0;  // units written so far (guarded by mu_)
  bool abort_ = false;
  bool out_of_memory_ = false;  // a generator thread's allocation failed (guarded by mu_)
  std::string error_;
};

// ---- run ----------------------------------------------------------------------------------------

// The index; with `shapes_only` its metadata says so (metadata.ktier_synth: every reader of the
// checkpoint warns that its weights are holes).
std::string index_json(const Plan& plan, bool shapes_only) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& shard : plan.shards)
    for (const auto& t : shard.tensors) weight_map[t.decl.name] = shard.file_name;
  nlohmann::json metadata = {{"total_size", plan.data_bytes()}};
  if (shapes_only) metadata["ktier_synth"] = "shapes-only";
  const nlohmann::json index = {{"metadata", std::move(metadata)},
                                {"weight_map", std::move(weight_map)}};
  return index.dump(2) + "\n";
}

std::vector<format::TensorDecl> decls_of(const PlannedShard& shard) {
  std::vector<format::TensorDecl> decls;
  decls.reserve(shard.tensors.size());
  for (const auto& t : shard.tensors) decls.push_back(t.decl);
  return decls;
}

// SynthOptions::shapes_only: each shard's header, then its data section left as a hole.
// Status::runtime, with the shard removed, on a file system that fills the hole instead (no
// sparse files): the run would take the whole checkpoint's size after all.
Status write_shard_headers(const Plan& plan, const fs::path& dir, SynthReport& report) {
  for (const PlannedShard& shard : plan.shards) {
    const fs::path path = dir / shard.file_name;
    KTIER_ASSIGN_OR_RETURN(auto w, format::SafetensorsWriter::create(path, decls_of(shard)));
    KTIER_RETURN_IF_ERROR(w.skip(w.data_bytes()));
    const uint64_t header = 8 + w.header_bytes(), data = w.data_bytes();
    report.disk_bytes += header;
    KTIER_RETURN_IF_ERROR(w.finish());
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;  // before the message's allocations
      return Status::runtime("cannot stat " + path.string() + ": " + std::strerror(err));
    }
    const uint64_t on_disk = static_cast<uint64_t>(st.st_blocks) * 512;
    if (data >= (1u << 20) && on_disk > header + data / 2) {
      (void)remove_file(path);
      return Status::runtime(
          path.string() + " takes " + std::to_string(on_disk) + " bytes on disk for a " +
          std::to_string(header) + "-byte header: the file system of " + dir.string() +
          " does not keep holes (sparse files), so --shapes-only would write the whole " +
          "checkpoint; use another folder (e.g. on ext4, xfs, btrfs or tmpfs)");
    }
  }
  return Status::ok();
}

Status write_shards(const Plan& plan, const fs::path& dir, int threads, bool progress,
                    SynthReport& report) {
  const std::vector<WorkUnit> units = make_units(plan);
  uint64_t total = 0;
  for (const auto& shard : plan.shards)
    total += 8 + format::SafetensorsWriter::header_json(decls_of(shard)).size();
  total += plan.data_bytes();
  ProgressMeter meter("synth", total, progress);
  HighByteHistogram trunk_hist, model_hist;

  std::optional<format::SafetensorsWriter> writer;
  int64_t current = -1;
  uint64_t done = 0;
  // Finishes shards up to `target` − 1 and opens `target`.
  auto advance_to = [&](int64_t target) -> Status {
    while (current < target) {
      if (writer) {
        KTIER_RETURN_IF_ERROR(writer->finish());
        writer.reset();
      }
      if (++current >= static_cast<int64_t>(plan.shards.size())) break;
      const PlannedShard& shard = plan.shards[static_cast<size_t>(current)];
      KTIER_ASSIGN_OR_RETURN(auto w, format::SafetensorsWriter::create(dir / shard.file_name, decls_of(shard)));
      done += 8 + w.header_bytes();
      report.disk_bytes += w.file_bytes();
      writer.emplace(std::move(w));
    }
    return Status::ok();
  };
  Pipeline pipeline(plan, units, threads);
  Status s = pipeline.run([&](const WorkUnit& u, const std::vector<uint8_t>& bytes, const UnitStats& st) -> Status {
    KTIER_RETURN_IF_ERROR(advance_to(u.shard));
    KTIER_RETURN_IF_ERROR(writer->append(bytes.data(), bytes.size()));
    trunk_hist.merge(st.trunk);
    model_hist.merge(st.model);
    for (int i = 0; i < 256; ++i) report.scale_bytes[static_cast<size_t>(i)] += st.scales[static_cast<size_t>(i)];
    done += bytes.size();
    meter.update(done);
    return Status::ok();
  });
  if (s.is_ok()) s = advance_to(static_cast<int64_t>(plan.shards.size()));
  if (!s.is_ok()) return s.is_out_of_memory() ? s.with_context(dir.string()) : s;
  meter.finish(done);
  report.trunk_high_byte_entropy = trunk_hist.entropy_bits();
  report.model_high_byte_entropy = model_hist.entropy_bits();
  return Status::ok();
}

Result<SynthReport> run_synth_impl(const SynthOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  KTIER_ASSIGN_OR_RETURN(SynthShape preset, preset_shape(o.preset));
  KTIER_ASSIGN_OR_RETURN(SynthShape shape, apply_overrides(std::move(preset), o.overrides, o.experts));
  if (o.out_dir.empty()) return Status::usage("no output directory given (-o DIR)");
  KTIER_ASSIGN_OR_RETURN(SynthVocab vocab, build_vocab(shape.bpe_merges, shape.added_tokens, shape.vocab));
  KTIER_RETURN_IF_ERROR(prepare_output_dir(o.out_dir, o.force,
                                           o.shapes_only ? 0 : min_data_bytes(shape, o.experts)));
  const Plan plan = build_plan(shape, o.experts, o.seed);

  SynthReport r;
  r.shape = shape;
  r.experts = o.experts;
  r.seed = o.seed;
  r.out_dir = o.out_dir;
  r.shapes_only = o.shapes_only;
  r.shards = static_cast<int64_t>(plan.shards.size());
  r.ranks = static_cast<int64_t>(vocab.ranks.size());
  r.merges_learned = vocab.merges_learned;
  r.added_begin = vocab.added_begin;
  for (const auto& shard : plan.shards)
    for (const auto& t : shard.tensors) {
      ++r.tensors;
      const uint64_t b = t.decl.nbytes();
      switch (t.group) {
        case TensorGroup::kTrunk: ++r.trunk_tensors, r.trunk_bytes += b; break;
        case TensorGroup::kModel: ++r.model_tensors, r.model_bytes += b; break;
        case TensorGroup::kExpert: ++r.expert_tensors, r.expert_bytes += b; break;
      }
    }

  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, kMarkerName,
                                         "written by ktier synth: `ktier synth --force` may "
                                         "replace the checkpoint in this folder\n",
                                         &r.disk_bytes));
  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, "tiktoken.model", tiktoken_model_text(vocab), &r.disk_bytes));
  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, "tokenizer_config.json", tokenizer_config_json(vocab), &r.disk_bytes));
  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, "generation_config.json", generation_config_json(vocab), &r.disk_bytes));
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 64);
  if (o.shapes_only) {
    KTIER_RETURN_IF_ERROR(write_shard_headers(plan, o.out_dir, r));
  } else {
    KTIER_RETURN_IF_ERROR(write_shards(plan, o.out_dir, threads, o.progress, r));
  }
  // Last: config, then the index. Until the index exists the directory is not a checkpoint.
  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, kConfigName, config_json(shape, o.experts, vocab), &r.disk_bytes));
  KTIER_RETURN_IF_ERROR(write_small_file(o.out_dir, kIndexName, index_json(plan, o.shapes_only),
                                            &r.disk_bytes));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.shapes_only) return r;
  // Expert-use entropy through the real forward pass; a 64-token prompt keeps this to seconds
  // even at K3 widths (k3-slice).
  Result<RoutingStats> routing = measure_routing(o.out_dir, vocab, 64, threads);
  if (!routing.is_ok())  // the files are whole: say so, or a rerun would look needed
    return routing.status().with_context(o.out_dir.string() +
                                         ": the checkpoint is written, measuring its routing "
                                         "failed");
  r.routing = std::move(routing).value();
  return r;
}

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

Result<SynthReport> run_synth(const SynthOptions& options) {
  try {
    return run_synth_impl(options);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(options.out_dir.string() +
                                 ": out of memory while writing or measuring the synthetic "
                                 "checkpoint");
  } catch (const std::exception& e) {  // e.g. filesystem errors; never let it escape the API
    return Status::runtime(std::string("synth failed: ") + e.what());
  }
}

std::string format_report(const SynthReport& r) {
  const SynthShape& s = r.shape;
  std::string out;
  auto add = [&](const char* fmt, auto... args) { append_printf(out, fmt, args...); };
  const auto mla = s.full_attn_layers_1based();
  add("ktier synth: preset %s, seed %llu, experts %s -> %s\n", s.preset.c_str(),
      static_cast<unsigned long long>(r.seed), expert_format_name(r.experts), r.out_dir.string().c_str());
  add("  shape      E %lld, L %lld (%zu MLA at 1-based %s), V %lld, KDA %lldx%lld, MLA %lld heads "
      "(q_lora %lld, kv_lora %lld, nope %lld, rope %lld, v %lld)\n",
      (long long)s.hidden, (long long)s.layers, mla.size(), join_ints(mla).c_str(), (long long)s.vocab,
      (long long)s.kda_heads, (long long)s.kda_head_dim, (long long)s.mla_heads, (long long)s.q_lora,
      (long long)s.kv_lora, (long long)s.qk_nope, (long long)s.qk_rope, (long long)s.v_head);
  add("             experts %lld top-%lld (latent %lld, I %lld), %lld shared, I_d %lld, S %lld\n",
      (long long)s.experts, (long long)s.top_k, (long long)s.latent, (long long)s.expert_inter,
      (long long)s.shared_experts, (long long)s.dense_inter, (long long)s.block_size);
  add("  files      %lld shards + index + config.json + generation_config.json + tiktoken.model + "
      "tokenizer_config.json\n", (long long)r.shards);
  add("  tensors    %lld (trunk %lld, model-level %lld, routed experts %lld)\n", (long long)r.tensors,
      (long long)r.trunk_tensors, (long long)r.model_tensors, (long long)r.expert_tensors);
  add("  bytes      trunk %.1f MB, embedding/head %.1f MB, experts %.1f MB; %.3f GB %s\n",
      r.trunk_bytes / 1e6, r.model_bytes / 1e6, r.expert_bytes / 1e6, r.disk_bytes / 1e9,
      r.shapes_only ? "written (--shapes-only: the data are holes that read as zeros)"
                    : "on disk");
  if (r.shapes_only)
    add("  time       %.2f s\n", r.seconds);
  else
    add("  time       %.2f s, %.0f MB/s\n", r.seconds,
        r.seconds > 0 ? r.disk_bytes / 1e6 / r.seconds : 0.0);
  add("  tokenizer  %lld ranks (256 bytes + %lld merges), added ids %lld..%lld",
      (long long)r.ranks, (long long)(r.ranks - 256), (long long)r.added_begin, (long long)(s.vocab - 1));
  if (r.added_begin > r.ranks)
    add(", ids %lld..%lld unused", (long long)r.ranks, (long long)(r.added_begin - 1));
  out += "\n";
  if (r.shapes_only) return out;  // no values: no entropies, scales or routing
  add("  bf16 high-byte entropy: trunk %.2f bits, embedding/head %.2f bits (trained weights: ~2.7-3.4)\n",
      r.trunk_high_byte_entropy, r.model_high_byte_entropy);
  uint64_t scale_total = 0;
  for (uint64_t c : r.scale_bytes) scale_total += c;
  if (scale_total > 0) {
    out += "  mxfp4 scale bytes:";
    for (int b = 0; b < 256; ++b)
      if (r.scale_bytes[b] * 200 >= scale_total)  // show values holding >= 0.5%
        add(" %d: %.1f%%", b, 100.0 * r.scale_bytes[b] / scale_total);
    out += " (release: 120-122)\n";
  }
  const std::string prompt = r.routing.prompt.size() > 60 ? r.routing.prompt.substr(0, 57) + "..." : r.routing.prompt;
  add("  routing entropy, measured with the forward pass over a %lld-token prompt (\"%s\"), top-%lld,\n"
      "  %.2f s:\n",
      (long long)r.routing.tokens, prompt.c_str(), (long long)s.top_k, r.routing.seconds);
  for (const auto& l : r.routing.layers)
    add("    layer %3lld: %.2f of max %.2f bits (log2 %lld), %lld/%lld experts used\n", (long long)l.layer,
        l.entropy_bits, l.max_bits, (long long)s.experts, (long long)l.experts_used, (long long)s.experts);
  return out;
}

}  // namespace ktier::synth
