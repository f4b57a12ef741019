// The trunk pack (src/pack): `ktier pack` of synthetic tiny checkpoints, read back both with
// TrunkPack and independently (raw shard headers, the manifest as plain JSON, xxh3 recomputed),
// then damaged in every way the reader must catch.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <csignal>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/run_process.h"
#include "common/test_paths.h"
#include "format/checkpoint.h"
#include "pack/pack_writer.h"
#include "pack/trunk_pack.h"
#include "synth/synth.h"
#include "synth/synth_test_util.h"

namespace ktier::pack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

synth::SynthOptions tiny(const fs::path& dir, uint64_t seed, synth::ExpertFormat experts) {
  synth::SynthOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.seed = seed;
  o.experts = experts;
  o.threads = 2;
  return o;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

void flip_byte(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Checkpoints written once for the suite: "a" (seed 1, MXFP4), "b" (seed 2, MXFP4), "f" (seed 1,
// plain F32 experts). Each test packs into its own folder under scratch().
class PackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new test::TempDir("pack");
    for (auto [name, seed, fmt] : {std::tuple{"a", 1, synth::ExpertFormat::kMxfp4},
                                   std::tuple{"b", 2, synth::ExpertFormat::kMxfp4},
                                   std::tuple{"f", 1, synth::ExpertFormat::kF32}}) {
      auto r = synth::run_synth(tiny(root_->path() / name, static_cast<uint64_t>(seed), fmt));
      ASSERT_TRUE(r.is_ok()) << r.status().message();
    }
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static fs::path ckpt_dir(const char* name) { return root_->path() / name; }
  static format::Checkpoint open_ckpt(const char* name) {
    auto c = format::Checkpoint::open(ckpt_dir(name));
    EXPECT_TRUE(c.is_ok()) << c.status().message();
    return std::move(c).value();
  }
  fs::path scratch(const std::string& tag) {
    const fs::path p = root_->path() / ("out_" + tag);
    fs::remove_all(p);
    return p;
  }
  static Result<PackReport> pack(const format::Checkpoint& c, const fs::path& out, bool force = false) {
    PackOptions o;
    o.out_dir = out;
    o.force = force;
    o.buffer_bytes = 64 << 10;  // small, so records and tensors straddle buffer flushes
    return write_trunk_pack(c, o);
  }

  static test::TempDir* root_;
};
test::TempDir* PackTest::root_ = nullptr;

// Checks the pack in `out` against the checkpoint in `dir` without trusting the engine's readers:
// shard headers parsed by the test helper, the manifest as plain JSON, xxh3 recomputed.
void expect_exact_pack(const fs::path& dir, const fs::path& out, const TrunkPack& tp, int64_t layers) {
  const std::string packed = test::read_file(out / kPackFileName);
  const json m = json::parse(test::read_file(out / kManifestFileName));
  EXPECT_EQ(m.at("format"), "ktier-trunk-pack");
  EXPECT_EQ(m.at("version"), 1);
  EXPECT_EQ(m.at("alignment"), 4096);
  EXPECT_EQ(m.at("file"), "trunk.pack");
  ASSERT_EQ(m.at("file_size").get<uint64_t>(), packed.size());
  const json& recs = m.at("records");
  ASSERT_EQ(recs.size(), static_cast<size_t>(layers + 2));

  uint64_t expect_offset = 0;
  std::set<std::string> in_pack;
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& r = recs[i];
    const std::string name = i < static_cast<size_t>(layers) ? "layer." + std::to_string(i)
                             : i == static_cast<size_t>(layers) ? "head" : "embed";
    EXPECT_EQ(r.at("name"), name);
    EXPECT_EQ(r.at("layer").is_null(), i >= static_cast<size_t>(layers));
    const uint64_t off = r.at("offset"), size = r.at("size"), bytes = r.at("bytes");
    EXPECT_EQ(off, expect_offset) << name;  // back to back
    EXPECT_EQ(off % 4096, 0u) << name;
    EXPECT_EQ(size % 4096, 0u) << name;
    EXPECT_EQ(size, (bytes + 4095) / 4096 * 4096) << name;
    ASSERT_LE(off + size, packed.size());
    EXPECT_EQ(r.at("xxh3").get<std::string>(), hex64(XXH3_64bits(packed.data() + off, size))) << name;
    EXPECT_TRUE(tp.verify(tp.records().at(i), packed.data() + off).is_ok()) << name;
    // Payload and zero gaps: everything not covered by a tensor is 0.
    std::vector<bool> covered(size, false);
    uint64_t prev_end = 0;
    for (const json& t : r.at("tensors")) {
      const uint64_t toff = t.at("offset"), n = t.at("nbytes");
      EXPECT_EQ(toff % 64, 0u);
      EXPECT_GE(toff, prev_end);
      prev_end = toff + n;
      for (uint64_t k = toff; k < toff + n; ++k) covered[k] = true;
      in_pack.insert(t.at("name").get<std::string>());
    }
    for (uint64_t k = 0; k < size; ++k) {
      if (!covered[k]) {
        ASSERT_EQ(packed[off + k], 0) << name << " byte " << k;
      }
    }
    expect_offset = off + size;
  }
  EXPECT_EQ(expect_offset, packed.size());
  EXPECT_EQ(tp.records().size(), recs.size());
  EXPECT_EQ(tp.head_record().tensors.size(), 4u);
  ASSERT_EQ(tp.embed_record().tensors.size(), 1u);
  EXPECT_EQ(tp.embed_record().tensors[0].name, "language_model.model.embed_tokens.weight");

  // Every checkpoint tensor: experts and non-text tensors absent, everything else byte-equal.
  size_t checked = 0, experts = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const test::RawShard shard = test::read_raw_shard(e.path());
    for (const test::RawTensor& t : shard.tensors) {
      const TensorEntry* te = tp.find(t.name);
      const bool expert = t.name.find(".block_sparse_moe.experts.") != std::string::npos;
      const bool text = t.name.starts_with("language_model.");
      if (expert || !text) {
        EXPECT_EQ(te, nullptr) << t.name;
        EXPECT_EQ(in_pack.count(t.name), 0u) << t.name;
        experts += expert;
        continue;
      }
      ASSERT_NE(te, nullptr) << t.name;
      EXPECT_EQ(std::string(dtype_name(te->dtype)), t.dtype) << t.name;
      EXPECT_EQ(te->shape, t.shape) << t.name;
      ASSERT_EQ(te->nbytes, t.end - t.begin) << t.name;
      const Record& r = tp.records().at(te->record);
      const std::vector<uint8_t> want = test::read_range(e.path(), shard.data_offset() + t.begin, te->nbytes);
      ASSERT_EQ(std::memcmp(packed.data() + r.offset + te->offset, want.data(), want.size()), 0) << t.name;
      if (t.name.starts_with("language_model.model.layers.")) {
        const std::string want_rec = "layer." + t.name.substr(28, t.name.find('.', 28) - 28);
        EXPECT_EQ(r.name, want_rec) << t.name;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, in_pack.size());
  EXPECT_GT(experts, 0u);
}

TEST_F(PackTest, PackHoldsEveryNonExpertTensorExactly) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("exact");
  auto rep = pack(ckpt, out);
  ASSERT_TRUE(rep.is_ok()) << rep.status().message();
  EXPECT_EQ(rep->file_size, fs::file_size(out / kPackFileName));
  EXPECT_EQ(rep->payload_bytes, ckpt.census().trunk.bytes + ckpt.census().embeddings_head.bytes);
  EXPECT_EQ(test::list_dir(out), (std::vector<std::string>{"manifest.json", "trunk.pack"}));
  auto tp = TrunkPack::open(out, ckpt);
  ASSERT_TRUE(tp.is_ok()) << tp.status().message();
  expect_exact_pack(ckpt_dir("a"), out, *tp, ckpt.config().num_hidden_layers);
  std::vector<uint8_t> buf(tp->layer_record(0).size);
  EXPECT_TRUE(tp->read_record(tp->layer_record(0), buf.data()).is_ok());
  // Opened without the checkpoint (`bench io`), the records have the same kinds: the bench
  // streams the layer records only, as the engine's ring does.
  auto unchecked = TrunkPack::open_unchecked(out);
  ASSERT_TRUE(unchecked.is_ok()) << unchecked.status().message();
  ASSERT_EQ(unchecked->records().size(), tp->records().size());
  for (size_t i = 0; i < tp->records().size(); ++i) {
    EXPECT_EQ(unchecked->records()[i].kind, tp->records()[i].kind) << i;
    EXPECT_EQ(unchecked->records()[i].layer, tp->records()[i].layer) << i;
  }
  EXPECT_EQ(tp->records().back().kind, RecordKind::kEmbed);
  EXPECT_EQ(tp->records()[tp->records().size() - 2].kind, RecordKind::kHead);
}

TEST_F(PackTest, FloatExpertCheckpointPacksWithoutExperts) {
  const auto ckpt = open_ckpt("f");
  ASSERT_EQ(ckpt.expert_storage(), format::ExpertStorage::kPlainFloat);
  const fs::path out = scratch("float");
  auto rep = pack(ckpt, out);
  ASSERT_TRUE(rep.is_ok()) << rep.status().message();
  auto tp = TrunkPack::open(out, ckpt);
  ASSERT_TRUE(tp.is_ok()) << tp.status().message();
  expect_exact_pack(ckpt_dir("f"), out, *tp, ckpt.config().num_hidden_layers);
  EXPECT_EQ(tp->find(format::expert_prefix(1, 0) + "w1.weight"), nullptr);
}

TEST_F(PackTest, PackIsDeterministic) {
  const auto ckpt = open_ckpt("a");
  const fs::path o1 = scratch("det1"), o2 = scratch("det2");
  ASSERT_TRUE(pack(ckpt, o1).is_ok());
  PackOptions big;
  // Default 64 MiB buffer: other flush points, same bytes. Folders the pack creates (with a
  // trailing '/') have their entries fsynced up to the one that was there.
  big.out_dir = o2 / "new" / "folders" / "";
  ASSERT_TRUE(write_trunk_pack(ckpt, big).is_ok());
  EXPECT_EQ(test::read_file(o1 / kPackFileName), test::read_file(big.out_dir / kPackFileName));
  EXPECT_EQ(test::read_file(o1 / kManifestFileName),
            test::read_file(big.out_dir / kManifestFileName));
  // Compressed: blocks are cut by the record, not by the threads compressing them.
  std::vector<std::string> packs, manifests;
  for (const int threads : {1, 3}) {
    PackOptions o;
    o.out_dir = scratch("det_z" + std::to_string(threads));
    o.block_size = kMinBlockSize;  // many blocks a record, more than the threads
    o.threads = threads;
    o.buffer_bytes = threads == 1 ? 4096 : uint64_t{1} << 20;
    const auto rep = write_trunk_pack(ckpt, o);
    ASSERT_TRUE(rep.is_ok()) << rep.status().message();
    EXPECT_GT(rep->blocks, 3 * rep->layers);
    packs.push_back(test::read_file(o.out_dir / kPackFileName));
    manifests.push_back(test::read_file(o.out_dir / kManifestFileName));
  }
  EXPECT_EQ(packs[0], packs[1]);
  EXPECT_EQ(manifests[0], manifests[1]);
}

TEST_F(PackTest, FlippedByteFailsVerifyNamingTheRecord) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("flip");
  ASSERT_TRUE(pack(ckpt, out).is_ok());
  {
    auto tp = TrunkPack::open(out, ckpt);
    ASSERT_TRUE(tp.is_ok());
    const Record& r = tp->layer_record(1);
    flip_byte(out / kPackFileName, r.offset + r.tensors.at(2).offset + 5);
  }
  auto tp = TrunkPack::open(out, ckpt);  // sizes are intact: open cannot see it
  ASSERT_TRUE(tp.is_ok()) << tp.status().message();
  const Record& bad = tp->layer_record(1);
  std::vector<uint8_t> buf(bad.size);
  const Status s = tp->read_record(bad, buf.data());
  EXPECT_EQ(s.exit_code(), 3);
  EXPECT_NE(s.message().find((out / kPackFileName).string()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'layer.1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset " + std::to_string(bad.offset)), std::string::npos) << s.message();
  EXPECT_EQ(tp->verify(bad, buf.data()).exit_code(), 3);
  // The damage is local: the other records still verify.
  for (const Record& r : tp->records()) {
    if (&r == &bad) continue;
    buf.resize(r.size);
    EXPECT_TRUE(tp->read_record(r, buf.data()).is_ok()) << r.name;
  }
  // A flipped padding byte is caught too: the checksum covers the whole record.
  const Record& head = tp->head_record();
  ASSERT_LT(head.bytes, head.size);
  flip_byte(out / kPackFileName, head.offset + head.size - 1);
  buf.resize(head.size);
  const Status padding = tp->read_record(head, buf.data());
  EXPECT_EQ(padding.exit_code(), 3);
  EXPECT_NE(padding.message().find(head.name), std::string::npos) << padding.message();
}

TEST_F(PackTest, RefusesToOverwriteWithoutForce) {
  const auto a = open_ckpt("a");
  const auto b = open_ckpt("b");
  const fs::path out = scratch("force");
  ASSERT_TRUE(pack(a, out).is_ok());
  const std::string before = test::read_file(out / kManifestFileName);
  auto again = pack(b, out);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().exit_code(), 2);
  EXPECT_NE(again.status().message().find("--force"), std::string::npos) << again.status().message();
  EXPECT_EQ(test::read_file(out / kManifestFileName), before);
  EXPECT_TRUE(TrunkPack::open(out, a).is_ok());

  auto forced = pack(b, out, /*force=*/true);
  ASSERT_TRUE(forced.is_ok()) << forced.status().message();
  EXPECT_EQ(test::list_dir(out), (std::vector<std::string>{"manifest.json", "trunk.pack"}));
  EXPECT_TRUE(TrunkPack::open(out, b).is_ok());
  EXPECT_EQ(TrunkPack::open(out, a).status().exit_code(), 2);

  // A lone trunk.pack (no manifest) is refused too: it may be the half of a pack.
  fs::remove(out / kManifestFileName);
  EXPECT_EQ(pack(a, out).status().exit_code(), 2);
  EXPECT_EQ(check_pack_output(out / kPackFileName, true).exit_code(), 2);  // a file, not a folder

  // Another tool's manifest.json is not replaced, --force or not (it read as "already holds a
  // trunk pack", and --force wrote over it).
  const fs::path foreign = scratch("foreign");
  fs::create_directories(foreign);
  std::ofstream(foreign / kManifestFileName) << R"({"a": 1})";
  for (const bool force : {false, true}) {
    auto refused = pack(a, foreign, force);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().exit_code(), 2);
    EXPECT_NE(refused.status().message().find("is not a trunk pack's manifest"),
              std::string::npos)
        << refused.status().message();
  }
  EXPECT_EQ(test::read_file(foreign / kManifestFileName), R"({"a": 1})");
}

