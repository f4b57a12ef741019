// The .ktrace writer/reader (round trip, every corruption is an exit-3 Status naming the file)
// and the conformance int32-pair converter on small hand-made files.
#include "strata/trace_format.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "strata/conformance_trace.h"
#include "strata/replay.h"
#include "strata/trace_summary.h"

namespace ktier::strata {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  static const test::TempDir dir("strata");  // removed at exit
  return dir.path() / name;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A small model: 5 layers (MoE from 1), 12 experts, top-3, lookahead depth 2, weights recorded.
Trace make_trace(uint32_t tokens) {
  Trace t;
  t.header.num_layers = 5;
  t.header.first_moe_layer = 1;
  t.header.experts_per_layer = 12;
  t.header.top_k = 3;
  t.header.lookahead_depth = 2;
  t.header.expert_bytes = 1000;
  t.header.flags = kTraceFlagWeights;
  for (uint32_t tok = 0; tok < tokens; ++tok) {
    for (uint16_t layer = 1; layer < 5; ++layer) {
      TraceStep s;
      s.pass = tok;
      s.position = tok + 7;
      s.layer = layer;
      for (uint16_t j = 0; j < 3; ++j) {
        s.chosen.push_back({static_cast<uint16_t>((tok * 5 + layer * 3 + j * 4) % 12),
                            0.5f / (j + 1) + tok * 1e-3f});
      }
      for (uint32_t d = 1; d <= 2 && layer + d < 5; ++d) {
        std::vector<ExpertWeight> pred;
        for (uint16_t j = 0; j < d + 1; ++j) {
          pred.push_back({static_cast<uint16_t>((tok + layer + d + j) % 12), 0.25f * j});
        }
        s.predicted.push_back(pred);
      }
      t.steps.push_back(s);
    }
  }
  return t;
}

void expect_same(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.header.version, b.header.version);
  EXPECT_EQ(a.header.num_layers, b.header.num_layers);
  EXPECT_EQ(a.header.first_moe_layer, b.header.first_moe_layer);
  EXPECT_EQ(a.header.experts_per_layer, b.header.experts_per_layer);
  EXPECT_EQ(a.header.top_k, b.header.top_k);
  EXPECT_EQ(a.header.lookahead_depth, b.header.lookahead_depth);
  EXPECT_EQ(a.header.expert_bytes, b.header.expert_bytes);
  EXPECT_EQ(a.header.flags, b.header.flags);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const TraceStep &x = a.steps[i], &y = b.steps[i];
    ASSERT_EQ(x.pass, y.pass) << i;
    ASSERT_EQ(x.position, y.position) << i;
    ASSERT_EQ(x.layer, y.layer) << i;
    ASSERT_EQ(x.chosen.size(), y.chosen.size()) << i;
    for (size_t j = 0; j < x.chosen.size(); ++j) {
      ASSERT_EQ(x.chosen[j].expert, y.chosen[j].expert);
      ASSERT_EQ(x.chosen[j].weight, y.chosen[j].weight);  // bit-exact float round trip
    }
    ASSERT_EQ(x.predicted.size(), y.predicted.size()) << i;
    for (size_t d = 0; d < x.predicted.size(); ++d) {
      ASSERT_EQ(x.predicted[d].size(), y.predicted[d].size());
      for (size_t j = 0; j < x.predicted[d].size(); ++j) {
        ASSERT_EQ(x.predicted[d][j].expert, y.predicted[d][j].expert);
        ASSERT_EQ(x.predicted[d][j].weight, y.predicted[d][j].weight);
      }
    }
    ASSERT_EQ(x.refreshed.size(), y.refreshed.size()) << i;
    for (size_t j = 0; j < x.refreshed.size(); ++j) {
      ASSERT_EQ(x.refreshed[j].expert, y.refreshed[j].expert);
      ASSERT_EQ(x.refreshed[j].weight, y.refreshed[j].weight);
    }
  }
}

