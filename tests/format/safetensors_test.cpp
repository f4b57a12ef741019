// safetensors reader: conformance st/ and cache/ (README §7, §8) in both open modes, and
// malformed files built byte by byte.
#include "format/map_guard.h"
#include "format/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>

#include <gtest/gtest.h>

#include "common/test_paths.h"
#include "format/st_builder.h"

namespace ktier::format {
namespace {

using ktier::test::conformance_dir;
using ktier::test::StTensor;
using ktier::test::TempDir;

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

// Bytes read with plain iostreams at an absolute offset: the oracle, independent of the reader.
std::vector<uint8_t> bytes_at(const std::filesystem::path& p, uint64_t offset, uint64_t n) {
  std::ifstream in(p, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<uint8_t> out(n);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  EXPECT_EQ(static_cast<uint64_t>(in.gcount()), n);
  return out;
}

// A tensor's bytes through the reader: bytes() in kMap mode (and read() must agree), read() in
// kPread mode.
std::vector<uint8_t> tensor_bytes(const SafetensorsFile& f, const TensorInfo& t) {
  std::vector<uint8_t> via_read(t.nbytes);
  EXPECT_TRUE(f.read(t, via_read.data()).is_ok());
  if (f.mode() == OpenMode::kMap) {
    auto span = f.bytes(t);
    std::vector<uint8_t> via_span(span.begin(), span.end());
    EXPECT_EQ(via_span, via_read);
  }
  return via_read;
}

struct Row {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t numel;
  uint64_t offset, nbytes;
};

class StConformance : public ::testing::TestWithParam<OpenMode> {};

TEST_P(StConformance, Shard1MatchesTheTable) {
  const auto path = conformance_dir() / "st" / "model-00001-of-00002.safetensors";
  auto r = SafetensorsFile::open(path, GetParam());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const SafetensorsFile& f = *r;
  EXPECT_EQ(f.file_size(), 2906u);
  EXPECT_EQ(f.data_offset(), 1030u);
  const std::string X = "language_model.model.layers.0.block_sparse_moe.experts.";
  const std::vector<Row> want = {
      {"plain.f32.2d", DType::kF32, {16, 16}, 256, 1030, 1024},
      {"plain.bf16.1d", DType::kBF16, {128}, 128, 2054, 256},
      {"tricky.f16.1d", DType::kF16, {64}, 64, 2310, 128},
      {"packed.u8.2d", DType::kU8, {7, 32}, 224, 2438, 224},
      {"scalar.f32", DType::kF32, {}, 1, 2662, 4},
      {"empty.f32", DType::kF32, {0, 8}, 0, 2666, 0},
      {"", DType::kU8, {2, 32}, 64, 2666, 64},
      {"", DType::kU8, {2, 32}, 64, 2730, 64},
      {"rank3.f32", DType::kF32, {2, 3, 4}, 24, 2794, 96},
      {"rank4.u8", DType::kU8, {2, 2, 2, 2}, 16, 2890, 16},
  };
  const std::vector<std::string> names = {"plain.f32.2d", "plain.bf16.1d", "tricky.f16.1d",
                                          "packed.u8.2d", "scalar.f32", "empty.f32",
                                          X + "0.w1.weight_packed", X + "1.w1.weight_packed",
                                          "rank3.f32", "rank4.u8"};
  ASSERT_EQ(f.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.numel(), want[i].numel);
    EXPECT_EQ(t.file_offset, want[i].offset);
    EXPECT_EQ(t.nbytes, want[i].nbytes);
    EXPECT_EQ(t.nbytes, static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype));
    EXPECT_EQ(f.find(names[i]), &t);
  }
  EXPECT_EQ(f.find("__metadata__"), nullptr);

  float scalar;
  auto sb = tensor_bytes(f, *f.find("scalar.f32"));
  std::memcpy(&scalar, sb.data(), 4);
  EXPECT_EQ(scalar, 3.5f);