TEST_F(PackTest, PackOfAnotherCheckpointIsRefused) {
  const auto a = open_ckpt("a");
  const auto b = open_ckpt("b");  // same preset and headers, another seed
  const fs::path out = scratch("other");
  ASSERT_TRUE(pack(a, out).is_ok());
  auto tp = TrunkPack::open(out, b);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_EQ(tp.status().exit_code(), 2);
  EXPECT_NE(tp.status().message().find("pack was made from another checkpoint"), std::string::npos)
      << tp.status().message();
  EXPECT_NE(tp.status().message().find("rerun ktier pack"), std::string::npos);
  const auto f = open_ckpt("f");  // other expert storage: other headers and config
  const Status other = TrunkPack::open(out, f).status();
  EXPECT_EQ(other.exit_code(), 2);
  EXPECT_NE(other.message().find("pack was made from another checkpoint"), std::string::npos)
      << other.message();
}

// A trunk tensor rewritten in place (every value negated: a layer edited or retrained) makes the
// pack stale: refused, not decoded with the old weights. The shard windows alone missed it.
TEST_F(PackTest, PackOfACheckpointEditedInPlaceIsRefused) {
  const fs::path edited = root_->path() / "edited";
  fs::remove_all(edited);
  fs::copy(ckpt_dir("a"), edited);
  const fs::path out = scratch("edited");
  {
    auto c = format::Checkpoint::open(edited);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    ASSERT_TRUE(pack(*c, out).is_ok());
  }
  const std::string name = "language_model.model.layers.1.self_attn.o_proj.weight";
  uint64_t offset = 0, nbytes = 0;
  fs::path shard;
  {
    auto c = format::Checkpoint::open(edited);
    ASSERT_TRUE(c.is_ok());
    const auto loc = c->find(name);
    ASSERT_TRUE(loc.has_value());
    offset = loc->info->file_offset;
    nbytes = loc->info->nbytes;
    shard = c->shard(loc->shard).path();
  }
  {
    std::fstream f(shard, std::ios::binary | std::ios::in | std::ios::out);
    std::vector<char> bytes(nbytes);
    f.seekg(static_cast<std::streamoff>(offset));
    f.read(bytes.data(), static_cast<std::streamsize>(nbytes));
    for (size_t i = 1; i < bytes.size(); i += 2) bytes[i] = static_cast<char>(bytes[i] ^ 0x80);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(bytes.data(), static_cast<std::streamsize>(nbytes));
  }
  auto c = format::Checkpoint::open(edited);
  ASSERT_TRUE(c.is_ok());
  const auto tp = TrunkPack::open(out, *c);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_EQ(tp.status().exit_code(), 2);
  EXPECT_NE(tp.status().message().find("holds other bytes"), std::string::npos)
      << tp.status().message();
}

