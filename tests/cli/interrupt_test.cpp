// Ctrl-C in `ktier run` (common/interrupt.h): the first SIGINT stops at a whole token with the
// text, the report and a closed trace (exit 130); in a conversation it ends the answer and the
// conversation goes on; at the conversation's prompt it ends the conversation.
//
// The runs use a tiny checkpoint whose config has no eos token and whose lm_head row for the
// chat's <|close|> is zero (its logit exactly 0, below the argmax of the other 319), so that a
// greedy run or answer goes on until -n (minutes away) and only the signal can end it early.
// A run needs a stop id (K3-MODEL D3): the runs name <|close|>, never generated.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "common/child_process.h"
#include "common/run_process.h"
#include "common/test_paths.h"
#include "format/safetensors.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ktier::test {
namespace {

namespace fs = std::filesystem;
using Stream = ChildProcess::Stream;

class InterruptCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-interrupt-" + std::to_string(::getpid()));
    const auto r = run_process(ktier_bin().string() +
                               " synth --preset tiny --seed 0 -q --force -o " +
                               (dir_ / "model").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const fs::path config = dir_ / "model" / "config.json";
    nlohmann::json c = nlohmann::json::parse(std::ifstream(config));
    c["eos_token_id"] = nullptr;
    if (c.contains("text_config") && c["text_config"].contains("eos_token_id"))
      c["text_config"]["eos_token_id"] = nullptr;
    std::ofstream(config) << c.dump(1);
    // generation_config.json's stop id counts too (D3).
    const fs::path gen = dir_ / "model" / "generation_config.json";
    nlohmann::json g = nlohmann::json::parse(std::ifstream(gen));
    g["eos_token_id"] = nullptr;
    std::ofstream(gen) << g.dump(1);

    auto tokenizer = tok::Tokenizer::load((dir_ / "model").string());
    ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().message();
    auto markers = tok::chat_markers(*tokenizer);
    ASSERT_TRUE(markers.is_ok()) << markers.status().message();
    close_id_ = std::to_string(markers->close);
    bool zeroed = false;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "model")) {
      if (e.path().extension() != ".safetensors") continue;
      uint64_t offset = 0, row_bytes = 0;
      {
        auto st = format::SafetensorsFile::open(e.path().string());
        ASSERT_TRUE(st.is_ok()) << st.status().message();
        const format::TensorInfo* head = st->find("language_model.lm_head.weight");
        if (head == nullptr) continue;
        row_bytes = head->nbytes / static_cast<uint64_t>(head->shape.at(0));
        offset = head->file_offset + row_bytes * markers->close;
      }
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(offset));
      const std::string zeros(row_bytes, '\0');
      f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
      zeroed = f.good();
    }
    ASSERT_TRUE(zeroed);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::vector<std::string> run_args(std::vector<std::string> extra,
                                          const std::string& n = "100000") {
    std::vector<std::string> args = {ktier_bin().string(), "run", "-m", (dir_ / "model").string(),
                                     "-n", n, "--stop-id", close_id_};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  static inline fs::path dir_;
  static inline std::string close_id_;  // <|close|>'s id, whose logit is 0
};

TEST_F(InterruptCli, RunStopsAtAWholeTokenWithItsTextReportAndTrace) {
  const fs::path trace = dir_ / "run.ktrace", report = dir_ / "run.json";
  ChildProcess c(run_args({"--ids", "2", "--print-ids", "--trace", trace.string(),
                           "--report-json", report.string()}));
  ASSERT_TRUE(c.started());
  // Text is streaming: the decode runs.
  ASSERT_TRUE(c.wait_until([&] { return !c.out().empty(); })) << c.err();
  c.signal(SIGINT);
  ASSERT_EQ(c.wait(), 130) << c.err();
  // Ended by SIGINT itself once done, so that a script running it stops as well.
  EXPECT_EQ(c.term_signal(), SIGINT);
  EXPECT_NE(c.err().find("ktier: Ctrl-C: stopping after this token"), std::string::npos);
  EXPECT_NE(c.err().find("(interrupted)"), std::string::npos) << c.err();
  EXPECT_NE(c.err().find("ktier: stopped by Ctrl-C after "), std::string::npos) << c.err();
  EXPECT_EQ(c.err().find("ktier: error:"), std::string::npos) << c.err();

  // The ids printed are the greedy continuation's first n: the same as a run with -n n.
  const std::vector<int> got = split_ids(last_line(c.out()));
  ASSERT_GE(got.size(), 1u);
  ASSERT_LT(got.size(), 100000u);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j.at("stop"), "interrupted");
  EXPECT_EQ(j.at("generated_tokens").get<size_t>(), got.size());
  const auto again =
      run_process(ktier_bin().string() + " run -m " + (dir_ / "model").string() +
                  " --ids 2 --print-ids --stop-id " + close_id_ + " -n " +
                  std::to_string(got.size()));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(split_ids(last_line(again.out)), got);
  EXPECT_NE(again.err.find("(length limit)"), std::string::npos) << again.err;

  // The trace was closed: whole tokens, readable.
  const auto info = run_process(ktier_bin().string() + " trace info " + trace.string());
  EXPECT_EQ(info.exit_code, 0) << info.err;
}

