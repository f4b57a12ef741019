// format::count_tensor_values on tensors larger than one 8 MiB read, with one scratch buffer
// kept across tensors of different sizes (as check_tensor_values and the weight scan keep one).
#include "format/value_check.h"

#include <cstring>
#include <gtest/gtest.h>

#include "format/safetensors.h"
#include "format/st_builder.h"

namespace ktier::format {
namespace {

using ktier::test::StTensor;
using ktier::test::TempDir;

constexpr uint64_t kPiece = 8u << 20;

void put_f32_bits(StTensor& t, uint64_t element, uint32_t bits) {
  std::memcpy(t.data.data() + element * 4, &bits, 4);
}

TEST(ValueCheck, CountsAcrossPiecesWithOneScratchBuffer) {
  // 2 pieces and 12 bytes: NaN in the first piece, +Inf in the second, -Inf in the last (short)
  // one.
  const uint64_t big_elements = 2 * kPiece / 4 + 3;
  StTensor big{"big", "F32", {static_cast<int64_t>(big_elements)},
               std::vector<uint8_t>(big_elements * 4, 0), {}};
  put_f32_bits(big, 5, 0x7fc00001u);
  put_f32_bits(big, kPiece / 4 + 100, 0x7f800000u);
  put_f32_bits(big, big_elements - 1, 0xff800000u);
  StTensor small{"small", "BF16", {3}, {0x00, 0x3f, 0x80, 0x7f, 0x00, 0x00}, {}};  // 0.5, +Inf, 0
  StTensor clean{"clean", "F32", {3}, std::vector<uint8_t>(12, 0), {}};
  TempDir dir("value_check");
  const auto path = dir.path() / "x.safetensors";
  ktier::test::write_st_file(path, {small, big, clean});
  auto file = SafetensorsFile::open(path, OpenMode::kPread);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  const auto& ts = file->tensors();
  ASSERT_EQ(ts.size(), 3u);

  std::vector<uint8_t> scratch;
  std::vector<uint64_t> before;
  const auto record = [&](uint64_t done) {
    before.push_back(done);
    return Status::ok();
  };
  TensorValueCounts c_small, c_big, c_clean;
  ASSERT_TRUE(count_tensor_values(*file, ts[0], c_small, scratch, record).is_ok());
  EXPECT_EQ(before, (std::vector<uint64_t>{0}));
  EXPECT_EQ(c_small.inf, 1u);
  EXPECT_EQ(c_small.first_element, 1u);

  before.clear();
  ASSERT_TRUE(count_tensor_values(*file, ts[1], c_big, scratch, record).is_ok());
  EXPECT_EQ(before, (std::vector<uint64_t>{0, kPiece, 2 * kPiece}));
  EXPECT_EQ(scratch.size(), kPiece);
  EXPECT_EQ(c_big.nan, 1u);
  EXPECT_EQ(c_big.inf, 2u);
  EXPECT_EQ(c_big.first_element, 5u);
  EXPECT_TRUE(c_big.first_is_nan);

  // The scratch still holds the big tensor's second piece (its +Inf) behind the last one: only
  // the bytes read count.
  ASSERT_TRUE(count_tensor_values(*file, ts[2], c_clean, scratch).is_ok());
  EXPECT_EQ(c_clean.nan + c_clean.inf, 0u);

  // A before_piece error stops the scan before the piece and is returned.
  TensorValueCounts c_stopped;
  const Status stopped = count_tensor_values(*file, ts[1], c_stopped, scratch, [](uint64_t done) {
    return done > 0 ? Status::interrupted("stop") : Status::ok();
  });
  EXPECT_EQ(stopped.message(), "stop");
  EXPECT_EQ(c_stopped.nan, 1u);
  EXPECT_EQ(c_stopped.inf, 0u);
}

TEST(ValueCheck, CountsPastTheFirstBlocksAtTheirElements) {
  // F16, 3 blocks of the counter's 4096 and a short one: the first finds nothing, +Inf opens the
  // second, NaN closes the last.
  constexpr uint64_t kElements = 3 * 4096 + 5;
  StTensor t{"t", "F16", {static_cast<int64_t>(kElements)}, std::vector<uint8_t>(kElements * 2, 0),
             {}};
  const auto put = [&](uint64_t at, uint16_t bits) {
    std::memcpy(t.data.data() + at * 2, &bits, 2);
  };
  put(4096, 0x7c00);
  put(kElements - 1, 0xfe01);
  TempDir dir("value_check");
  const auto path = dir.path() / "x.safetensors";
  ktier::test::write_st_file(path, {t});
  auto file = SafetensorsFile::open(path, OpenMode::kPread);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  std::vector<uint8_t> scratch;
  TensorValueCounts c;
  ASSERT_TRUE(count_tensor_values(*file, file->tensors()[0], c, scratch).is_ok());
  EXPECT_EQ(c.inf, 1u);
  EXPECT_EQ(c.nan, 1u);
  EXPECT_EQ(c.first_element, 4096u);
  EXPECT_FALSE(c.first_is_nan);
}

}  // namespace
}  // namespace ktier::format