TEST_F(PackTest, TruncatedPackIsRefusedAtOpen) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("trunc");
  ASSERT_TRUE(pack(ckpt, out).is_ok());
  fs::resize_file(out / kPackFileName, fs::file_size(out / kPackFileName) - 4096);
  auto tp = TrunkPack::open(out, ckpt);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_EQ(tp.status().exit_code(), 3);
  EXPECT_NE(tp.status().message().find((out / kPackFileName).string()), std::string::npos)
      << tp.status().message();
  fs::remove(out / kPackFileName);
  const Status missing = TrunkPack::open(out, ckpt).status();
  EXPECT_EQ(missing.exit_code(), 3);
  EXPECT_NE(missing.message().find(kPackFileName), std::string::npos) << missing.message();
  // A FIFO or a folder in its place: said so (file_size() would only say "Operation not
  // supported"), and the FIFO is not opened (no writer would ever come).
  ASSERT_EQ(::mkfifo((out / kPackFileName).c_str(), 0644), 0);
  tp = TrunkPack::open(out, ckpt);
  EXPECT_EQ(tp.status().exit_code(), 3);
  EXPECT_NE(tp.status().message().find("not a regular file"), std::string::npos)
      << tp.status().message();
  fs::remove(out / kPackFileName);
  fs::create_directory(out / kPackFileName);
  EXPECT_NE(TrunkPack::open(out, ckpt).status().message().find("not a regular file"),
            std::string::npos);
}

