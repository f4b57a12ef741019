// `ktier tokenize` end to end: runs the built binary (test_paths.h ktier_bin()) through popen.
#include <sys/wait.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "common/test_paths.h"
#include "test_vocab.h"
#include "tokenizer/tokenizer.h"

namespace ktier::tok {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return {};
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  std::fclose(f);
  return s;
}

CliRun ktier(const std::vector<std::string>& args, const fs::path& dir) {
  std::string cmd = quote(test::ktier_bin().string());
  for (const auto& a : args) cmd += " " + quote(a);
  const fs::path err = dir / "stderr.txt";
  cmd += " 2>" + quote(err.string());
  CliRun r{-1, {}, {}};
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err);
  return r;
}

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_dir(std::string("cli_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    tok_dir_ = dir_ / "tok";
    test::write_file(tok_dir_ / "tiktoken.model", test::tiktoken_text(test::byte_vocab(test::demo_merges())));
    test::write_file(tok_dir_ / "tokenizer_config.json",
                     R"({"added_tokens_decoder": {"280": {"content": "<|end_of_msg|>", "special": true}}})");
    auto t = Tokenizer::load(tok_dir_);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tok_ = std::make_unique<Tokenizer>(std::move(t).value());
  }
  std::string ids_line(const std::vector<uint32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s + "\n";
  }
  fs::path dir_, tok_dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(TokenizeCli, EncodesPromptAndFile) {
  const std::string text = "hello world\n\n  the 中文 it's<|end_of_msg|>";
  CliRun r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "-p", text}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(tok_->encode(text)));
  test::write_file(dir_ / "in.txt", text + "\xFF");
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "-f", (dir_ / "in.txt").string()}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(tok_->encode(text + "\xFF")));
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--special", "-p", text}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(tok_->encode(text, true)));
  EXPECT_NE(r.out.find(",280\n"), std::string::npos);
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "-p", ""}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\n");
}

TEST_F(TokenizeCli, PatternOption) {
  const std::string text = "中文English混合!\n/x";
  const auto o200k = Tokenizer::load(tok_dir_, SplitPattern::kO200k);
  ASSERT_TRUE(o200k.is_ok());
  ASSERT_NE(o200k->encode(text), tok_->encode(text));  // the patterns differ on this text
  CliRun r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--pattern", "o200k", "-p", text}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(o200k->encode(text)));
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--pattern", "k3", "-p", text}, dir_);
  EXPECT_EQ(r.out, ids_line(tok_->encode(text)));
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--pattern", "gpt2", "-p", text}, dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("gpt2"), std::string::npos);
}

TEST_F(TokenizeCli, Decodes) {
  CliRun r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--decode", "--ids", "104,105,280, 256"}, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "hi<|end_of_msg|>he\n");
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--decode", "--skip-special", "--ids", "104,280"}, dir_);
  EXPECT_EQ(r.out, "h\n");
  const std::string text = "round trip: ÿ 中文 \t\n";
  const auto ids = ids_line(tok_->encode(text));
  r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "--decode", "--ids", ids.substr(0, ids.size() - 1)}, dir_);
  EXPECT_EQ(r.out, text + "\n");
}

TEST_F(TokenizeCli, UsageErrorsExitTwo) {
  const std::string t = tok_dir_.string();
  const std::vector<std::vector<std::string>> cases = {
      {"tokenize", "--tokenizer", t},                                     // neither -p nor -f
      {"tokenize", "-p", "x"},                                            // no --tokenizer
      {"tokenize", "--tokenizer", t, "-p", "x", "-f", "y"},              // both
      {"tokenize", "--tokenizer", t, "--decode", "--ids", "1,x"},        // bad id
      {"tokenize", "--tokenizer", t, "--decode", "--ids", "1,281"},      // unknown id
      {"tokenize", "--tokenizer", t, "-p", "x", "--ids", "1"},           // --ids without --decode
      {"tokenize", "--tokenizer", (dir_ / "nope").string(), "-p", "x"},  // missing folder
      {"tokenize", "--tokenizer", t, "-f", (dir_ / "nope.txt").string()},
  };
  for (const auto& c : cases) {
    const CliRun r = ktier(c, dir_);
    std::string joined;
    for (const auto& a : c) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << joined;
  }
  const CliRun r = ktier({"tokenize", "--tokenizer", t, "--decode", "--ids", "1,281"}, dir_);
  EXPECT_NE(r.err.find("token id 281"), std::string::npos) << r.err;
}

TEST_F(TokenizeCli, CorruptTokenizerExitsThree) {
  test::write_file(tok_dir_ / "tiktoken.model", "YWI= 0\nYWI= 0\n");
  const CliRun r = ktier({"tokenize", "--tokenizer", tok_dir_.string(), "-p", "x"}, dir_);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("tiktoken.model:2: duplicate rank 0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ktier::tok