// perplexity stops after the window in progress with the estimate so far (exit 130); its notice
// is a line of its own (it ran into the next log line, and a terminal's progress line wiped it).
TEST_F(InterruptCli, PerplexityStopsAfterAWindowWithTheEstimateSoFar) {
  // 300 windows of 64 tokens, paced by the disk (layers streamed, reads capped at 5 MB/s:
  // ~0.7 s a window here, minutes in all on any machine), so that the signal lands inside.
  ChildProcess c({ktier_bin().string(), "perplexity", "-m", (dir_ / "model").string(), "-c",
                  "64", "--threads", "1", "--ram", "1900K", "--io-rate-limit", "5", "--ids",
                  spread_ids(64 * 300)});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_until([&] { return c.err().find("] perplexity ") != std::string::npos; }))
      << c.err();
  c.signal(SIGINT);
  ASSERT_EQ(c.wait(), 130) << c.err();
  EXPECT_NE(c.err().find("\nktier: Ctrl-C: stopping after this window (Ctrl-C again quits at "
                         "once)\n"),
            std::string::npos)
      << c.err();
  EXPECT_NE(c.err().find("ktier: stopped by Ctrl-C after "), std::string::npos) << c.err();
  EXPECT_NE(c.out().find("perplexity"), std::string::npos) << "the estimate so far\n" << c.out();
}

// Ctrl-C inside the last window (here the only one) ends as interrupted too, with the whole
// estimate (it exited 0, and a shell loop running perplexity over files went on).
TEST_F(InterruptCli, PerplexityStoppedInItsLastWindowIsInterrupted) {
  ChildProcess c({ktier_bin().string(), "perplexity", "-m", (dir_ / "model").string(), "-c",
                  "64", "--threads", "1", "--ram", "1900K", "--io-rate-limit", "1", "--ids",
                  spread_ids(64)});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_until([&] { return c.err().find(" window(s) of 64") != std::string::npos; }))
      << c.err();
  // Inside the window: reads capped at 1 MB/s make it some 3.5 s on any machine.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.signal(SIGINT);
  ASSERT_EQ(c.wait(), 130) << c.err();
  EXPECT_NE(c.err().find("ktier: Ctrl-C: stopping after this window"), std::string::npos)
      << c.err();
  EXPECT_NE(c.err().find("ktier: stopped by Ctrl-C after 1 of 1 windows"), std::string::npos)
      << c.err();
  EXPECT_NE(c.out().find("(1 window of 64)"), std::string::npos) << c.out();
}