TEST_F(PackTest, InterruptedWriteIsNotAPack) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("interrupted");
  fs::create_directories(out);
  // What a killed `ktier pack` leaves: partial files, no manifest.json.
  write_text(out / ".trunk.pack.partial", std::string(8192, 'x'));
  write_text(out / ".manifest.json.partial", "{\"format\"");
  auto tp = TrunkPack::open(out, ckpt);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_EQ(tp.status().exit_code(), 3);
  EXPECT_NE(tp.status().message().find("manifest.json"), std::string::npos) << tp.status().message();
  // Partial files do not block a new pack, and are replaced by it.
  ASSERT_TRUE(pack(ckpt, out).is_ok());
  EXPECT_EQ(test::list_dir(out), (std::vector<std::string>{"manifest.json", "trunk.pack"}));
  EXPECT_TRUE(TrunkPack::open(out, ckpt).is_ok());
  // A partial name that is a symlink is removed, never written through (it could name a shard).
  const fs::path victim = scratch("victim.bin");
  write_text(victim, "keep me");
  for (const char* name : {".trunk.pack.partial", ".manifest.json.partial"})
    fs::create_symlink(victim, out / name);
  ASSERT_TRUE(pack(ckpt, out, true).is_ok());
  EXPECT_EQ(test::read_file(victim), "keep me");
  EXPECT_EQ(test::list_dir(out), (std::vector<std::string>{"manifest.json", "trunk.pack"}));
}

