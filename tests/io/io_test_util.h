#pragma once
// Helpers for the I/O tests: temporary files with known pseudo-random bytes under /tmp, and
// engines built for one combination of the test matrix (skipping what this kernel lacks).

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/io_engine.h"

namespace ktier::io::test {

// splitmix64: the bytes of a test file are a pure function of (seed, position).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t state = seed;
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = splitmix64(state);
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return out;
}

// A file under /tmp holding `bytes`, removed by the destructor.
class TempFile {
 public:
  TempFile(const std::vector<uint8_t>& bytes, const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = "/tmp/ktier-io-test-" + std::to_string(getpid()) + "-" + tag + "-" +
            std::to_string(counter.fetch_add(1)) + ".bin";
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    EXPECT_TRUE(out.good()) << "cannot write " << path_;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline const char* backend_name(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kUring: return "uring";
    case IoBackend::kPread: return "pread";
  }
  return "?";
}
inline const char* direct_name(DirectMode d) {
  switch (d) {
    case DirectMode::kAuto: return "auto";
    case DirectMode::kDirect: return "direct";
    case DirectMode::kBuffered: return "buffered";
  }
  return "?";
}

// Builds an engine, or explains in `skip_reason` why this combination cannot run here.
inline std::unique_ptr<IoEngine> make_engine_or_skip(const IoOptions& opt, std::string* skip_reason) {
  auto engine = make_io_engine(opt);
  if (!engine.is_ok()) {
    *skip_reason = std::string(backend_name(opt.backend)) +
                   " engine unavailable on this kernel: " + engine.status().message();
    return nullptr;
  }
  return std::move(engine).value();
}

// Opens `path` as the options say, or explains why O_DIRECT is not possible here.
inline bool open_or_skip(const IoEngine& engine, const std::string& path, ReadFile* out,
                         std::string* skip_reason) {
  auto f = engine.open(path);
  if (!f.is_ok()) {
    *skip_reason = "cannot open with " + std::string(direct_name(engine.options().direct)) +
                   " I/O here: " + f.status().message();
    return false;
  }
  *out = std::move(f).value();
  return true;
}

#define KTIER_IO_SKIP_IF(cond, reason)                        \
  do {                                                        \
    if (cond) {                                               \
      std::printf("  [ SKIPPED ] %s\n", (reason).c_str());    \
      GTEST_SKIP() << (reason);                               \
    }                                                         \
  } while (0)

}  // namespace ktier::io::test