  // BF16 widens to exactly bits << 16; the first six patterns are the documented specials.
  const auto bf = tensor_bytes(f, *f.find("plain.bf16.1d"));
  const uint16_t specials[] = {0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x0080};
  for (size_t i = 0; i < 128; ++i) {
    const uint16_t bits = static_cast<uint16_t>(bf[2 * i] | (bf[2 * i + 1] << 8));
    if (i < 6) {
      EXPECT_EQ(bits, specials[i]) << i;
    }
    EXPECT_EQ(f32_to_bits(bf16_to_f32(bits)), static_cast<uint32_t>(bits) << 16) << i;
  }
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7F80)) && bf16_to_f32(0x7F80) > 0);
  EXPECT_EQ(bf16_to_f32(0x0080), std::ldexp(1.0f, -126));

  // F16 specials, exact.
  const auto h = tensor_bytes(f, *f.find("tricky.f16.1d"));
  auto half = [&](size_t i) { return static_cast<uint16_t>(h[2 * i] | (h[2 * i + 1] << 8)); };
  const uint16_t hs[] = {0x7C00, 0xFC00, 0x7E00, 0x0000, 0x8000, 0x0001, 0x03FF, 0x0400};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(half(i), hs[i]) << i;
  EXPECT_EQ(f16_to_f32(half(0)), INFINITY);
  EXPECT_EQ(f16_to_f32(half(1)), -INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_f32(half(2))));
  EXPECT_EQ(f32_to_bits(f16_to_f32(half(3))), 0x00000000u);
  EXPECT_EQ(f32_to_bits(f16_to_f32(half(4))), 0x80000000u);
  EXPECT_EQ(f16_to_f32(half(5)), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(half(6)), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(half(7)), std::ldexp(1.0f, -14));
  for (size_t i = 8; i < 64; ++i) EXPECT_TRUE(std::isnormal(f16_to_f32(half(i)))) << i;

  // Raw payloads against bytes read independently at the documented offsets.
  for (size_t i = 0; i < want.size(); ++i) {
    const TensorInfo& t = *f.find(names[i]);
    EXPECT_EQ(tensor_bytes(f, t), bytes_at(path, want[i].offset, want[i].nbytes)) << names[i];
  }
}

TEST_P(StConformance, Shard2MatchesTheTable) {
  const auto path = conformance_dir() / "st" / "model-00002-of-00002.safetensors";
  auto r = SafetensorsFile::open(path, GetParam());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const SafetensorsFile& f = *r;
  EXPECT_EQ(f.data_offset(), 261u);
  const std::string weird = "weird\\name.\"with\"quotes";
  ASSERT_EQ(weird.size(), 23u);
  const std::vector<Row> want = {{"second.shard.f32", DType::kF32, {10, 10}, 100, 261, 400},
                                 {"second.shard.u8", DType::kU8, {300}, 300, 661, 300},
                                 {"", DType::kF32, {3}, 3, 961, 12}};
  const std::vector<std::string> names = {"second.shard.f32", "second.shard.u8", weird};
  ASSERT_EQ(f.tensors().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    EXPECT_EQ(t.numel(), want[i].numel);
    EXPECT_EQ(t.file_offset, want[i].offset);
    EXPECT_EQ(t.nbytes, want[i].nbytes);
    EXPECT_EQ(tensor_bytes(f, t), bytes_at(path, want[i].offset, want[i].nbytes));
  }
  ASSERT_NE(f.find(weird), nullptr);
  const auto wb = tensor_bytes(f, *f.find(weird));
  float w[3];
  std::memcpy(w, wb.data(), 12);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 2.0f);
  EXPECT_EQ(w[2], 3.0f);
}