// A write that fails partway (the file size limit stands in for a full disk: EFBIG) exits 1
// naming the partial file, removes it, and leaves the pack --force was replacing as it was.
TEST_F(PackTest, AWriteFailingPartwayLeavesTheOldPack) {
  const auto a = open_ckpt("a");
  const auto b = open_ckpt("b");
  const fs::path out = scratch("failing");
  ASSERT_TRUE(pack(a, out).is_ok());
  const std::string manifest = test::read_file(out / kManifestFileName);
  struct rlimit was {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &was), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  struct rlimit small = was;
  small.rlim_cur = 1 << 20;  // the tiny pack is ~3 MB
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto failed = pack(b, out, /*force=*/true);
  ::setrlimit(RLIMIT_FSIZE, &was);
  std::signal(SIGXFSZ, previous_handler);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().exit_code(), 1);
  EXPECT_NE(failed.status().message().find(".trunk.pack.partial"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(test::list_dir(out), (std::vector<std::string>{"manifest.json", "trunk.pack"}));
  EXPECT_EQ(test::read_file(out / kManifestFileName), manifest);
  EXPECT_TRUE(TrunkPack::open(out, a).is_ok());
}

// A second writer into a folder is refused (exit 1) before it touches anything: it used to remove
// the first's partial as stale, and the first then published the second's half-written file.
TEST_F(PackTest, ASecondWriterIntoTheFolderIsRefused) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("locked");
  fs::create_directories(out);
  write_text(out / ".trunk.pack.partial", "the first writer's bytes");
  const int held = ::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  auto second = pack(ckpt, out, /*force=*/true);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().exit_code(), 1);
  EXPECT_NE(second.status().message().find(out.string() + ": another ktier pack is writing"),
            std::string::npos)
      << second.status().message();
  EXPECT_EQ(test::read_file(out / ".trunk.pack.partial"), "the first writer's bytes");
  ::close(held);  // the first ended: the folder is free again
  ASSERT_TRUE(pack(ckpt, out).is_ok());
  EXPECT_TRUE(TrunkPack::open(out, ckpt).is_ok());
}