// make_trace with the refresh flag: a step at layer L carries L - 1 refreshed experts.
Trace make_refresh_trace(uint32_t tokens) {
  Trace t = make_trace(tokens);
  t.header.flags |= kTraceFlagRefresh;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    TraceStep& s = t.steps[i];
    for (uint16_t j = 0; j + 1 < s.layer; ++j)
      s.refreshed.push_back({static_cast<uint16_t>((i + 5 * j) % 12), 0.125f * (j + 1)});
  }
  return t;
}

TEST(TraceFormat, RoundTripAcrossBlocks) {
  const Trace t = make_trace(700);  // 2,800 steps: three blocks (1024, 1024, 752)
  const fs::path p = temp_path("round_trip.ktrace");
  ASSERT_TRUE(write_trace(p, t).is_ok());
  EXPECT_TRUE(looks_like_ktier_trace(p));
  Result<Trace> back = read_trace(p);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  expect_same(t, *back);

  // Streaming reader: blocks of kTraceStepsPerBlock steps, then the footer.
  Result<TraceReader> reader = TraceReader::open(p);
  ASSERT_TRUE(reader.is_ok());
  std::vector<TraceStep> block;
  std::vector<size_t> sizes;
  while (true) {
    Result<bool> more = reader->next_block(block);
    ASSERT_TRUE(more.is_ok()) << more.status().message();
    if (!*more) break;
    sizes.push_back(block.size());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{1024, 1024, 752}));
}

// Steps as wide as the header allows (255 depths of 255 weighted predictions, ~390 KB each):
// the writer closes a block before it passes the 64 MiB readers take, not at 1024 steps.
TEST(TraceFormat, WideStepsCloseBlocksEarly) {
  Trace t;
  t.header.num_layers = 2;
  t.header.first_moe_layer = 0;
  t.header.experts_per_layer = 256;
  t.header.top_k = 255;
  t.header.lookahead_depth = 255;
  t.header.expert_bytes = 1000;
  t.header.flags = kTraceFlagWeights;
  for (uint32_t tok = 0; tok < 200; ++tok) {
    TraceStep s;
    s.pass = tok;
    s.position = tok;
    s.layer = 0;
    for (uint16_t e = 0; e < 255; ++e) s.chosen.push_back({e, 1.0f});
    s.predicted.assign(255, s.chosen);
    t.steps.push_back(std::move(s));
  }
  const fs::path p = temp_path("wide.ktrace");
  ASSERT_TRUE(write_trace(p, t).is_ok());
  ASSERT_GT(fs::file_size(p), uint64_t{kTraceMaxBlockPayload});
  Result<TraceReader> reader = TraceReader::open(p);
  ASSERT_TRUE(reader.is_ok()) << reader.status().message();
  std::vector<TraceStep> block;
  std::vector<size_t> sizes;
  for (;;) {
    Result<bool> more = reader->next_block(block);
    ASSERT_TRUE(more.is_ok()) << more.status().message();
    if (!*more) break;
    sizes.push_back(block.size());
  }
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0] + sizes[1], 200u);
  fs::remove(p);
}

TEST(TraceFormat, RefreshListsRoundTripAndAreChecked) {
  const Trace t = make_refresh_trace(300);  // 1,200 steps: two blocks
  const fs::path p = temp_path("refresh.ktrace");
  ASSERT_TRUE(write_trace(p, t).is_ok());
  Result<Trace> back = read_trace(p);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  expect_same(t, *back);
  // Without the flag the same steps take fewer bytes: the list is written only with the flag.
  Trace plain = make_trace(300);
  const fs::path q = temp_path("plain.ktrace");
  ASSERT_TRUE(write_trace(q, plain).is_ok());
  // A count byte per step; layer L's steps hold L - 1 entries of 6 bytes.
  EXPECT_EQ(fs::file_size(p) - fs::file_size(q), 1200u + 6u * 300u * (0 + 1 + 2 + 3));

  Result<TraceWriter> w = TraceWriter::create(temp_path("refresh-reject.ktrace"), plain.header);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->append(t.steps[2]).exit_code(), 2);  // a refresh list, header without the flag
  Result<TraceWriter> wf = TraceWriter::create(temp_path("refresh-reject2.ktrace"), t.header);
  ASSERT_TRUE(wf.is_ok());
  TraceStep s = t.steps[3];
  ASSERT_GE(s.refreshed.size(), 2u);
  s.refreshed[1].expert = s.refreshed[0].expert;  // duplicate
  EXPECT_EQ(wf->append(s).exit_code(), 2);
  s = t.steps[3];
  s.refreshed[0].expert = 12;  // out of range
  EXPECT_EQ(wf->append(s).exit_code(), 2);
}

