#pragma once
// Helpers for the synth tests: an independent, minimal safetensors header reader (so the tests
// do not depend on the engine's reader) and file utilities.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/temp_dir.h"

namespace ktier::test {

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data-section offsets
};

struct RawShard {
  uint64_t header_len = 0;  // N
  uint64_t file_size = 0;
  bool has_metadata = false;
  std::vector<RawTensor> tensors;  // header order
  uint64_t data_offset() const { return 8 + header_len; }
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline std::vector<uint8_t> read_range(const std::filesystem::path& p, uint64_t offset, uint64_t n) {
  std::ifstream f(p, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  std::vector<uint8_t> out(n);
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  if (static_cast<uint64_t>(f.gcount()) != n) out.clear();
  return out;
}

// Parses the header; members stay in file (header) order. Throws on malformed input, which
// gtest reports as a test failure.
inline RawShard read_raw_shard(const std::filesystem::path& p) {
  RawShard s;
  s.file_size = std::filesystem::file_size(p);
  const std::vector<uint8_t> len = read_range(p, 0, 8);
  for (int i = 0; i < 8; ++i) s.header_len |= static_cast<uint64_t>(len.at(static_cast<size_t>(i))) << (8 * i);
  const std::vector<uint8_t> text = read_range(p, 8, s.header_len);
  const auto header = nlohmann::ordered_json::parse(text.begin(), text.end());
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      s.has_metadata = true;
      continue;
    }
    RawTensor t;
    t.name = name;
    t.dtype = v.at("dtype").get<std::string>();
    t.shape = v.at("shape").get<std::vector<int64_t>>();
    t.begin = v.at("data_offsets").at(0).get<uint64_t>();
    t.end = v.at("data_offsets").at(1).get<uint64_t>();
    s.tensors.push_back(std::move(t));
  }
  return s;
}

inline std::vector<std::string> list_dir(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ktier::test
