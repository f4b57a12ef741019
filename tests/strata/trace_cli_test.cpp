// `ktier trace` through the built binary: convert, info, replay with --csv/--json/--plot, and the
// exit codes of its failures (2 usage, 3 corrupt trace, 1 plotting without matplotlib).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/run_process.h"
#include "common/test_paths.h"
#include "strata/trace_format.h"
#include "tests/strata/read_csv.h"

namespace ktier {
namespace {

namespace fs = std::filesystem;
using test::run_process;

class TraceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    conformance_ = test::conformance_dir() / "expert_trace.bin";
    ASSERT_TRUE(fs::is_regular_file(conformance_))
        << conformance_ << " is missing (set KTIER_CONFORMANCE_DIR to ../shared/conformance)";
    ASSERT_TRUE(fs::is_regular_file(test::ktier_bin())) << test::ktier_bin() << " is not built";
    dir_ = fs::temp_directory_path() /
           ("ktier_trace_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string ktier(const std::string& args) const {
    return test::ktier_bin().string() + " " + args;
  }
  std::string q(const fs::path& p) const { return "'" + p.string() + "'"; }

  fs::path conformance_, dir_;
};

// Reads a CSV into rows of column -> value.
bool is_png(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in.gcount() == 8 && std::string(magic, 8) == std::string("\x89PNG\r\n\x1a\n", 8);
}

TEST_F(TraceCli, ReplayWritesCsvJsonAndPng) {
  const fs::path csv = dir_ / "replay.csv", png = dir_ / "replay.png", json = dir_ / "r.json";
  const test::ProcessResult r = run_process(
      ktier("trace replay " + q(conformance_) +
            " --convert-conformance --policy lru,belady,static --ram 8GB,16GB,256x --csv " +
            q(csv) + " --json " + q(json) + " --plot " + q(png)));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("10,010 distinct keys"), std::string::npos) << r.out;

  const auto rows = test::read_csv(csv);
  ASSERT_EQ(rows.size(), 9u);
  std::map<std::string, std::map<std::string, std::string>> by;  // "policy budget" -> row
  for (const auto& row : rows) by[row.at("policy") + " " + row.at("budget")] = row;
  EXPECT_EQ(by["lru 8GB"]["total_slots"], "455");
  EXPECT_EQ(by["lru 8GB"]["hits"], "36272");
  EXPECT_EQ(by["lru 16GB"]["total_slots"], "911");
  EXPECT_EQ(by["lru 16GB"]["hits"], "36272");
  EXPECT_EQ(by["lru 256x"]["hits"], "36272");
  EXPECT_EQ(by["lru 8GB"]["requests"], "100096");
  EXPECT_EQ(by["lru 8GB"]["total_bytes"], "8000000000");
  EXPECT_EQ(by["belady 8GB"]["hits"], "39457");
  EXPECT_EQ(by["lru 8GB"]["bytes_read"], std::to_string((100096ull - 36272) * 17547264));
  EXPECT_EQ(by["lru 8GB"]["ram_hits"], "36272");

  EXPECT_TRUE(is_png(png)) << png;
  EXPECT_GT(fs::file_size(png), 1000u);
  EXPECT_FALSE(fs::exists(fs::path(png.string() + ".csv")));

  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["results"].size(), 9u);
  const auto& first = j["results"][0];
  EXPECT_EQ(first["policy"], "lru");
  EXPECT_EQ(first["tiers"][0]["name"], "ram");
  EXPECT_EQ(first["tiers"][0]["hits"], 36272);
  EXPECT_EQ(first["tiers"][0]["requests"], 100096);
  EXPECT_NEAR(first["tiers"][0]["hit_rate_bytes"].get<double>(), 36272.0 / 100096, 1e-12);
  EXPECT_EQ(first["tiers"][1]["name"], "nvme");
  EXPECT_EQ(j["summary"]["distinct_keys"], 10010);
}