TEST(TraceFormat, EmptyTraceRoundTrips) {
  Trace t = make_trace(0);
  const fs::path p = temp_path("empty.ktrace");
  ASSERT_TRUE(write_trace(p, t).is_ok());
  Result<Trace> back = read_trace(p);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_TRUE(back->steps.empty());
  // `trace info` on it: no layer range made up from the empty stream.
  const Result<RequestStream> stream = build_request_stream(*back);
  ASSERT_TRUE(stream.is_ok()) << stream.status().message();
  const std::string info =
      format_summary(summarize_trace(*back, *stream), back->header, p.string());
  EXPECT_NE(info.find("MoE layers:       0 (no routing recorded)"), std::string::npos) << info;
}

// `trace info` at K3's scale: the recall-by-layer line of 92 MoE layers (500+ characters) and a
// long path come out whole, not cut at a fixed line buffer.
TEST(TraceFormat, SummaryLinesAreNeverCut) {
  TraceSummary s;
  PredictionQuality q;
  q.depth = 1;
  q.by_layer.resize(93);
  for (size_t l = 1; l < q.by_layer.size(); ++l) q.by_layer[l] = {1, 1, 1};
  s.prediction.push_back(q);
  const std::string path = "/" + std::string(300, 'p') + "/run.ktrace";
  const std::string info = format_summary(s, make_trace(0).header, path);
  EXPECT_NE(info.find("trace:            " + path + "\n"), std::string::npos) << info;
  const size_t at = info.find("  recall by layer %:");
  ASSERT_NE(at, std::string::npos) << info;
  const std::string recall = info.substr(at, info.find('\n', at) - at);
  EXPECT_GT(recall.size(), 500u);
  EXPECT_TRUE(recall.ends_with(" 91:100 92:100")) << recall;
}

void expect_corrupt(const fs::path& p, const std::string& fragment) {
  Result<Trace> r = read_trace(p);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 3) << r.status().message();
  EXPECT_NE(r.status().message().find(p.string()), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(TraceFormat, TruncationIsCorruptNamingTheFile) {
  const fs::path good = temp_path("good.ktrace");
  ASSERT_TRUE(write_trace(good, make_trace(300)).is_ok());  // 1,200 steps: two blocks
  const std::vector<uint8_t> bytes = read_bytes(good);
  const fs::path p = temp_path("truncated.ktrace");
  struct Cut {
    size_t keep;
    const char* fragment;
  };
  const Cut cuts[] = {
      {10, "truncated in the header"},
      {kTraceHeaderBytes, "without its footer"},
      {kTraceHeaderBytes + 2, "truncated"},
      {kTraceHeaderBytes + 10, "truncated in the block header"},
      {kTraceHeaderBytes + 100, "block 0"},
      {bytes.size() - kTraceFooterBytes, "without its footer"},
      {bytes.size() - 5, "truncated in the footer"},
  };
  for (const Cut& c : cuts) {
    SCOPED_TRACE(c.keep);
    write_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + c.keep));
    expect_corrupt(p, c.fragment);
  }
}

