// `ktier run --prompt-cache FILE [--prompt-cache-all | --prompt-cache-ro]`: a run that starts from
// a saved state prints exactly what the run without it prints (text, ids), at any chunking,
// thread count, memory budget and on the emulated device, and the report says how many prompt
// tokens it did not run; files that are not this checkpoint's state are refused with the
// documented exit codes and never overwritten.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {
namespace {

namespace fs = std::filesystem;

std::string ktier() { return ktier_bin().string(); }
std::string restored(int64_t n) { return "(+" + std::to_string(n) + " from the prompt cache)"; }

// Prompts of the tiny tokenizer; kLonger begins with kPrompt's ids (a space then more words).
constexpr const char* kPrompt = "The lighthouse keeper checked the lamp and the lens";
constexpr const char* kLonger =
    "The lighthouse keeper checked the lamp and the lens \"and then the stairs\" twice";

class PromptCacheCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-prompt-cache-cli-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    for (const char* seed : {"0", "1"}) {
      const auto r = run_process(ktier() + " synth --preset tiny -q --force --seed " + seed +
                                 " -o " + (dir_ / ("m" + std::string(seed))).string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  // `ktier run` on the seed-0 model: 8 greedy tokens and their ids after the text.
  static ProcessResult run(const std::string& prompt, const std::string& flags) {
    return run_process(ktier() + " run -m " + (dir_ / "m0").string() + " -p '" + prompt +
                       "' -n 8 --print-ids " + flags);
  }
  static int64_t prompt_tokens(const std::string& text) {
    const auto r = run_process(ktier() + " tokenize --tokenizer " + (dir_ / "m0").string() +
                               " -p '" + text + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return static_cast<int64_t>(std::count(r.out.begin(), r.out.end(), ',')) + 1;
  }
  static inline fs::path dir_;
};

TEST_F(PromptCacheCli, RunsFromTheSavedStatePrintWhatRunsWithoutItPrint) {
  const int64_t p = prompt_tokens(kPrompt);
  const auto plain = run(kPrompt, ""), longer = run(kLonger, "");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  ASSERT_NE(plain.out, longer.out);
  // Each setting from a fresh file: the first run saves the prompt's state (all but its last
  // id), the same prompt then runs only that id, and a prompt that goes on runs only the rest.
  const std::string settings[] = {"", "--chunk 3 --threads 1", "--ram 2M",
                                  "--device emulated --vram 64M"};
  int i = 0;
  for (const std::string& s : settings) {
    SCOPED_TRACE(s);
    const fs::path cache = dir_ / ("c" + std::to_string(i++) + ".st");
    const std::string flags = s + " --prompt-cache " + cache.string();
    auto r = run(kPrompt, flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    EXPECT_NE(r.err.find("does not exist yet"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the state after " + std::to_string(p - 1) + " tokens saved"),
              std::string::npos) << r.err;
    r = run(kPrompt, flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    EXPECT_NE(r.err.find("prompt 1 tokens " + restored(p - 1)), std::string::npos) << r.err;
    const fs::path report = dir_ / "report.json";
    r = run(kLonger, flags + " --report-json " + report.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, longer.out);
    EXPECT_NE(r.err.find(restored(p - 1)), std::string::npos) << r.err;
    const nlohmann::json j = nlohmann::json::parse(read_text(report));
    EXPECT_EQ(j.at("prompt_cache_tokens").get<int64_t>(), p - 1);
    EXPECT_EQ(j.at("prompt_tokens").get<int64_t>(), prompt_tokens(kLonger) - (p - 1));
  }
  // Seeded sampling draws the same tokens from a restored state.
  const fs::path cache = dir_ / "sampled.st";
  const std::string sampling = "--temp 0.9 --top-p 0.95 --seed 7 ";
  const auto sampled = run(kPrompt, sampling);
  ASSERT_EQ(run(kPrompt, sampling + "--prompt-cache " + cache.string()).exit_code, 0);
  const auto again = run(kPrompt, sampling + "--prompt-cache " + cache.string());
  EXPECT_EQ(again.out, sampled.out);
  EXPECT_NE(again.err.find(restored(p - 1)), std::string::npos) << again.err;
}

TEST_F(PromptCacheCli, AllSavesTheGeneratedTextAndReadOnlyNeverWrites) {
  const std::string ids = "17,42,1,99,128,7,200,63";
  const std::string m = " -m " + (dir_ / "m0").string();
  const fs::path cache = dir_ / "all.st";
  auto r =
      run_process(ktier() + " run" + m + " --ids " + ids + " -n 6 --print-ids --prompt-cache " +
                  cache.string() + " --prompt-cache-all");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string generated = r.out;  // the text, then the ids on a line of their own
  while (!generated.empty() && generated.back() == '\n') generated.pop_back();
  generated = generated.substr(generated.rfind('\n') + 1);
  // The prompt, 5 of the 6 generated ids (the last is never run), and more: all but the last
  // of the 6 generated come from the file.
  const std::string next = ids + "," + generated + ",5,6";
  const auto plain = run_process(ktier() + " run" + m + " --ids " + next + " -n 6");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string saved = read_text(cache);
  // The same prompt again: all of it among the saved ids, none left to run: a plain run.
  r = run_process(ktier() + " run" + m + " --ids " + ids + " -n 6 --prompt-cache " +
                  cache.string() + " --prompt-cache-ro");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the prompt's 8 are their start: not used"), std::string::npos) << r.err;
  r = run_process(ktier() + " run" + m + " --ids " + next + " -n 6 --prompt-cache " +
                  cache.string() + " --prompt-cache-ro");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, plain.out);
  EXPECT_NE(r.err.find(restored(8 + 5)), std::string::npos) << r.err;
  EXPECT_EQ(read_text(cache), saved);  // read-only
  // Read-only without a file: a plain run, no file made.
  const fs::path none = dir_ / "none.st";
  r = run_process(ktier() + " run" + m + " --ids " + next + " -n 6 --prompt-cache " +
                  none.string() + " --prompt-cache-ro");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, plain.out);
  EXPECT_FALSE(fs::exists(none));
}

// A conversation saved after every answer goes on in the next `--chat -i` run: its answers are
// those of the conversation that never stopped.
// Greedy or sampled: a sampled conversation's resumed sampler goes on past the draws the saved
// one made ("sampler_draws"), so its answers are the uninterrupted conversation's too.
TEST_F(PromptCacheCli, ConversationGoesOnFromTheSavedOne) {
  const std::string greedy =
      ktier() + " run -m " + (dir_ / "m0").string() + " --chat -i -n 6 --print-ids";
  auto answers = [](const std::string& out) {  // the id lines
    std::vector<std::string> lines;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
      if (!l.empty() && l.find_first_not_of("0123456789,") == std::string::npos) lines.push_back(l);
    return lines;
  };
  std::vector<std::string> greedy_answers;
  int variant = 0;
  // Greedy, sampled, and greedy with penalties that look back over the whole conversation
  // (the resumed one must see the saved ids).
  for (const std::string sampling :
       {"", " --temp 0.9 --top-k 50 --seed 5",
        " --repeat-penalty 1.5 --repeat-last-n -1 --frequency-penalty 0.3"}) {
    ++variant;
    const std::string chat = greedy + sampling;
    const auto whole =
        run_process("printf 'hello there\\nhow is the lamp\\nand the lens\\n' | " + chat);
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    const std::vector<std::string> all = answers(whole.out);
    ASSERT_EQ(all.size(), 3u) << whole.out;
    for (const bool from_p : {false, true}) {
      SCOPED_TRACE((from_p ? "next message from -p" : "next message from stdin") + sampling);
      const std::string name = std::string(from_p ? "conv-p" : "conv") +
                               (sampling.empty() ? "" : std::to_string(variant)) + ".st";
      const fs::path cache = dir_ / name;
      auto r = run_process("printf 'hello there\\nhow is the lamp\\n' | " + chat +
                           " --prompt-cache " + cache.string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(answers(r.out), std::vector<std::string>(all.begin(), all.begin() + 2));
      r = run_process(
          from_p ? chat + " -p 'and the lens' --prompt-cache " + cache.string() + " < /dev/null"
                 : "printf 'and the lens\\n' | " + chat + " --prompt-cache " + cache.string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(answers(r.out), std::vector<std::string>{all[2]});
      EXPECT_NE(r.err.find("the conversation of "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(" from the prompt cache)"), std::string::npos) << r.err;
    }
    if (sampling.empty()) greedy_answers = all;
  }
  const std::string& chat = greedy;
  ASSERT_EQ(greedy_answers.size(), 3u);
  // Too small a -c for the saved conversation: exit 4, as a message past -c.
  auto r = run_process(chat + " -p 'more' -c 70 --prompt-cache " + (dir_ / "conv.st").string());
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("start it again with a larger -c"), std::string::npos) << r.err;
  // A single run's file starts no conversation: a new one, as without the file.
  const fs::path single = dir_ / "single.st";
  ASSERT_EQ(run("hello there", "--prompt-cache " + single.string()).exit_code, 0);
  r = run_process("printf 'hello there\\n' | " + chat + " --prompt-cache " + single.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(answers(r.out), std::vector<std::string>{greedy_answers[0]});
  EXPECT_NE(r.err.find("a single run's state, not a conversation"), std::string::npos) << r.err;

  // A second answer that stopped at a --stop-id (an id of it the first answer lacks) saves that
  // id as the pending token; the resumed conversation closes the answer without it, as the one
  // that never stopped does: the same third answer from a third turn of the same length.
  const std::vector<int> first = split_ids(greedy_answers[0]);
  const std::vector<int> second = split_ids(greedy_answers[1]);
  size_t k = 0;
  while (k + 1 < second.size() &&
         (std::count(first.begin(), first.end(), second[k]) > 0 ||
          std::count(second.begin(), second.begin() + k, second[k]) > 0))
    ++k;
  ASSERT_LT(k + 1, second.size()) << greedy_answers[1];
  const std::string stop_chat = greedy + " --stop-id " + std::to_string(second[k]);
  const auto third_prompt = [](const std::string& err) {  // N of the last "prompt N tokens"
    const size_t at = err.rfind("ktier: prompt ");
    return at == std::string::npos ? std::string() : err.substr(at, err.find(' ', at + 14) - at);
  };
  const auto whole =
      run_process("printf 'hello there\\nhow is the lamp\\nand the lens\\n' | " + stop_chat);
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const std::vector<std::string> all = answers(whole.out);
  ASSERT_EQ(all.size(), 3u) << whole.out;
  EXPECT_EQ(all[0], greedy_answers[0]);
  EXPECT_EQ(all[1], join_ids(std::vector<int>(second.begin(), second.begin() + k + 1)));
  const fs::path stopped = dir_ / "conv-stop.st";
  r = run_process("printf 'hello there\\nhow is the lamp\\n' | " + stop_chat +
                  " --prompt-cache " + stopped.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path stopped_copy = dir_ / "conv-stop-copy.st";
  fs::copy_file(stopped, stopped_copy);
  r = run_process("printf 'and the lens\\n' | " + stop_chat + " --prompt-cache " +
                  stopped.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(answers(r.out), std::vector<std::string>{all[2]});
  EXPECT_FALSE(third_prompt(whole.err).empty()) << whole.err;
  EXPECT_EQ(third_prompt(r.err), third_prompt(whole.err)) << r.err;
  // The file says that its pending token stopped the answer: resumed without that --stop-id,
  // the answer is still closed without it (the third turn's prompt as long as before).
  r = run_process("printf 'and the lens\\n' | " + greedy + " --prompt-cache " +
                  stopped_copy.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(third_prompt(r.err), third_prompt(whole.err)) << r.err;
}

// A state that cannot be written (here a file size limit, as a full disk) is a warning: the
// run's answer is what it would be, and no file or partial file is left.
TEST_F(PromptCacheCli, ASaveThatFailsIsAWarningAndTheRunGoesOn) {
  const fs::path cache = dir_ / "full.st";
  const auto plain = run(kPrompt, "");
  const auto r = run_process("trap '' XFSZ; ulimit -f 40; " + ktier() + " run -m " +
                             (dir_ / "m0").string() + " -p '" + kPrompt +
                             "' -n 8 --print-ids --prompt-cache " + cache.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, plain.out);
  EXPECT_NE(r.err.find("prompt cache: not saved: cannot write " + cache.string() + ".partial"),
            std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_NE(e.path().filename().string().rfind("full.st", 0), 0u) << e.path();
  // A folder that does not exist: the same.
  const auto nowhere = run(kPrompt, "--prompt-cache " + (dir_ / "no-such-dir" / "x.st").string());
  ASSERT_EQ(nowhere.exit_code, 0) << nowhere.err;
  EXPECT_EQ(nowhere.out, plain.out);
  EXPECT_NE(nowhere.err.find("prompt cache: not saved"), std::string::npos) << nowhere.err;
}

// Several runs saving one file at once: each writes a file of its own and renames it whole, so
// the file is always one run's state (the last renamed), readable by the next run.
TEST_F(PromptCacheCli, RunsSavingAtOnceLeaveAWholeFile) {
  const fs::path cache = dir_ / "concurrent.st";
  std::string runs, waits = "true";
  for (int i = 0; i < 4; ++i) {
    runs += ktier() + " run -m " + (dir_ / "m0").string() + " --ids 5,6,7,8," +
            std::to_string(10 + i) + " -n 2 -t 1 --prompt-cache " + cache.string() +
            " --prompt-cache-all >/dev/null 2>&1 & p" + std::to_string(i) + "=$!; ";
    waits += " && wait $p" + std::to_string(i);
  }
  ASSERT_EQ(run_process(runs + waits).exit_code, 0);  // every run exits 0
  const auto r = run_process(ktier() + " run -m " + (dir_ / "m0").string() +
                             " --ids 1,2,3 -n 2 --prompt-cache " + cache.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("holds "), std::string::npos) << r.err;  // read, and not used
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("concurrent.st.partial"), std::string::npos);
}

TEST_F(PromptCacheCli, AnotherBackendsStateIsNotUsedAndIsReplaced) {
  const fs::path cache = dir_ / "backend.st";
  const auto plain = run(kPrompt, "");
  ASSERT_EQ(run(kPrompt, "--prompt-cache " + cache.string()).exit_code, 0);
  // The same state said to be a GPU's (with the fused kernels, then with cuBLAS prefill): the
  // header rewritten (padded to 8 as safetensors is), its checksum made again as docs/FORMAT.md
  // says ("key=value" lines sorted by key, then the tensors' bytes).
  for (const std::string label : {"cuda", "cuda+cublas"}) {
    SCOPED_TRACE(label);
    std::string bytes = read_text(cache);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
    ASSERT_EQ(h["__metadata__"]["backend"], "cpu");
    h["__metadata__"]["backend"] = label;
    std::string covered;
    for (const auto& [k, v] : h["__metadata__"].items())  // nlohmann's objects iterate sorted
      if (k != "xxh3") covered += k + "=" + v.get<std::string>() + "\n";
    covered += bytes.substr(8 + n);
    char digits[17];
    std::snprintf(digits, sizeof digits, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(covered.data(), covered.size())));
    h["__metadata__"]["xxh3"] = digits;
    std::string text = h.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    const uint64_t m = text.size();
    std::ofstream(cache, std::ios::binary | std::ios::trunc)
        << std::string(reinterpret_cast<const char*>(&m), 8) << text << bytes.substr(8 + n);
    const auto r = run(kPrompt, "--prompt-cache " + cache.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    EXPECT_NE(r.err.find("holds a " + label + " run's state and this run is on the cpu: not used"),
              std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("from the prompt cache"), std::string::npos) << r.err;
    bytes = read_text(cache);
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(nlohmann::json::parse(bytes.substr(8, n))["__metadata__"]["backend"], "cpu");
  }
}

TEST_F(PromptCacheCli, FilesThatAreNotThisCheckpointsStateAreRefused) {
  const fs::path cache = dir_ / "refused.st";
  ASSERT_EQ(run(kPrompt, "--prompt-cache " + cache.string()).exit_code, 0);
  const std::string saved = read_text(cache);
  // Another checkpoint (same shapes, other weights): exit 2, the file kept.
  auto r = run_process(ktier() + " run -m " + (dir_ / "m1").string() + " -p '" + kPrompt +
                       "' -n 4 --prompt-cache " + cache.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("saved from another checkpoint"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(cache), saved);
  // A damaged byte of the state: exit 3 before any token.
  std::string damaged = saved;
  damaged[damaged.size() - 3] = static_cast<char>(damaged[damaged.size() - 3] ^ 0x10);
  std::ofstream(cache, std::ios::binary | std::ios::trunc) << damaged;
  r = run(kPrompt, "--prompt-cache " + cache.string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(cache.string() + ": its metadata and tensors do not match"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(read_text(cache), damaged);
  // Something else: exit 3, not overwritten. A shard of the model itself is an input (exit 2).
  const fs::path text = dir_ / "notes.txt";
  std::ofstream(text) << "not a prompt cache\n";
  r = run(kPrompt, "--prompt-cache " + text.string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("not a prompt cache"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(text), "not a prompt cache\n");
  std::string shard;
  for (const auto& e : fs::directory_iterator(dir_ / "m0"))
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  r = run(kPrompt, "--prompt-cache " + shard);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  fs::copy_file(shard, dir_ / "shard-copy.safetensors", fs::copy_options::overwrite_existing);
  r = run(kPrompt, "--prompt-cache " + (dir_ / "shard-copy.safetensors").string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("no __metadata__"), std::string::npos) << r.err;
  // A device is no file, not a damaged cache (exit 2, said so).
  r = run(kPrompt, "--prompt-cache /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt-cache: /dev/null: is a device"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("damaged"), std::string::npos) << r.err;
  // Usage.
  const fs::path report = dir_ / "r.json";
  for (const std::string& flags :
       {std::string("--prompt-cache-all"), std::string("--prompt-cache-ro"),
        "--prompt-cache " + cache.string() + " --prompt-cache-all --prompt-cache-ro",
        "--prompt-cache " + shard + " --prompt-cache-ro",
        "--prompt-cache " + dir_.string(),
        "--prompt-cache " + report.string() + " --report-json " + report.string()}) {
    r = run(kPrompt, flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
  }
}

}  // namespace
}  // namespace ktier::test