// --csv naming the file stdout is redirected to: the table printed first stays, the CSV follows
// (a writer that truncated the path would erase the table).
TEST_F(TraceCli, CsvToOwnStdoutFollowsTheTable) {
  const fs::path both = dir_ / "both.txt";
  const test::ProcessResult r = run_process(
      ktier("trace replay " + q(conformance_) + " --convert-conformance --policy lru --slots 455 " +
            "--csv /dev/stdout > " + q(both)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(both);
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const size_t table = text.find("policy  budget");
  const size_t csv = text.find("policy,budget,total_bytes");
  ASSERT_NE(table, std::string::npos) << text;
  ASSERT_NE(csv, std::string::npos) << text;
  EXPECT_LT(table, csv);
  EXPECT_NE(text.find("\nlru,455x,", csv), std::string::npos) << text;
}

// The plot's CSV is a private temporary: a file named like PNG.csv beside it is the user's.
TEST_F(TraceCli, PlotWithoutCsvAndTwoTiers) {
  const fs::path png = dir_ / "two_tier.png";
  std::ofstream(png.string() + ".csv") << "precious\n";
  const test::ProcessResult r = run_process(
      ktier("trace replay " + q(conformance_) +
            " --convert-conformance --policy lru,temperature --vram 8GB --slots 100,1368 --plot " +
            q(png)));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_TRUE(is_png(png));
  EXPECT_NE(r.out.find("vram %"), std::string::npos) << r.out;
  std::ifstream kept(png.string() + ".csv");
  std::string line;
  EXPECT_TRUE(std::getline(kept, line) && line == "precious");
  // An image that cannot be written: one line naming --plot's path, no Python traceback.
  const test::ProcessResult full = run_process(
      ktier("trace replay " + q(conformance_) + " --convert-conformance --policy lru --slots 100 "
            "--plot /dev/full"));
  EXPECT_EQ(full.exit_code, 1);
  EXPECT_NE(full.err.find("/dev/full"), std::string::npos) << full.err;
  EXPECT_EQ(full.err.find("Traceback"), std::string::npos) << full.err;
  // Two outputs on one path: refused before the work.
  const fs::path same = dir_ / "same.out";
  const test::ProcessResult twice = run_process(
      ktier("trace replay " + q(conformance_) + " --convert-conformance --policy lru --slots 100 "
            "--csv " + q(same) + " --json " + q(same)));
  EXPECT_EQ(twice.exit_code, 2);
  EXPECT_NE(twice.err.find("is also given as --csv"), std::string::npos) << twice.err;
  // The same new file by a bare relative name and by a longer one.
  const test::ProcessResult relative = run_process(
      "cd " + q(dir_) + " && " +
      ktier("trace replay " + q(conformance_) + " --convert-conformance --policy lru "
            "--slots 100 --csv fresh.csv --json ./fresh.csv"));
  EXPECT_EQ(relative.exit_code, 2) << relative.err;
  // A device holds nothing to overwrite: /dev/null may take both.
  EXPECT_EQ(run_process(ktier("trace replay " + q(conformance_) + " --convert-conformance "
                              "--policy lru --slots 100 --csv /dev/null --json /dev/null"))
                .exit_code,
            0);
}

TEST_F(TraceCli, ConvertInfoAndReplayTheConvertedFile) {
  const fs::path out = dir_ / "conf.ktrace", out2 = dir_ / "conf2.ktrace";
  test::ProcessResult r = run_process(ktier("trace convert " + q(conformance_) + " " + q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("6,256 steps"), std::string::npos) << r.out;
  r = run_process(ktier("trace convert-k3c " + q(conformance_) + " -o " + q(out2)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream a(out, std::ios::binary), b(out2, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));

  r = run_process(ktier("trace info " + q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("distinct keys:    10,010"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("90,086 hits = 90.00%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("5,152 repeated (position, layer) groups, 0 mismatches"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tokens:           68"), std::string::npos) << r.out;

  const fs::path csv = dir_ / "slots.csv";
  r = run_process(
      ktier("trace replay " + q(out) + " --policy lru --slots 1,2,4,8,16 --csv " + q(csv)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = test::read_csv(csv);
  ASSERT_EQ(rows.size(), 5u);
  const char* expected[] = {"25", "89", "376", "1910", "17832"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(rows[i].at("hits"), expected[i]);

  // --budgets is --ram; --profile ranks static (here the trace itself: same as the default).
  const fs::path csv2 = dir_ / "profile.csv";
  r = run_process(ktier("trace replay " + q(out) +
                        " --policy static,temperature --budgets 8GB "
                        "--profile " +
                        q(out) + " --csv " + q(csv2)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("static ranked by the profile"), std::string::npos) << r.out;
  const auto prof = test::read_csv(csv2);
  ASSERT_EQ(prof.size(), 2u);
  EXPECT_EQ(prof[0].at("policy"), "static");
  EXPECT_EQ(prof[0].at("hits"), "16012");
  EXPECT_EQ(prof[0].at("total_slots"), "455");

  // A profile of another model's shape is refused, as `run --profile` refuses it: its keys
  // would name other experts (a profile of one more layer was padded or cut to fit).
  auto recorded = strata::read_trace(out);
  ASSERT_TRUE(recorded.is_ok()) << recorded.status().message();
  strata::Trace other = std::move(*recorded);
  ++other.header.num_layers;
  const fs::path deeper = dir_ / "deeper.ktrace";
  ASSERT_TRUE(strata::write_trace(deeper, other).is_ok());
  r = run_process(ktier("trace replay " + q(out) + " --policy static --budgets 8GB --profile " +
                        q(deeper)));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--profile " + deeper.string() + ": recorded from a model with"),
            std::string::npos)
      << r.err;
}

TEST_F(TraceCli, CorruptTraceExits3NamingTheFile) {
  const fs::path out = dir_ / "conf.ktrace";
  ASSERT_EQ(run_process(ktier("trace convert " + q(conformance_) + " " + q(out))).exit_code, 0);
  // Truncate inside the second block.
  fs::resize_file(out, fs::file_size(out) / 3);
  test::ProcessResult r = run_process(ktier("trace replay " + q(out) + " --slots 16"));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;
  r = run_process(ktier("trace info " + q(out)));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(out.string()), std::string::npos) << r.err;

  // The raw conformance file without --convert-conformance: corrupt, with the hint.
  r = run_process(ktier("trace info " + q(conformance_)));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("--convert-conformance"), std::string::npos) << r.err;
  // As a profile, the hint is the one that applies there, and the flag is named.
  const fs::path ktrace = dir_ / "conf2.ktrace";
  ASSERT_EQ(run_process(ktier("trace convert " + q(conformance_) + " " + q(ktrace))).exit_code, 0);
  r = run_process(ktier("trace replay " + q(ktrace) + " --slots 16 --profile " + q(conformance_)));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("--profile: " + conformance_.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("`ktier trace convert IN OUT`"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--convert-conformance"), std::string::npos) << r.err;
  // A ktier trace read as a conformance one: said so.
  r = run_process(ktier("trace info " + q(ktrace) + " --convert-conformance"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("It is a ktier trace: read it without --convert-conformance"),
            std::string::npos)
      << r.err;
  r = run_process(ktier("trace convert " + q(ktrace) + " " + q(dir_ / "again.ktrace")));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("It is a ktier trace already: nothing to convert"), std::string::npos)
      << r.err;
  // A conformance record whose layer puts its keys past a trace's: exit 3, naming the record.
  const fs::path far = dir_ / "far.bin";
  {
    std::ofstream out(far, std::ios::binary);
    for (int32_t e = 0; e < 16; ++e) {
      const int32_t rec[2] = {5000, e};
      out.write(reinterpret_cast<const char*>(rec), sizeof rec);
    }
  }
  r = run_process(ktier("trace info " + q(far) + " --convert-conformance"));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(far.string() + ": record 0 (byte 0): layer 5000 is out of range"),
            std::string::npos)
      << r.err;

  // A conformance file cut mid-record.
  const fs::path cut = dir_ / "cut.bin";
  fs::copy_file(conformance_, cut);
  fs::resize_file(cut, 8 * 1000 + 4);
  r = run_process(ktier("trace convert " + q(cut) + " " + q(dir_ / "x.ktrace")));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find(cut.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("record 1000"), std::string::npos) << r.err;
}

TEST_F(TraceCli, UsageErrorsExit2) {
  const std::string conf = q(conformance_) + " --convert-conformance";
  // Each refused for its own reason, named (a renamed flag would be refused as unknown).
  const std::pair<std::string, std::string> refused[] = {
      {"trace replay " + conf, "trace replay needs budgets"},
      {"trace replay " + conf + " --ram 8QB", "--ram: '8QB' has an unknown unit"},
      {"trace replay " + conf + " --ram 8GB --policy arc", "unknown policy 'arc'"},
      {"trace replay " + conf + " --ram 8GB --slots 4", "give the RAM tier once"},
      {"trace replay " + conf + " --ram 8GB --lookahead 1", "records predictions to depth 0"},
      {"trace replay " + conf + " --ram 8GB --half-life 0", "--half-life must be a finite"},
      {"trace replay " + conf + " --ram 8GB --half-life 1e-320", "at least 0.001"},
      {"trace", "trace needs a command"},
  };
  for (const auto& [args, why] : refused) {
    const auto r = run_process(ktier(args));
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find(why), std::string::npos) << args << ": " << r.err;
  }
  // A folder or a device as the conformance file: named, not "read error" or a read without end.
  for (const std::string& in : {dir_.string(), std::string("/dev/zero")}) {
    const auto r = run_process(ktier("trace convert " + q(in) + " " + q(dir_ / "x.ktrace")));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(in + ": not a file or a pipe"), std::string::npos) << r.err;
  }
  // A pipe is read as before.
  const auto piped = run_process("cat " + q(conformance_) + " | " +
                                 ktier("trace convert /dev/stdin " + q(dir_ / "p.ktrace")));
  EXPECT_EQ(piped.exit_code, 0) << piped.err;
  // An output that can never be written is refused before the replay (exit 2, a misnamed path).
  const auto r = run_process(ktier("trace replay " + conf + " --slots 16 --csv /proc/ktier.csv"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--csv: cannot write /proc/ktier.csv"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(TraceCli, PlotWithoutMatplotlibIsAClearError) {
  // A matplotlib package that fails to import, found first through PYTHONPATH.
  const fs::path fake = dir_ / "fake" / "matplotlib";
  fs::create_directories(fake);
  std::ofstream(fake / "__init__.py") << "raise ImportError('no matplotlib here (test)')\n";
  const fs::path png = dir_ / "never.png";
  const test::ProcessResult r =
      run_process("PYTHONPATH=" + q(dir_ / "fake") + " " +
                  ktier("trace replay " + q(conformance_) +
                        " --convert-conformance --policy lru --slots 16 --plot " + q(png)));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("matplotlib"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(png));
}

}  // namespace
}  // namespace ktier