TEST(TraceFormat, FlippedBytesAreCorrupt) {
  const fs::path good = temp_path("good2.ktrace");
  ASSERT_TRUE(write_trace(good, make_trace(300)).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(good);
  const fs::path p = temp_path("flipped.ktrace");
  struct Flip {
    size_t at;
    const char* fragment;
  };
  const Flip flips[] = {
      {0, "bad magic"},
      {20, "header checksum"},
      {kTraceHeaderBytes + 1, "bad block magic"},
      {kTraceHeaderBytes + kTraceBlockHeaderBytes + 50, "checksum mismatch"},
      {bytes.size() - 20, "footer"},
  };
  for (const Flip& f : flips) {
    SCOPED_TRACE(f.at);
    std::vector<uint8_t> b = bytes;
    b[f.at] ^= 0x5A;
    write_bytes(p, b);
    expect_corrupt(p, f.fragment);
  }
  std::vector<uint8_t> extra = bytes;
  extra.push_back(0);
  write_bytes(p, extra);
  expect_corrupt(p, "follow the footer");
  // Reserved fields set, with the checksums made to match: a later version's fields, refused.
  const auto reseal = [](std::vector<uint8_t>& b, size_t from, size_t len) {
    const uint64_t sum = XXH64(b.data() + from, len, 0);
    std::memcpy(b.data() + from + len, &sum, 8);  // little-endian host, as the format
  };
  std::vector<uint8_t> header = bytes;
  header[48] = 1;
  reseal(header, 0, 56);
  write_bytes(p, header);
  expect_corrupt(p, "(reserved) are not 0");
  std::vector<uint8_t> footer = bytes;
  const size_t foot = footer.size() - kTraceFooterBytes;
  footer[foot + 4] = 1;
  reseal(footer, foot, 24);
  write_bytes(p, footer);
  expect_corrupt(p, "footer reserved field is not 0");
  // Flags bit 0 cleared (no weights recorded) in a trace that holds weights: refused, not read
  // as unweighted routing.
  std::vector<uint8_t> unweighted = bytes;
  unweighted[36] &= static_cast<uint8_t>(~kTraceFlagWeights);
  reseal(unweighted, 0, 56);
  write_bytes(p, unweighted);
  expect_corrupt(p, "but the header says no weights were recorded");
  // 65,535 layers x 65,535 experts: valid fields each, a key space no replay could hold.
  std::vector<uint8_t> huge = bytes;
  for (const size_t at : {size_t{16}, size_t{24}}) {
    huge[at] = huge[at + 1] = 0xFF;
    huge[at + 2] = huge[at + 3] = 0;
  }
  reseal(huge, 0, 56);
  write_bytes(p, huge);
  expect_corrupt(p, "(layer, expert) keys a trace may name");
}

// A block's framing that disagrees with its payload, whose checksum still matches: the step
// count of block 0 set to 0, one too few, one too many, and a footer counting one block more.
TEST(TraceFormat, BlockFramingAtOddsWithItsStepsIsCorrupt) {
  const fs::path good = temp_path("good3.ktrace");
  ASSERT_TRUE(write_trace(good, make_trace(300)).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(good);
  const fs::path p = temp_path("framing.ktrace");
  const size_t count_at = kTraceHeaderBytes + 4;
  uint32_t steps = 0;
  std::memcpy(&steps, bytes.data() + count_at, 4);
  ASSERT_GT(steps, 1u);
  const struct {
    uint32_t step_count;
    const char* fragment;
  } counts[] = {
      {0, "block 0 (byte offset 64): implausible block size (0 steps"},
      {steps - 1, "block 0 (byte offset 64): payload has bytes after its last step"},
      {steps + 1, ": block payload ends inside the step"},
  };
  for (const auto& c : counts) {
    SCOPED_TRACE(c.step_count);
    std::vector<uint8_t> b = bytes;
    std::memcpy(b.data() + count_at, &c.step_count, 4);
    write_bytes(p, b);
    expect_corrupt(p, c.fragment);
  }
  std::vector<uint8_t> b = bytes;
  const size_t foot = b.size() - kTraceFooterBytes;
  ++b[foot + 8];
  const uint64_t sum = XXH64(b.data() + foot, 24, 0);
  std::memcpy(b.data() + foot + 24, &sum, 8);
  write_bytes(p, b);
  expect_corrupt(p, "footer counts (3 blocks, 1200 steps) do not match the file (2 blocks");
}

// A read that fails is the disk's fault, not the file's: exit 1 naming the file and the error,
// not "truncated" (exit 3). /proc/self/mem is a regular file whose read at offset 0 fails (EIO).
TEST(TraceFormat, AReadErrorIsARuntimeErrorNotATruncatedFile) {
  {  // where /proc is emulated (gVisor) its read may not fail: nothing to test there
    const int fd = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    char byte;
    const bool eio = fd >= 0 && ::pread(fd, &byte, 1, 0) < 0 && errno == EIO;
    if (fd >= 0) ::close(fd);
    if (!eio) GTEST_SKIP() << "/proc/self/mem at offset 0 does not fail with EIO here";
  }
  Result<TraceReader> r = TraceReader::open("/proc/self/mem");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 1) << r.status().message();
  EXPECT_NE(r.status().message().find("/proc/self/mem: cannot read the trace: "),
            std::string::npos)
      << r.status().message();
}

// A path that does not exist is a usage error (exit 2), as for -m, --pack or -f.
TEST(TraceFormat, MissingFileIsUsageErrorNamingIt) {
  Result<Trace> r = read_trace(temp_path("does_not_exist.ktrace"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("does_not_exist.ktrace: no such trace file"),
            std::string::npos) << r.status().message();
}

// A FIFO is not waited for (a fuzzing find: `trace info`, `--profile` hung on one without a
// writer): it reads as empty at once, a usage error naming it; a directory is refused by name.
TEST(TraceFormat, AFifoWithoutAWriterAndADirectoryAreRefusedAtOnce) {
  const std::string fifo = temp_path("no_writer.ktrace");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<Trace> r = read_trace(fifo);
  // Not opened: a FIFO read once would wait for a second writer (the hint after a failed read).
  EXPECT_FALSE(looks_like_ktier_trace(fifo));
  std::filesystem::remove(fifo);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("no_writer.ktrace: a pipe that gave no bytes"),
            std::string::npos)
      << r.status().message();
  const std::string dir = temp_path("a_dir.ktrace");
  std::filesystem::create_directories(dir);
  r = read_trace(dir);
  std::filesystem::remove(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("a_dir.ktrace: is a directory, not a file or a pipe"),
            std::string::npos)
      << r.status().message();
}

// A header without the weights flag (converted traces) holds only zero weights: another weight
// is refused by the writer (exit 2) as by the reader (FlippedBytesAreCorrupt).
TEST(TraceFormat, WeightsWithoutTheWeightsFlagAreRefused) {
  Trace t = make_trace(2);
  t.header.flags &= ~kTraceFlagWeights;
  for (TraceStep& s : t.steps) {
    for (ExpertWeight& e : s.chosen) e.weight = 0.0f;
    for (auto& depth : s.predicted)
      for (ExpertWeight& e : depth) e.weight = 0.0f;
  }
  ASSERT_TRUE(write_trace(temp_path("unweighted.ktrace"), t).is_ok());
  t.steps[3].chosen[1].weight = 0.5f;
  const Status st = write_trace(temp_path("unweighted.ktrace"), t);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("step 3 (chosen)"), std::string::npos) << st.message();
}