// cache/: 24 experts x 6 tensors; every byte follows README §8.
TEST_P(StConformance, CacheExpertsAreContiguousAndByteExact) {
  const auto path = conformance_dir() / "cache" / "model-00001-of-00001.safetensors";
  auto r = SafetensorsFile::open(path, GetParam());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const SafetensorsFile& f = *r;
  EXPECT_EQ(f.file_size(), 59776u);
  EXPECT_EQ(f.data_offset(), 20608u);
  ASSERT_EQ(f.tensors().size(), 144u);
  const uint64_t run_offsets[6] = {0, 512, 544, 1056, 1088, 1600};
  for (int e = 0; e < 24; ++e) {
    const uint64_t run = 20608 + 1632ull * static_cast<uint64_t>(e);
    std::vector<uint8_t> expected_run;
    for (int part = 0; part < 6; ++part) {
      const int w = part / 2;
      const bool scale = part % 2 == 1;
      const std::string name = "language_model.model.layers.0.block_sparse_moe.experts." +
                               std::to_string(e) + ".w" + std::to_string(w + 1) +
                               (scale ? ".weight_scale" : ".weight_packed");
      const TensorInfo* t = f.find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->dtype, DType::kU8);
      EXPECT_EQ(t->shape, scale ? std::vector<int64_t>({8, 4}) : std::vector<int64_t>({8, 64}));
      EXPECT_EQ(t->file_offset, run + run_offsets[part]) << name;
      const int base = (977 * e + 31 * w + (scale ? 7 : 0)) % 256;
      const auto got = tensor_bytes(f, *t);
      ASSERT_EQ(got.size(), scale ? 32u : 512u);
      for (size_t k = 0; k < got.size(); ++k) {
        const uint8_t want = static_cast<uint8_t>((static_cast<int>(k) + base) % 251);
        ASSERT_EQ(got[k], want) << name << " byte " << k;
        expected_run.push_back(want);
      }
    }
    std::vector<uint8_t> whole(1632);
    ASSERT_TRUE(f.read_bytes(run, whole.size(), whole.data()).is_ok());
    EXPECT_EQ(whole, expected_run) << "expert " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, StConformance,
                         ::testing::Values(OpenMode::kMap, OpenMode::kPread),
                         [](const auto& info) {
                           return info.param == OpenMode::kMap ? std::string("Map")
                                                               : std::string("Pread");
                         });

// ---- malformed files -----------------------------------------------------------------------------

// Writes `bytes` as a shard and opens it; expects exit 3 naming the shard and returns the message.
std::string open_corrupt(const TempDir& dir, const std::vector<uint8_t>& bytes,
                         const std::string& file = "model-00001-of-00001.safetensors") {
  ktier::test::write_bytes(dir.path() / file, bytes);
  for (OpenMode mode : {OpenMode::kMap, OpenMode::kPread}) {
    auto r = SafetensorsFile::open(dir.path() / file, mode);
    EXPECT_FALSE(r.is_ok());
    if (r.is_ok()) return "";
    EXPECT_EQ(r.status().exit_code(), 3) << r.status().message();
    EXPECT_HAS(r.status().message(), file);
    if (mode == OpenMode::kPread) return r.status().message();
  }
  return "";
}

StTensor f32(const std::string& name, std::vector<int64_t> shape) {
  return ktier::test::filled(name, "F32", std::move(shape), 7);
}

TEST(SafetensorsCorrupt, TruncatedConformanceShard) {
  TempDir dir("st_trunc");
  auto bytes = ktier::test::read_all(conformance_dir() / "st" / "model-00001-of-00002.safetensors");
  ASSERT_EQ(bytes.size(), 2906u);
  bytes.resize(bytes.size() - 3);
  const std::string m = open_corrupt(dir, bytes, "model-00001-of-00002.safetensors");
  EXPECT_HAS(m, "truncated");
  EXPECT_HAS(m, "tensor 'rank4.u8'");  // the first tensor that does not fit

  // Cut deeper: now rank3.f32 is the first that does not fit.
  bytes.resize(2800);
  EXPECT_HAS(open_corrupt(dir, bytes, "model-00001-of-00002.safetensors"), "tensor 'rank3.f32'");
}

TEST(SafetensorsCorrupt, OverlappingRanges) {
  TempDir dir("st_overlap");
  auto a = f32("first.tensor", {4});
  auto b = f32("second.tensor", {4});
  b.offsets = std::make_pair(uint64_t{8}, uint64_t{24});  // starts inside first.tensor [0, 16)
  const std::string m = open_corrupt(dir, ktier::test::st_file({a, b}));
  EXPECT_HAS(m, "'first.tensor' [0, 16) and 'second.tensor' [8, 24) overlap");
}