// A run stopped inside its prompt saves the part it ran to --prompt-cache: the next run goes on
// from there and prints what a run without the cache prints. With --chunk 1 it stops somewhere
// inside; with one chunk of all ids but the last it stops exactly before the last id (where the
// state is otherwise saved just before that id runs).
TEST_F(InterruptCli, RunStoppedInItsPromptSavesThePartItRan) {
  // The signal is sent 300 ms after the run has loaded (its "experts:" line); the prompt is
  // paced by the disk, not the cores (reads capped at 1 MB/s: ~3 s of expert reads with
  // --chunk 1, ~3 s a pass of the streamed layers with --chunk 1499, on any machine), so it
  // lands inside (budget and threads never change the output).
  const std::string ids = spread_ids(1500);
  const std::string run = ktier_bin().string() + " run -m " + (dir_ / "model").string() +
                          " --print-ids -n 3 --stop-id " + close_id_ + " --ids " + ids;
  const auto plain = run_process(run);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (const std::string& chunk : {std::string("1"), std::string("1499")}) {
    SCOPED_TRACE("--chunk " + chunk);
    const fs::path cache = dir_ / ("stopped-" + chunk + ".st");
    ChildProcess c(
        run_args({"--ids", ids, "--chunk", chunk, "--threads", "1", "--ram", "15M",
                  "--io-rate-limit", "1", "--prompt-cache", cache.string()},
                 "3"));
    ASSERT_TRUE(c.started());
    ASSERT_TRUE(c.wait_for(Stream::kErr, "does not exist yet")) << c.err();
    ASSERT_TRUE(c.wait_for(Stream::kErr, "] experts: ")) << c.err();
    ::usleep(300 * 1000);
    c.signal(SIGINT);
    ASSERT_EQ(c.wait(), 130) << c.err();
    const std::string said = "stopped by Ctrl-C in the prompt, after ";
    const size_t at = c.err().find(said);
    ASSERT_NE(at, std::string::npos) << c.err();
    const std::string ran =
        c.err().substr(at + said.size(), c.err().find(' ', at + said.size()) - at - said.size());
    if (chunk == "1499") {
      EXPECT_EQ(ran, "1499");
    }
    EXPECT_NE(c.err().find("the state after " + ran + " tokens saved"), std::string::npos)
        << c.err();
    const auto resumed = run_process(run + " --prompt-cache " + cache.string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(resumed.out, plain.out);
    EXPECT_NE(resumed.err.find("(+" + ran + " from the prompt cache)"), std::string::npos)
        << resumed.err;
  }
}

// A run that saves nothing (no --prompt-cache, no --trace) stops inside its prompt chunk, after
// the layer running, not at the chunk's end (a K3 chunk on a CPU can take minutes): one chunk of
// the whole prompt, paced by the disk as above (~3 s a pass), stops with none of it run and
// nothing sampled, where it used to run the chunk and sample a token.
TEST_F(InterruptCli, RunSavingNothingStopsInsideItsPromptChunk) {
  const fs::path report = dir_ / "inside-chunk.json";
  ChildProcess c(run_args({"--ids", spread_ids(1500), "--chunk", "1500", "--threads", "1",
                           "--ram", "15M", "--io-rate-limit", "1", "--print-ids",
                           "--report-json", report.string()},
                          "3"));
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for(Stream::kErr, "] experts: ")) << c.err();
  ::usleep(300 * 1000);
  c.signal(SIGINT);
  ASSERT_EQ(c.wait(), 130) << c.err();
  EXPECT_NE(c.err().find("ktier: Ctrl-C: stopping after this layer"), std::string::npos)
      << c.err();
  EXPECT_NE(c.err().find("ktier: stopped by Ctrl-C in the prompt, after 0 of its 1500 tokens"),
            std::string::npos)
      << c.err();
  EXPECT_EQ(c.err().find("ktier: error:"), std::string::npos) << c.err();
  EXPECT_EQ(last_line(c.out()), "");  // no id generated
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j.at("stop"), "interrupted");
  EXPECT_EQ(j.at("prompt_tokens"), 0);
  EXPECT_EQ(j.at("generated_tokens"), 0);
}

TEST_F(InterruptCli, ConversationAnswerEndsAndTheConversationGoesOn) {
  const fs::path trace = dir_ / "chat.ktrace";
  ChildProcess c(run_args({"--chat", "-i", "-p", "hello", "-c", "50000", "--trace", trace.string()},
                          "20000"));
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_until([&] { return !c.out().empty(); })) << c.err();
  c.signal(SIGINT);
  ASSERT_TRUE(c.wait_for(Stream::kErr, "(interrupted)")) << c.err();
  EXPECT_NE(c.err().find("ktier: Ctrl-C: ending this answer"), std::string::npos) << c.err();
  ASSERT_TRUE(c.wait_for(Stream::kErr, "> ", c.err().find("(interrupted)"))) << c.err();

  // The next message is answered, and Ctrl-C ends that answer too.
  const size_t out_before = c.out().size(), err_before = c.err().size();
  ASSERT_TRUE(c.write_stdin("and again\n"));
  ASSERT_TRUE(c.wait_until([&] { return c.out().size() > out_before; })) << c.err();
  c.signal(SIGINT);
  ASSERT_TRUE(c.wait_for(Stream::kErr, "(interrupted)", err_before)) << c.err();
  ASSERT_TRUE(c.wait_for(Stream::kErr, "> ", c.err().find("(interrupted)", err_before)))
      << c.err();
  // End of input ends the conversation as usual: exit 0, the trace closed.
  c.close_stdin();
  EXPECT_EQ(c.wait(), 0) << c.err();
  EXPECT_EQ(run_process(ktier_bin().string() + " trace info " + trace.string()).exit_code, 0);
}

TEST_F(InterruptCli, CtrlCAtTheConversationPromptEndsIt) {
  const fs::path trace = dir_ / "prompt.ktrace";
  ChildProcess c(run_args({"--chat", "-i", "-p", "hello", "--trace", trace.string()}, "2"));
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for(Stream::kErr, "> ")) << c.err();
  c.signal(SIGINT);
  EXPECT_EQ(c.wait(), 130) << c.err();
  EXPECT_NE(c.err().find("ktier: conversation ended by Ctrl-C"), std::string::npos) << c.err();
  EXPECT_EQ(run_process(ktier_bin().string() + " trace info " + trace.string()).exit_code, 0);
}

}  // namespace
}  // namespace ktier::test