// Weights are router scores: a NaN, an infinite or a negative one is refused, naming the step,
// by the writer (so a recording run fails rather than leave a trace no reader takes) and by
// the reader in what it decodes (a chosen weight of block 0's first step, its checksum made
// to match).
TEST(TraceFormat, WeightsThatNoRouterGivesAreRefused) {
  const fs::path good = temp_path("weights-good.ktrace");
  ASSERT_TRUE(write_trace(good, make_trace(2)).is_ok());
  const std::vector<uint8_t> bytes = read_bytes(good);
  const size_t block = kTraceHeaderBytes, payload = block + kTraceBlockHeaderBytes;
  uint64_t payload_bytes = 0;
  std::memcpy(&payload_bytes, bytes.data() + block + 8, 8);
  const size_t k = bytes[payload + 10];
  ASSERT_GE(k, 1u);
  for (const float w : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(), -0.25f}) {
    SCOPED_TRACE(w);
    std::vector<uint8_t> b = bytes;
    std::memcpy(b.data() + payload + 12 + 2 * k, &w, 4);  // the first chosen weight
    const uint64_t sum = XXH64(b.data() + payload, payload_bytes, 0);
    std::memcpy(b.data() + block + 16, &sum, 8);
    const fs::path p = temp_path("weights-read.ktrace");
    write_bytes(p, b);
    expect_corrupt(p, "not a finite number >= 0");
  }
  for (const float w : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(), -0.25f}) {
    for (int where = 0; where < 2; ++where) {
      Trace t = make_trace(2);
      (where == 0 ? t.steps[5].chosen[2] : t.steps[5].predicted[0][0]).weight = w;
      const Status st = write_trace(temp_path("weights.ktrace"), t);
      ASSERT_FALSE(st.is_ok()) << w;
      EXPECT_EQ(st.exit_code(), 2);
      EXPECT_NE(st.message().find(where == 0 ? "step 5 (chosen)" : "step 5 (depth 1)"),
                std::string::npos) << st.message();
      EXPECT_NE(st.message().find("not a finite number >= 0"), std::string::npos);
    }
  }
}

