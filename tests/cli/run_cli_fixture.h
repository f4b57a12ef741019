#pragma once
// The fixture of the `ktier run`/`eval` command-line tests (run_eval_test.cpp,
// memory_dial_cli_test.cpp): the tiny seed-0 checkpoint, synthesized once per suite into a
// folder of its own, and its float64 goldens (tests/fixtures/golden/tiny-mxfp4.json).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {

namespace fs = std::filesystem;

inline std::string ktier() { return ktier_bin().string(); }

// The bytes a budget refusal (exit 4) states as its minimum, as the digits a flag takes: the
// number before " bytes" after "the minimum is " (the dial's "the minimum is 1.2 MiB = N bytes",
// --vram's "the minimum is N bytes"); "0" with a test failure where there is none.
inline std::string stated_minimum(const std::string& refusal) {
  const size_t at = refusal.find("the minimum is ");
  const size_t end = at == std::string::npos ? at : refusal.find(" bytes", at);
  EXPECT_NE(end, std::string::npos) << refusal;
  if (end == std::string::npos) return "0";
  const size_t start = refusal.rfind(' ', end - 1) + 1;
  return refusal.substr(start, end - start);
}

class RunEvalCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-run-cli-" + std::to_string(::getpid()));
    const auto r = run_process(ktier() + " synth --preset tiny --seed 0 -q --force -o " + dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(source_dir() / "tests/fixtures/golden/tiny-mxfp4.json");
    golden_ = nlohmann::json::parse(in);
  }
  // The tests' files and folders are dir_'s siblings named "<dir_>-…": removed with it.
  static void TearDownTestSuite() {
    const std::string prefix = dir_.filename().string();
    std::vector<fs::path> ours;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_.parent_path())) {
      const std::string name = e.path().filename().string();
      if (name == prefix || name.rfind(prefix + "-", 0) == 0) ours.push_back(e.path());
    }
    for (const fs::path& p : ours) fs::remove_all(p);
  }
  static std::string model() { return " -m " + dir_.string(); }
  static std::string prompt_ids() {
    return join_ids(golden_.at("prompt_ids").get<std::vector<int>>());
  }
  static inline fs::path dir_;
  static inline nlohmann::json golden_;
};

}  // namespace ktier::test