// A path opened again may name another file by now: the engine asks whether its descriptor is
// the file that was checked (a shard replaced by a rename would be read at the old offsets).
TEST(Safetensors, SameFileAsTellsTheCheckedFileFromOneRenamedOverIt) {
  TempDir dir("st_same");
  const auto bytes = ktier::test::st_file({f32("x", {3})});
  const std::filesystem::path path = dir.path() / "a.safetensors",
                              other = dir.path() / "b.safetensors";
  ktier::test::write_bytes(path, bytes);
  ktier::test::write_bytes(other, bytes);
  auto f = SafetensorsFile::open(path, OpenMode::kPread);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const int before = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(before, 0);
  EXPECT_TRUE(f->same_file_as(before));
  std::filesystem::rename(other, path);  // the same bytes, another file
  const int after = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(after, 0);
  EXPECT_FALSE(f->same_file_as(after));
  EXPECT_TRUE(f->same_file_as(before));
  ::close(before);
  ::close(after);
}

// The tensors index the whole data section, without holes (the format's rule): a header length
// a few bytes short still parses (the header ends in padding spaces) but would shift every
// tensor; appended bytes or a gap between tensors are refused the same way.
TEST(SafetensorsCorrupt, DataSectionIsIndexedExactly) {
  TempDir dir("st_cover");
  const auto bytes = ktier::test::st_file({f32("x", {3}), f32("y", {2})}, nullptr, 64);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  ASSERT_EQ(bytes[8 + n - 4], ' ') << "the header ends in padding";
  ktier::test::write_bytes(dir.path() / "ok.safetensors", bytes);
  ASSERT_TRUE(SafetensorsFile::open(dir.path() / "ok.safetensors", OpenMode::kPread).is_ok());
  for (uint64_t shorter : {1, 4}) {
    auto b = bytes;
    for (int i = 0; i < 8; ++i)
      b[static_cast<size_t>(i)] = static_cast<uint8_t>((n - shorter) >> (8 * i));
    EXPECT_HAS(open_corrupt(dir, b),
               "the header length (" + std::to_string(n - shorter) + ") is wrong");
  }
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_HAS(open_corrupt(dir, longer), "but the data section holds");
  auto a = f32("first.tensor", {4});
  auto b = f32("second.tensor", {4});
  b.offsets = std::make_pair(uint64_t{20}, uint64_t{36});  // 4 bytes after first.tensor [0, 16)
  b.data.resize(20);
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_file({a, b})),
             "data bytes [16, 20) belong to no tensor (before 'second.tensor')");
}

TEST(SafetensorsCorrupt, ShapeDoesNotMatchBytes) {
  TempDir dir("st_shape");
  auto t = f32("layer.weight", {3, 4});
  t.shape = {3, 5};
  const std::string m = open_corrupt(dir, ktier::test::st_file({t}));
  EXPECT_HAS(m, "tensor 'layer.weight': shape [3, 5] x F32 needs 60 bytes but data_offsets give 48");
}

TEST(SafetensorsCorrupt, HeaderLengthBeyondFile) {
  TempDir dir("st_hlen");
  const std::string header = ktier::test::st_header({f32("x", {2})});
  const std::string m = open_corrupt(dir, ktier::test::st_raw(header, std::vector<uint8_t>(8), 100000));
  EXPECT_HAS(m, "header length 100000 is beyond the end of the file");
}

TEST(SafetensorsCorrupt, TooShortForHeaderLength) {
  TempDir dir("st_short");
  EXPECT_HAS(open_corrupt(dir, {1, 2, 3}), "too short for the 8-byte header length");
}

TEST(SafetensorsCorrupt, BadJson) {
  TempDir dir("st_json");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw("{\"x\": {\"dtype\": ", {})),
             "header is not valid UTF-8 JSON");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw("[1, 2]", {})),
             "header does not begin with '{'");
  // Invalid UTF-8 in a name.
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw("{\"a\xff\": {}}", {})), "not valid UTF-8 JSON");
}

