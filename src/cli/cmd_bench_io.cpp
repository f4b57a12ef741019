// `ktier bench io`: the engine's trunk-streaming read path against plain sequential O_DIRECT
// reads of the same file, measured in the same run (issue 4, item 6a; goal: ratio >= 0.90).
//
//   raw:    pread() of the layer records (the front of trunk.pack, the engine's bytes) in order
//           in --raw-block-mib blocks (default 64 MiB: large
//           enough that one synchronous stream keeps a device's queue busy) into one aligned buffer, on a
//           file opened with O_DIRECT where the filesystem allows it (else buffered: said so).
//   engine: what TrunkStore does for fully streamed layers: every layer record, in order, read
//           with one request through the I/O engine into a 2-slot ring (the next record in
//           flight while the current one is checked), each record's xxh3 verified.
// Each is the best of --passes passes. With a page cache between the runs and the disk (no
// O_DIRECT), both read from RAM and the ratio measures CPU overheads only: the output says so.
//
//   ktier bench io --pack PACKDIR [--passes N] [--io auto|uring|pread] [--raw-block-mib N]
//                  [--json FILE]
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/bench_util.h"
#include "cli/cli_input.h"
#include "cli/commands.h"
#include "common/json_text.h"
#include "io/aligned_buffer.h"
#include "io/io_engine.h"
#include "io/output_file.h"
#include "io/read_file.h"
#include "pack/trunk_pack.h"

namespace ktier::cli {
namespace {

struct IoBenchOptions {
  std::string pack, json, io = "auto";
  int passes = 3, ring_slots = 2;
  uint64_t raw_block_mib = 64;
};

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Records are read in order into `slots` (a ring): all but the slot being verified have a read
// in flight, as in TrunkStore's ring of the same size.
Result<double> engine_pass(const pack::TrunkPack& p, io::IoEngine& engine, const io::ReadFile& f,
                           std::vector<io::AlignedBuffer>& slots, uint64_t* bytes) {
  std::vector<const pack::Record*> layers;
  for (const pack::Record& r : p.records())
    if (r.kind == pack::RecordKind::kLayer) layers.push_back(&r);
  io::CompletionQueue cq(engine);
  const size_t n = slots.size();
  const auto t0 = std::chrono::steady_clock::now();
  auto issue = [&](size_t i) {
    const io::ReadRequest req{&f, layers[i]->offset, layers[i]->size, slots[i % n].data(), i};
    return cq.submit(std::span<const io::ReadRequest>(&req, 1));
  };
  *bytes = 0;
  size_t issued = 0;
  for (; issued < std::min(n - 1, layers.size()); ++issued) KTIER_RETURN_IF_ERROR(issue(issued));
  std::vector<bool> ready(layers.size(), false);
  std::vector<io::Completion> done;
  for (size_t i = 0; i < layers.size(); ++i) {
    while (!ready[i]) {  // completions arrive in any order
      done.clear();
      cq.wait(1, done);
      for (const io::Completion& c : done) {
        KTIER_RETURN_IF_ERROR(c.status);
        ready[c.tag] = true;
      }
    }
    if (issued < layers.size()) KTIER_RETURN_IF_ERROR(issue(issued++));  // into the freed slot
    KTIER_RETURN_IF_ERROR(p.verify(*layers[i], slots[i % n].data()));
    *bytes += layers[i]->size;
  }
  return static_cast<double>(*bytes) / seconds(t0) / 1e9;
}

Status run_io_bench(const IoBenchOptions& o) {
  if (o.passes < 1) return Status::usage("--passes must be >= 1");
  io::IoOptions io_opts;
  KTIER_ASSIGN_OR_RETURN(io_opts.backend, io::parse_io_backend(o.io));
  KTIER_RETURN_IF_ERROR(
      check_output_is_not_input("--json", o.json, {{"--pack", o.pack, true}}));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", o.json));
  KTIER_ASSIGN_OR_RETURN(const pack::TrunkPack p, pack::TrunkPack::open_unchecked(o.pack));
  if (p.compressed())
    return Status::usage(o.pack + ": a compressed pack; bench io measures plain packs (see ktier bench "
                         "inflate, and bench decode --io-rate-limit for compressed ones)");
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<io::IoEngine> engine, io::make_io_engine(io_opts));
  KTIER_ASSIGN_OR_RETURN(const io::ReadFile f, engine->open(p.pack_path()));
  uint64_t largest = 0, layers_end = 0;
  for (const pack::Record& r : p.records())
    if (r.kind == pack::RecordKind::kLayer) {
      largest = std::max(largest, r.size);
      layers_end = std::max(layers_end, r.offset + r.size);
    }
  if (o.ring_slots < 2 || o.ring_slots > 64)
    return Status::usage("--ring-slots must be in 2..64 (the engine reads ahead at most a few "
                         "layers)");
  std::vector<io::AlignedBuffer> slots(static_cast<size_t>(o.ring_slots));
  for (auto& s : slots) {
    KTIER_ASSIGN_OR_RETURN(s, io::AlignedBuffer::allocate(largest, io::kDefaultAlignment,
                                                          io::HugePages::kYes));
  }
  if (o.raw_block_mib < 1) return Status::usage("--raw-block-mib must be >= 1");
  KTIER_ASSIGN_OR_RETURN(io::AlignedBuffer raw_buf,
                         io::AlignedBuffer::allocate(o.raw_block_mib << 20, io::kDefaultAlignment,
                                                     io::HugePages::kYes));
  double raw = 0, eng = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < o.passes; ++i) {
    std::fprintf(stderr, "[bench] pass %d/%d\n", i + 1, o.passes);
    KTIER_ASSIGN_OR_RETURN(const double r, raw_read_gbps(f, raw_buf, layers_end));
    KTIER_ASSIGN_OR_RETURN(const double e, engine_pass(p, *engine, f, slots, &bytes));
    raw = std::max(raw, r);
    eng = std::max(eng, e);
  }
  std::printf("ktier bench io: %s (%.1f MB of layer records), %s, %s\n", p.pack_path().c_str(),
              bytes / 1e6, engine->name(),
              f.direct() ? "O_DIRECT" : "BUFFERED (no O_DIRECT here: both read the page cache)");
  std::printf("raw sequential  %8.2f GB/s\nengine stream   %8.2f GB/s\nratio           %8.3f  (goal >= 0.90)\n",
              raw, eng, eng / raw);
  if (!o.json.empty()) {
    const nlohmann::json j{{"engine_gbps", eng}, {"raw_gbps", raw}, {"ratio", eng / raw},
                           {"direct", f.direct()}, {"io_engine", engine->name()},
                           {"bytes", bytes}, {"passes", o.passes}, {"ring_slots", o.ring_slots}};
    KTIER_RETURN_IF_ERROR(io::write_output_file(o.json, json_output_text(j)));
  }
  return Status::ok();
}

}  // namespace

