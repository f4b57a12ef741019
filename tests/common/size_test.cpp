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

}  // namespace
}  // namespace ktier