TEST(TraceFormat, WriterRejectsStepsThatDoNotFitTheHeader) {
  const fs::path p = temp_path("reject.ktrace");
  Trace t = make_trace(1);
  Result<TraceWriter> w = TraceWriter::create(p, t.header);
  ASSERT_TRUE(w.is_ok());
  // Each refused for its own reason (exit 2), named.
  const auto refused = [&](const TraceStep& step, const std::string& why) {
    const Status st = w->append(step);
    EXPECT_EQ(st.exit_code(), 2) << why;
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  TraceStep s = t.steps[0];
  s.chosen[1].expert = 12;
  refused(s, "expert 12 is out of range");
  s = t.steps[0];
  s.chosen[1].expert = s.chosen[0].expert;
  refused(s, "is chosen twice");
  s = t.steps[0];
  s.layer = 5;
  refused(s, "layer 5 >= num_layers");
  s = t.steps[0];
  s.predicted.push_back({});
  s.predicted.push_back({});
  refused(s, "prediction depths > lookahead_depth");
  s = t.steps[0];
  s.layer = 0;  // dense (first_moe_layer 1): may predict, never route
  refused(s, "is dense");
  s.chosen.clear();
  EXPECT_TRUE(w->append(s).is_ok());
  EXPECT_TRUE(w->append(t.steps[0]).is_ok());
  EXPECT_TRUE(w->close().is_ok());
  EXPECT_EQ(w->steps_written(), 2u);

  TraceHeader bad = t.header;
  bad.top_k = 13;  // > experts_per_layer
  EXPECT_EQ(TraceWriter::create(p, bad).status().exit_code(), 2);
  // A key space replay could not hold (kMaxTraceKeys): refused by name when written, corrupt
  // when read.
  bad = t.header;
  bad.num_layers = 4096;
  bad.experts_per_layer = 1025;
  const Status big = TraceWriter::create(p, bad).status();
  EXPECT_EQ(big.exit_code(), 2);
  EXPECT_NE(big.message().find("num_layers 4096 x experts_per_layer 1025"), std::string::npos)
      << big.message();
  bad.experts_per_layer = 1024;  // exactly the limit
  EXPECT_TRUE(TraceWriter::create(p, bad).is_ok());
}

// --------------------------------------------------------------------- conformance format

// Writes int32 pairs in the conformance layout: passes over `positions`, layers first..last,
// top_k experts per (layer, position) chosen by a formula.
std::vector<int32_t> conformance_records(const std::vector<int>& positions, int first, int last,
                                         int top_k) {
  std::vector<int32_t> r;
  for (int T : positions) {
    for (int layer = first; layer <= last; ++layer) {
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < top_k; ++j) {
          r.push_back(layer);
          r.push_back((layer * 7 + t * 3 + j) % 20);
        }
      }
    }
  }
  return r;
}

void write_records(const fs::path& p, const std::vector<int32_t>& r) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(r.data()), static_cast<std::streamsize>(r.size() * 4));
}