Result<double> raw_read_gbps(const io::ReadFile& f, io::AlignedBuffer& buf, uint64_t bytes) {
  const uint64_t end = std::min(bytes, f.size());
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t off = 0;
  while (off < end) {
    const uint64_t want = std::min<uint64_t>(buf.size(), end - off);
    const ssize_t n = ::pread(f.fd(), buf.data(), io::align_up(want, f.alignment()),
                              static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;  // before the message's allocations
      return Status::runtime(f.path() + ": read failed at offset " + std::to_string(off) + ": " +
                             io::errno_text(err));
    }
    if (n == 0)
      return Status::runtime(f.path() + ": ends at offset " + std::to_string(off) + ", before " +
                             std::to_string(f.size()) + " bytes (did it shrink?)");
    // A short direct read mid-file goes on from the aligned offset below where it ended (a
    // direct read must start aligned; the bytes between are read again, a negligible share).
    const uint64_t got = static_cast<uint64_t>(n);
    const uint64_t step = off + got >= end || !f.direct()
                              ? got
                              : got / f.alignment() * f.alignment();
    if (step == 0)
      return Status::runtime(f.path() + ": direct reads at offset " + std::to_string(off) +
                             " return less than one block (" + std::to_string(got) + " bytes)");
    off += step;
  }
  return static_cast<double>(end) / seconds(t0) / 1e9;
}

void register_bench_io_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<IoBenchOptions>();
  auto* sub = bench.add_subcommand(
      "io", "Trunk streaming through the I/O engine vs plain sequential O_DIRECT reads of the same "
            "layer records");
  sub->add_option("--pack", o->pack, "Trunk pack folder (ktier pack)")->required();
  sub->add_option("--passes", o->passes, "Passes of each; the best is kept")->capture_default_str();
  sub->add_option("--io", o->io, "auto, uring or pread")->capture_default_str();
  sub->add_option("--ring-slots", o->ring_slots,
                  "Slots of the streaming ring, 2..64 (TrunkStore's ring: 2); all but one have a "
                  "read in flight")
      ->capture_default_str();
  sub->add_option("--raw-block-mib", o->raw_block_mib,
                  "Block size of the raw sequential reads (at least 1)")
      ->capture_default_str()
      ->transform(whole_number<uint64_t>(kMaxBenchMib));
  sub->add_option("--json", o->json, "Also write the figures to FILE as JSON");
  sub->callback([o, &exit_code] { exit_code = finish(run_io_bench(*o)); });
}

}  // namespace ktier::cli