// The format's padding is spaces; a byte-order mark, NUL padding or bytes after a NUL are
// refused as the reference reader refuses them (nlohmann would skip the BOM and stop at the NUL).
TEST(SafetensorsCorrupt, HeaderIsTheObjectThenSpaces) {
  TempDir dir("st_pad");
  const std::string header = ktier::test::st_header({f32("x", {2})});
  const std::vector<uint8_t> data(8);
  ktier::test::write_bytes(dir.path() / "ok.safetensors",
                           ktier::test::st_raw(header + "  \n\t ", data));
  EXPECT_TRUE(SafetensorsFile::open(dir.path() / "ok.safetensors", OpenMode::kPread).is_ok());
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw("\xef\xbb\xbf" + header, data)),
             "header does not begin with '{'");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(" " + header, data)),
             "header does not begin with '{'");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(header + std::string(3, '\0'), data)),
             "header holds a NUL byte at byte " + std::to_string(8 + header.size()));
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(header + std::string(1, '\0') + "xyz", data)),
             "header holds a NUL byte");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(header + " xyz", data)),
             "header is not valid UTF-8 JSON");
}

// A field given twice reads differently in different parsers (nlohmann and Python keep the last,
// others the first): refused, naming the tensor and the field. Unknown fields may repeat.
TEST(SafetensorsCorrupt, EntryFieldGivenTwice) {
  TempDir dir("st_twice");
  const std::vector<uint8_t> data(8);
  const std::string ok = R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  ktier::test::write_bytes(dir.path() / "ok.safetensors", ktier::test::st_raw(ok, data));
  EXPECT_EQ(SafetensorsFile::open(dir.path() / "ok.safetensors", OpenMode::kPread)
                .status()
                .message(),
            "");
  const std::string extra =
      R"({"x": {"dtype": "F32", "note": 1, "note": 2, "shape": [2], "data_offsets": [0, 8]}})";
  ktier::test::write_bytes(dir.path() / "extra.safetensors", ktier::test::st_raw(extra, data));
  EXPECT_EQ(SafetensorsFile::open(dir.path() / "extra.safetensors", OpenMode::kPread)
                .status()
                .message(),
            "");
  const std::pair<const char*, const char*> cases[] = {
      {"dtype", R"("dtype": "F32", "dtype": "BF16", "shape": [2], "data_offsets": [0, 8])"},
      {"shape", R"("dtype": "F32", "shape": [4], "shape": [2], "data_offsets": [0, 8])"},
      {"data_offsets",
       R"("dtype": "F32", "shape": [2], "data_offsets": [0, 4], "data_offsets": [0, 8])"}};
  for (const auto& [field, fields] : cases) {
    const std::string header = std::string(R"({"x": {)") + fields + "}}";
    EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(header, data)),
               std::string("tensor 'x': \"") + field + "\" given twice");
  }
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  TempDir dir("st_dtype");
  auto t = f32("odd.tensor", {2});
  t.dtype = "I64";
  t.data.resize(16);
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_file({t})), "tensor 'odd.tensor': unknown dtype 'I64'");
}

TEST(SafetensorsCorrupt, RankFive) {
  TempDir dir("st_rank");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_file({f32("deep.tensor", {1, 2, 1, 2, 1})})),
             "tensor 'deep.tensor': rank 5 shape [1, 2, 1, 2, 1]");
}