TEST(ConformanceConverter, InfersPassesAndPositions) {
  const fs::path p = temp_path("small_conf.bin");
  write_records(p, conformance_records({2, 3}, 1, 3, 4));
  ConformanceTraceOptions o;
  o.top_k = 4;
  o.experts_per_layer = 20;
  o.expert_bytes = 99;
  Result<Trace> t = read_conformance_trace(p, o);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->header.num_layers, 4u);
  EXPECT_EQ(t->header.first_moe_layer, 1u);
  EXPECT_EQ(t->header.top_k, 4u);
  EXPECT_EQ(t->header.expert_bytes, 99u);
  EXPECT_EQ(t->header.flags, kTraceFlagConverted);
  ASSERT_EQ(t->steps.size(), 3u * 2 + 3u * 3);
  // Pass 0: layer 1 positions 0,1; layer 2 positions 0,1; ... then pass 1 with 3 positions.
  EXPECT_EQ(t->steps[0].pass, 0u);
  EXPECT_EQ(t->steps[1].position, 1u);
  EXPECT_EQ(t->steps[2].layer, 2u);
  EXPECT_EQ(t->steps[2].position, 0u);
  EXPECT_EQ(t->steps[6].pass, 1u);
  EXPECT_EQ(t->steps[6].layer, 1u);
  EXPECT_EQ(t->steps[8].position, 2u);
  EXPECT_EQ(t->steps[14].layer, 3u);
  EXPECT_EQ(t->steps[14].chosen[3].expert, (3 * 7 + 2 * 3 + 3) % 20);
}

// A top-k above the experts a layer has is a usage error (exit 2), said before any record is
// read (each group would otherwise read as an expert appearing twice: corrupt, exit 3).
TEST(ConformanceConverter, TopKAboveTheExpertsIsAUsageError) {
  const fs::path p = temp_path("topk_conf.bin");
  write_records(p, conformance_records({2, 3}, 1, 3, 4));
  ConformanceTraceOptions o;
  o.top_k = 4;
  o.experts_per_layer = 3;
  Result<Trace> t = read_conformance_trace(p, o);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().exit_code(), 2) << t.status().message();
  EXPECT_NE(t.status().message().find("exceeds experts_per_layer 3"), std::string::npos)
      << t.status().message();
}

TEST(ConformanceConverter, BadInputIsCorruptNamingFileAndRecord) {
  const fs::path p = temp_path("bad_conf.bin");
  ConformanceTraceOptions o;
  o.top_k = 4;
  o.experts_per_layer = 20;
  auto expect_bad = [&](const std::vector<int32_t>& r, const std::string& fragment,
                        size_t extra_bytes = 0) {
    write_records(p, r);
    if (extra_bytes) {
      std::ofstream out(p, std::ios::binary | std::ios::app);
      out.write("\0\0\0\0\0\0\0", static_cast<std::streamsize>(extra_bytes));
    }
    Result<Trace> t = read_conformance_trace(p, o);
    ASSERT_FALSE(t.is_ok()) << fragment;
    EXPECT_EQ(t.status().exit_code(), 3);
    EXPECT_NE(t.status().message().find(p.string()), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(fragment), std::string::npos) << t.status().message();
  };
  const std::vector<int32_t> good = conformance_records({2, 3}, 1, 3, 4);
  expect_bad(good, "not a multiple of 8", 4);
  expect_bad(std::vector<int32_t>(good.begin(), good.end() - 2), "incomplete");
  std::vector<int32_t> r = good;
  r[2 * 5 + 1] = 20;  // record 5: expert out of range
  expect_bad(r, "record 5");
  r = good;
  r[2 * 6] = 2;  // record 6 changes layer inside group 1
  expect_bad(r, "record 6");
  r = good;
  r[2 * 3 + 1] = r[2 * 2 + 1];  // duplicate expert in group 0
  expect_bad(r, "appears twice");
  // A pass whose layer 2 has fewer groups than layer 1.
  std::vector<int32_t> broken = conformance_records({2}, 1, 1, 4);
  const std::vector<int32_t> tail = conformance_records({1}, 2, 3, 4);
  broken.insert(broken.end(), tail.begin(), tail.end());
  expect_bad(broken, "positions");
}

TEST(ConformanceConverter, MissingFileIsUsageErrorNamingIt) {
  Result<Trace> t = read_conformance_trace(temp_path("missing.bin"));
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().exit_code(), 2);
  EXPECT_NE(t.status().message().find("missing.bin: no such file"), std::string::npos)
      << t.status().message();
}

}  // namespace
}  // namespace ktier::strata