TEST_F(PackTest, MissingFolderIsUsage) {
  const auto ckpt = open_ckpt("a");
  const Status missing = TrunkPack::open(scratch("nowhere"), ckpt).status();
  EXPECT_EQ(missing.exit_code(), 2);
  EXPECT_NE(missing.message().find("nowhere: not a trunk pack (no such directory)"),
            std::string::npos)
      << missing.message();
}

TEST_F(PackTest, DamagedManifestsAreCorrupt) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("manifest");
  ASSERT_TRUE(pack(ckpt, out).is_ok());
  const fs::path mp = out / kManifestFileName;
  const json good = json::parse(test::read_file(mp));
  auto expect_corrupt = [&](const std::string& text, const std::string& what,
                            const std::string& needle) {
    write_text(mp, text);
    auto tp = TrunkPack::open(out, ckpt);
    ASSERT_FALSE(tp.is_ok()) << what;
    EXPECT_EQ(tp.status().exit_code(), 3) << what << ": " << tp.status().message();
    EXPECT_NE(tp.status().message().find(mp.string()), std::string::npos) << tp.status().message();
    EXPECT_NE(tp.status().message().find(needle), std::string::npos) << tp.status().message();
  };
  // Edits are checked against manifest_xxh3 first; the cases below reseal (seal_manifest) so
  // that the field checks behind it speak.
  const auto seal = [](const json& m) { return seal_manifest(m.dump()); };
  expect_corrupt("{\"format\": ", "cut JSON", "not valid JSON");
  expect_corrupt(good.dump() + std::string(1, '\0') + "junk", "NUL then bytes",
                 "holds a NUL byte at byte");
  {
    // Deep nesting in a small file: copying or dumping it recursed until the stack overflowed.
    std::string text = good.dump();
    text.pop_back();  // the closing brace
    text += ", \"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    expect_corrupt(text, "nested 100000 deep", "nested deeper than");
  }
  {
    // Two tensors of one shape with their names swapped pass every check but the checksum.
    json swapped = good;
    auto& tensors = swapped["records"][0]["tensors"];
    size_t a = 0, b = 0;
    for (size_t x = 0; x < tensors.size() && !b; ++x)
      for (size_t y = x + 1; y < tensors.size() && !b; ++y)
        if (tensors[x]["shape"] == tensors[y]["shape"] &&
            tensors[x]["dtype"] == tensors[y]["dtype"])
          a = x, b = y;
    ASSERT_NE(b, 0u) << "no two tensors of one shape in record 0";
    std::swap(tensors[a]["name"], tensors[b]["name"]);
    expect_corrupt(swapped.dump(), "names swapped", "does not match its manifest_xxh3");
    json unsealed = good;
    unsealed.erase("manifest_xxh3");
    expect_corrupt(unsealed.dump(), "no checksum", "no \"manifest_xxh3\"");
    write_text(mp, good.dump(3));  // whitespace is not part of the canonical form
    const auto reopened = TrunkPack::open(out, ckpt);
    EXPECT_TRUE(reopened.is_ok()) << reopened.status().message();
  }
  expect_corrupt("[]", "an array", "not an object");
  json j = good;
  j["version"] = 3;
  expect_corrupt(seal(j), "version 3", "version 3");
  j["version"] = 2;  // compressed packs name their compression
  expect_corrupt(seal(j), "version 2 without compression", "no \"compression\"");
  j["compression"] = {{"codec", "zstd"}, {"planes", "bf16-split"}, {"block_size", 4096}};
  j["records"][0]["blocks"] = json::array();  // blocks must inflate to the record's size
  j["records"][0]["stored_size"] = 0;
  expect_corrupt(seal(j), "no blocks", "blocks inflate to 0 bytes");
  j["records"][0]["blocks"] = {{{"offset", 4096}, {"length", 100}, {"inflated", 4096}, {"xxh3", "0000000000000000"}}};
  expect_corrupt(seal(j), "misplaced block", "block 0: offset 4096");
  j["records"][0]["blocks"][0]["offset"] = j["records"][0]["offset"];
  j["records"][0]["blocks"][0]["inflated"] = 8192;
  expect_corrupt(seal(j), "block above the block size", "is impossible");
  j = good;
  j["records"][0]["blocks"] = json::array();
  expect_corrupt(seal(j), "blocks in version 1", "version-1 pack");
  j = good;
  j["format"] = "something";
  expect_corrupt(seal(j), "format", "format");
  j = good;
  j["records"][1]["offset"] = j["records"][0]["offset"];
  expect_corrupt(seal(j), "overlap", "overlaps");
  j = good;
  j["records"][0]["offset"] = 100;
  expect_corrupt(seal(j), "misaligned record", "multiple of 4096");
  j = good;
  j["records"].back()["offset"] = j["file_size"].get<uint64_t>();
  expect_corrupt(seal(j), "record past the end", "outside");
  j = good;  // the last tensor where it belongs, running a byte past its record's end
  {
    json& r = j["records"][0];
    const uint64_t bytes = r["bytes"].get<uint64_t>() - 1;
    ASSERT_EQ((bytes + 4095) / 4096 * 4096, r["size"].get<uint64_t>()) << "the size changes too";
    r["bytes"] = bytes;
    expect_corrupt(seal(j), "tensor outside its record", "outside the record");
  }
  j = good;  // 64 bytes of gap before the last tensor: the record's bytes grown to hold it
  {
    json& r = j["records"][0];
    json& last = r["tensors"].back();
    last["offset"] = last["offset"].get<uint64_t>() + 64;
    r["bytes"] = r["bytes"].get<uint64_t>() + 64;
    r["size"] = (r["bytes"].get<uint64_t>() + 4095) / 4096 * 4096;
    expect_corrupt(seal(j), "a gap between tensors",
                   "is not at " + std::to_string(last["offset"].get<uint64_t>() - 64) +
                       " (the first multiple of 64 after the tensor before it)");
  }
  j = good;
  j["records"][0]["tensors"][0]["shape"] = json::array({7});
  expect_corrupt(seal(j), "nbytes vs shape", "nbytes");
  j = good;
  j["records"][0]["xxh3"] = "xyz";
  expect_corrupt(seal(j), "bad checksum text", "16 lower-case hex digits");
  j = good;
  std::string upper = j["records"][0]["xxh3"].get<std::string>();
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  ASSERT_NE(upper, j["records"][0]["xxh3"].get<std::string>()) << "no hex letter to raise";
  j["records"][0]["xxh3"] = upper;
  expect_corrupt(seal(j), "upper-case checksum", "16 lower-case hex digits");
  j = good;
  j["records"][0]["tensors"].erase(j["records"][0]["tensors"].size() - 1);
  j["records"][0]["bytes"] = j["records"][0]["tensors"].back()["offset"].get<uint64_t>() +
                             j["records"][0]["tensors"].back()["nbytes"].get<uint64_t>();
  j["records"][0]["size"] = (j["records"][0]["bytes"].get<uint64_t>() + 4095) / 4096 * 4096;
  expect_corrupt(seal(j), "a tensor missing", "lacks tensor");
  j = good;
  j["records"][1]["layer"] = 2;
  expect_corrupt(seal(j), "a wrong layer", "record 'layer.1' has layer 2, expected 1");
  j["records"][1]["layer"] = nullptr;
  expect_corrupt(seal(j), "a null layer", "record 'layer.1' has layer null, expected 1");
  j["records"][1]["layer"] = -1;  // not read as null
  expect_corrupt(seal(j), "a negative layer", "layer is -1, expected an integer 0..4095 or null");
  j = good;
  j["records"][0]["tensors"][0]["shape"] = json::array({uint64_t{1} << 32, uint64_t{1} << 32, 16});
  expect_corrupt(seal(j), "a shape whose element count wraps", "more than 2^48 elements");
  j = good;
  std::swap(j["records"][0]["tensors"][0]["name"], j["records"][1]["tensors"][0]["name"]);
  expect_corrupt(seal(j), "a tensor in the wrong record", "not a non-expert tensor of that record");
  write_text(mp, good.dump());
  EXPECT_TRUE(TrunkPack::open(out, ckpt).is_ok());
}