TEST(SafetensorsCorrupt, EntryShapeAndTypes) {
  TempDir dir("st_entry");
  const std::vector<uint8_t> data(8);
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(
                                   R"({"neg": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data)),
             "tensor 'neg': negative dimension");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"nodt": {"shape": [2], "data_offsets": [0, 8]}})", data)),
             "tensor 'nodt': entry has no \"dtype\"");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"noshape": {"dtype": "F32", "data_offsets": [0, 8]}})", data)),
             "tensor 'noshape': entry has no \"shape\"");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"nooff": {"dtype": "F32", "shape": [2]}})", data)),
             "tensor 'nooff': entry has no \"data_offsets\"");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", data)),
             "tensor 's': \"dtype\" is 5, expected a string");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})", data)),
             "tensor 's': \"shape\" is \"2\", expected an array");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", data)),
             "must hold non-negative integers");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", data)),
             "expected [begin, end]");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", data)),
             "tensor 's': data_offsets [8, 0] has begin > end");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}})", data)),
             "tensor 's': \"dtype\" is an array, expected a string");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [[2]], "data_offsets": [0, 8]}})", data)),
             "tensor 's': \"shape\" must hold non-negative integers, got an array");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}})", data)),
             "tensor 's': negative value -8 in \"data_offsets\"");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"(7)", data)),
             "header does not begin with '{'");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}} x)", data)),
             "header is not valid UTF-8 JSON");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(R"({"s": [1, 2]})", data)),
             "tensor 's': entry is an array, expected an object");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(
                                   R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", data)),
             "header names tensor 'a' more than once");
  // Past 2^48 elements, and a zero does not let a huge dimension after it through: readers
  // multiply dimensions (an MXFP4 scale's columns by 32) in int64.
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(
                                   R"({"s": {"dtype": "U8", "shape": [16777217, 16777216], "data_offsets": [0, 8]}})", data)),
             "tensor 's': shape [16777217, 16777216] is impossibly large");
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_raw(
                                   R"({"s": {"dtype": "U8", "shape": [0, 4611686018427387905], "data_offsets": [0, 0]}})", data)),
             "tensor 's': shape [0, 4611686018427387905] is impossibly large");
  ktier::test::write_bytes(dir.path() / "edge.safetensors",
                           ktier::test::st_raw(R"({"s": {"dtype": "U8", "shape": [0, 281474976710656], "data_offsets": [0, 0]}})", {}));
  const auto edge = SafetensorsFile::open(dir.path() / "edge.safetensors", OpenMode::kPread);
  EXPECT_TRUE(edge.is_ok()) << "2^48 itself is allowed: " << edge.status().message();
}

// ---- valid edge cases -----------------------------------------------------------------------------

TEST(Safetensors, AnyHeaderLengthEmptyTensorsAndMetadata) {
  TempDir dir("st_ok");
  for (size_t pad : {1, 3, 8}) {
    std::vector<StTensor> ts = {f32("a", {3}), f32("empty", {0, 5}), f32("b", {2, 1}),
                                f32("quote\"back\\slash", {1})};
    ts[0].data = ktier::test::f32_bytes({1.0f, 2.0f, 3.0f});
    const ktier::test::ojson metadata = {{"format", "pt"}};
    const auto bytes = ktier::test::st_file(ts, &metadata, pad);
    ktier::test::write_bytes(dir.path() / "x.safetensors", bytes);
    auto r = SafetensorsFile::open(dir.path() / "x.safetensors", OpenMode::kPread);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    ASSERT_EQ(r->tensors().size(), 4u);
    EXPECT_EQ(r->tensors()[1].name, "empty");  // sorts before 'b', which shares its offset
    EXPECT_EQ(r->tensors()[1].file_offset, r->tensors()[2].file_offset);
    ASSERT_NE(r->find("quote\"back\\slash"), nullptr);
    std::vector<uint8_t> a(12);
    ASSERT_TRUE(r->read(*r->find("a"), a.data()).is_ok());
    EXPECT_EQ(a, ts[0].data);
  }
}

// Zero bytes overlap nothing: an empty tensor may sit at any offset inside the data section,
// even inside another tensor's range.
TEST(Safetensors, EmptyTensorsNeverOverlap) {
  TempDir dir("st_empty");
  auto a = f32("a", {4});
  auto inside = f32("inside", {0});
  inside.offsets = std::make_pair(uint64_t{4}, uint64_t{4});
  auto at_end = f32("at_end", {0, 3});
  at_end.offsets = std::make_pair(uint64_t{16}, uint64_t{16});
  ktier::test::write_bytes(dir.path() / "e.safetensors", ktier::test::st_file({a, inside, at_end}));
  auto r = SafetensorsFile::open(dir.path() / "e.safetensors");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->tensors().size(), 3u);
  EXPECT_EQ(r->find("inside")->file_offset, r->data_offset() + 4);
  EXPECT_EQ(r->find("at_end")->nbytes, 0u);
  // ...but an empty tensor past the end of the data section is still out of bounds.
  at_end.offsets = std::make_pair(uint64_t{17}, uint64_t{17});
  EXPECT_HAS(open_corrupt(dir, ktier::test::st_file({a, inside, at_end})), "truncated: tensor 'at_end'");
}

