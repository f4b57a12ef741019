#pragma once
// The CSV files `ktier trace replay --csv` writes, read back in tests: comma-separated fields
// without quoting, the first line the header.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace ktier::test {

// One map per row, keyed by the header's names. A row whose field count is not the header's is
// a test failure (and keeps the fields both have).
inline std::vector<std::map<std::string, std::string>> read_csv(
    const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const auto fields = [](const std::string& line) {
    std::vector<std::string> out;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) out.push_back(f);
    return out;
  };
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = fields(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = fields(line);
    EXPECT_EQ(f.size(), header.size()) << line;
    std::map<std::string, std::string>& row = rows.emplace_back();
    for (size_t i = 0; i < std::min(f.size(), header.size()); ++i) row[header[i]] = f[i];
  }
  return rows;
}

}  // namespace ktier::test