// A compressed pack records the largest block it holds as block_size (readers size their inflate
// scratch by it), not the --block-size asked for; a manifest saying otherwise is corrupt.
TEST_F(PackTest, CompressedBlockSizeIsTheLargestBlock) {
  const auto ckpt = open_ckpt("a");
  const fs::path out = scratch("blocks");
  PackOptions o;
  o.out_dir = out;
  o.block_size = uint64_t{64} << 20;  // larger than any record of the tiny model
  ASSERT_TRUE(write_trunk_pack(ckpt, o).is_ok());
  const fs::path mp = out / kManifestFileName;
  json m = json::parse(test::read_file(mp));
  uint64_t largest = 0;
  for (const json& r : m.at("records"))
    if (r.contains("blocks"))
      for (const json& b : r.at("blocks"))
        largest = std::max(largest, b.at("inflated").get<uint64_t>());
  ASSERT_GT(largest, 0u);
  EXPECT_LT(largest, o.block_size);
  EXPECT_EQ(m.at("compression").at("block_size").get<uint64_t>(), std::max(largest, kMinBlockSize));
  EXPECT_TRUE(TrunkPack::open(out, ckpt).is_ok());
  m["compression"]["block_size"] = o.block_size;
  write_text(mp, seal_manifest(m.dump()));
  const auto tp = TrunkPack::open(out, ckpt);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_EQ(tp.status().exit_code(), 3);
  EXPECT_NE(tp.status().message().find("is not the largest block's inflated size"),
            std::string::npos) << tp.status().message();
}

TEST_F(PackTest, CommandLine) {
  const fs::path bin = test::ktier_bin();
  ASSERT_TRUE(fs::exists(bin)) << "no ktier binary at " << bin;
  const fs::path out = scratch("cli");
  const std::string base = bin.string() + " pack -m " + ckpt_dir("a").string() + " -o " + out.string();
  auto r = test::run_process(base + " -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("trunk.pack"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;  // -q: no progress
  r = test::run_process(base + " -q");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = test::run_process(base + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("pack:"), std::string::npos) << r.err;  // the progress line
  const auto ckpt = open_ckpt("a");
  EXPECT_TRUE(TrunkPack::open(out, ckpt).is_ok());
  r = test::run_process(bin.string() + " pack -q -m " + (root_->path() / "missing").string() + " -o " +
                        scratch("cli2").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

}  // namespace
}  // namespace ktier::pack