TEST(Safetensors, SkipsMetadataAndUnknownFields) {
  TempDir dir("st_skip");
  const std::vector<uint8_t> data(8);
  ktier::test::write_bytes(
      dir.path() / "m.safetensors",
      ktier::test::st_raw(R"({"__metadata__": {"a": {"nested": [1, {"dtype": 5}]}}, )"
                          R"("t": {"extra": {"x": [1, [2]]}, "dtype": "F32", "shape": [2], )"
                          R"("data_offsets": [0, 8], "more": null}})",
                          data));
  auto r = SafetensorsFile::open(dir.path() / "m.safetensors");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->tensors().size(), 1u);
  EXPECT_EQ(r->tensors()[0].name, "t");
  EXPECT_EQ(r->tensors()[0].shape, (std::vector<int64_t>{2}));
}

TEST(Safetensors, FileOrderFollowsOffsetsNotHeaderOrder) {
  TempDir dir("st_order");
  auto a = f32("zeta", {2});
  auto b = f32("alpha", {2});
  a.offsets = std::make_pair(uint64_t{8}, uint64_t{16});
  b.offsets = std::make_pair(uint64_t{0}, uint64_t{8});
  ktier::test::write_bytes(dir.path() / "o.safetensors", ktier::test::st_file({a, b}));
  auto r = SafetensorsFile::open(dir.path() / "o.safetensors");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->tensors()[0].name, "alpha");
  EXPECT_EQ(r->tensors()[1].name, "zeta");
}

TEST(Safetensors, MissingFileIsAnIoError) {
  auto r = SafetensorsFile::open("/nonexistent/ktier/model.safetensors");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 1);
  EXPECT_HAS(r.status().message(), "/nonexistent/ktier/model.safetensors: cannot open");
}

// A mapped shard that shrinks while in use: touching its lost pages raises SIGBUS, which the
// guard turns into "ktier: error: FILE ..." and exit 1 (runtime), never a crash.
TEST(SafetensorsDeathTest, ShrunkMappedFileExitsOneNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir("st_shrink");
  const std::filesystem::path path = dir.path() / "shrunk.safetensors";
  ktier::test::write_bytes(path, ktier::test::st_file({f32("big", {1 << 16})}));  // 256 KiB
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const std::span<const uint8_t> bytes = r->bytes(*r->find("big"));
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  EXPECT_EXIT(
      {
        // What the exit leaves behind is said after the error (run's trace).
        ktier::format::set_exit_note("ktier: warning: a note after the error\n");
        std::filesystem::remove_all(dir.path());  // the child's own folder: the mapping stays
        uint64_t sum = 0;
        for (size_t i = 0; i < bytes.size(); i += 4096) sum += bytes[i];
        std::printf("%llu\n", static_cast<unsigned long long>(sum));  // never reached
      },
      ::testing::ExitedWithCode(1),
      "ktier: error: .*shrunk\\.safetensors: its bytes at offset [0-9]+ can no longer be "
      "read.*\nktier: warning: a note after the error");
}

TEST(Safetensors, MovedFileKeepsItsMappingAndPointers) {
  auto r = SafetensorsFile::open(conformance_dir() / "st" / "model-00002-of-00002.safetensors");
  ASSERT_TRUE(r.is_ok());
  const TensorInfo* t = r->find("second.shard.u8");
  const auto before = std::vector<uint8_t>(r->bytes(*t).begin(), r->bytes(*t).end());
  SafetensorsFile moved = std::move(r).value();
  EXPECT_EQ(moved.find("second.shard.u8"), t);
  const auto after = moved.bytes(*t);
  EXPECT_EQ(std::vector<uint8_t>(after.begin(), after.end()), before);
}

}  // namespace
}  // namespace ktier::format
