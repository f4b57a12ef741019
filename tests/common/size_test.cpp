// The one size grammar of the command line (common/size.h).
#include "common/size.h"

#include <gtest/gtest.h>

namespace ktier {
namespace {

TEST(ParseSize, BinaryLettersBinaryAndDecimalUnitsAndPlainBytes) {
  EXPECT_EQ(parse_size("512M").value(), 512ull << 20);
  EXPECT_EQ(parse_size("8G").value(), 8ull << 30);
  EXPECT_EQ(parse_size("8g").value(), 8ull << 30);
  EXPECT_EQ(parse_size("1.5K").value(), 1536u);
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("4096B").value(), 4096u);
  EXPECT_EQ(parse_size("8GiB").value(), 8ull << 30);
  EXPECT_EQ(parse_size("16mib").value(), 16ull << 20);
  EXPECT_EQ(parse_size("8GB").value(), 8'000'000'000u);
  EXPECT_EQ(parse_size("1.5kb").value(), 1500u);
  EXPECT_EQ(parse_size("8e9").value(), 8'000'000'000u);
  EXPECT_EQ(parse_size("0.3").value(), 0u) << "floor of the bytes";
  EXPECT_EQ(parse_size("1T").value(), 1ull << 40);
  EXPECT_EQ(parse_size("1024T").value(), 1ull << 50);
}

TEST(ParseSize, RefusesJunkNamingIt) {
  for (const char* bad : {"", "G", "12Q", "-1G", "1GG", "nanG", "inf", "1e30", "20000000T",
                          "8 G", " 8G", "8XB", "0x10", "+5M", "2048P"}) {
    const Result<uint64_t> r = parse_size(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().exit_code(), 2) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
  EXPECT_EQ(parse_size("8Q", "--vram").status().message().rfind("--vram: '8Q' has an unknown unit", 0),
            0u) << "the flag named first";
}

// format_size prints what parse_size reads back (to the two decimals shown).
TEST(FormatSize, PrintsTheLargestUnitAtOneOrMore) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(1023), "1023 B");
  EXPECT_EQ(format_size(1024), "1.00 KiB");
  EXPECT_EQ(format_size(3584), "3.50 KiB");
  EXPECT_EQ(format_size((1ull << 20) - 1), "1.00 MiB") << "not 1024.00 KiB";
  EXPECT_EQ(format_size(1536ull << 20), "1.50 GiB");
  EXPECT_EQ(format_size(UINT64_MAX), "16.00 EiB");
  for (const uint64_t b : {1024ull, 5'000'000ull, 17'547'264ull, 3ull << 40}) {
    const std::string text = format_size(b);
    std::string compact = text;
    compact.erase(compact.find(' '), 1);  // "3.00 TiB" -> "3.00TiB": parse_size takes no space
    const Result<uint64_t> read = parse_size(compact);
    ASSERT_TRUE(read.is_ok()) << text;
    EXPECT_NEAR(static_cast<double>(read.value()), static_cast<double>(b), b * 0.005) << text;
  }
}

}  // namespace
}  // namespace ktier
