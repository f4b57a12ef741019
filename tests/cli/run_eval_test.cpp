// `ktier run` and `ktier eval` as the acceptance checks call them (issue 3 interface), on the
// tiny seed-0 checkpoint whose float64 goldens are committed (tests/fixtures/golden/).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "common/run_process.h"
#include "common/test_paths.h"
#include "tests/cli/run_cli_fixture.h"
#include "format/safetensors.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tests/common/same_bytes.h"

namespace ktier::test {
namespace {

namespace fs = std::filesystem;

TEST_F(RunEvalCli, EvalArgmaxMatchesReference) {
  const auto r = run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() + " --argmax");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> want;
  for (const auto& p : golden_.at("teacher_forced")) want.push_back(p.at("argmax").get<int>());
  EXPECT_EQ(r.out, join_ids(want) + "\n");
}

TEST_F(RunEvalCli, EvalLogitsFileIsPositionMajorF32AndIndependentOfChunkAndThreads) {
  const fs::path a = dir_ / "a.f32", b = dir_ / "b.f32";
  ASSERT_EQ(run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() +
                        " --logits-out " + a.string()).exit_code, 0);
  ASSERT_EQ(run_process(ktier() + " eval" + model() + " --ids " + prompt_ids() +
                        " --chunk 1 --threads 3 --logits-out " + b.string()).exit_code, 0);
  const auto& tf = golden_.at("teacher_forced");
  const size_t V = tf[0].at("logits").size();
  ASSERT_EQ(fs::file_size(a), tf.size() * V * 4);
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<float> la(tf.size() * V), lb(la.size());
  fa.read(reinterpret_cast<char*>(la.data()), static_cast<std::streamsize>(la.size() * 4));
  fb.read(reinterpret_cast<char*>(lb.data()), static_cast<std::streamsize>(lb.size() * 4));
  EXPECT_TRUE(same_bytes(la, lb));
  const double ref_max = golden_.at("logits_max_abs").get<double>();
  for (size_t t = 0; t < tf.size(); ++t)
    for (size_t i = 0; i < V; ++i)
      ASSERT_NEAR(la[t * V + i], tf[t].at("logits")[i].get<double>(), 1e-4 * ref_max) << t << "," << i;
}

// The checkpoint with its MXFP4 scales declared F8_E8M0 instead of U8 (the same bytes; K3-MODEL
// §5.8) gives the same logits, bit for bit.
TEST_F(RunEvalCli, F8E8M0ScalesGiveTheSameLogits) {
  const fs::path e8m0 = dir_.string() + "-e8m0";
  fs::remove_all(e8m0);
  fs::copy(dir_, e8m0);
  int rewritten = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(e8m0)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    for (auto& [name, entry] : header.items())
      if (name.ends_with(".weight_scale")) entry["dtype"] = "F8_E8M0", ++rewritten;
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    const uint64_t n2 = text.size();
    std::ofstream out(e.path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&n2), 8);
    out << text << bytes.substr(8 + n);
  }
  ASSERT_GT(rewritten, 0);
  const fs::path a = dir_ / "u8.f32", b = dir_ / "e8m0.f32";
  const std::string eval = ktier() + " eval --ids " + prompt_ids() + " --logits-out ";
  const auto u8 = run_process(eval + a.string() + model());
  const auto e8 = run_process(eval + b.string() + " -m " + e8m0.string());
  fs::remove_all(e8m0);
  ASSERT_EQ(u8.exit_code, 0) << u8.err;
  ASSERT_EQ(e8.exit_code, 0) << e8.err;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  const std::string la((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
  const std::string lb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(la.empty());
  EXPECT_TRUE(la == lb) << "the logits differ";
}

// -log softmax(row)[target], summed independently of runtime/perplexity.cpp (long double).
double nll_of(const float* row, size_t V, size_t target) {
  long double z = 0;
  for (size_t i = 0; i < V; ++i) z += std::exp(static_cast<long double>(row[i]));
  return static_cast<double>(std::log(z) - row[target]);
}

// `perplexity` scores each window's second half from the logits of that window alone (as eval
// computes them), agrees with the float64 reference's logits, never depends on --chunk or
// --threads, and refuses input it cannot score.
TEST_F(RunEvalCli, PerplexityScoresTheSecondHalfOfEachWindow) {
  std::vector<int> all;
  for (int i = 0; i < 21; ++i) all.push_back((i * 37 + 5) % 300);
  const fs::path json = dir_.string() + "-ppl.json", logits = dir_.string() + "-ppl.f32";
  // Windows of 8: two, the last 5 tokens left out; positions 4..6 of each scored (3 tokens).
  auto r = run_process(ktier() + " perplexity" + model() + " --ids " + join_ids(all) +
                       " -c 8 --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  double sum = 0;
  for (int w = 0; w < 2; ++w) {
    const std::vector<int> window(all.begin() + 8 * w, all.begin() + 8 * w + 8);
    ASSERT_EQ(run_process(ktier() + " eval" + model() + " --ids " + join_ids(window) +
                          " --logits-out " + logits.string()).exit_code, 0);
    const size_t V = fs::file_size(logits) / (8 * sizeof(float));
    std::vector<float> l(8 * V);
    std::ifstream in(logits, std::ios::binary);
    in.read(reinterpret_cast<char*>(l.data()), static_cast<std::streamsize>(l.size() * 4));
    for (size_t i = 4; i < 7; ++i)
      sum += nll_of(l.data() + i * V, V, static_cast<size_t>(window[i + 1]));
  }
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(j.at("tokens_scored"), 6);
  EXPECT_EQ(j.at("windows"), 2);
  EXPECT_EQ(j.at("window_tokens"), 8);
  EXPECT_EQ(j.at("text_tokens"), 21);
  EXPECT_NEAR(j.at("mean_nll").get<double>(), sum / 6, 1e-9);
  EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(sum / 6), 1e-9 * std::exp(sum / 6));
  EXPECT_NE(r.out.find("over 6 tokens (2 windows of 8)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("the last 5 left out"), std::string::npos) << r.err;
  // Same bytes whatever the chunking and threads: the printed text, and the mean NLL's double
  // (the JSON holds it to the last bit; the text rounds it).
  const fs::path json2 = dir_.string() + "-ppl2.json";
  const auto other = run_process(ktier() + " perplexity" + model() + " --ids " + join_ids(all) +
                                 " -c 8 --chunk 3 --threads 1 --json " + json2.string());
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(other.out, r.out);
  const nlohmann::json j2 = nlohmann::json::parse(std::ifstream(json2));
  EXPECT_EQ(j2.at("mean_nll").get<double>(), j.at("mean_nll").get<double>());
  EXPECT_EQ(j2.at("perplexity_error").get<double>(), j.at("perplexity_error").get<double>());
  fs::remove(json2);
  // The golden prompt as one window against the float64 reference's logits.
  const auto& tf = golden_.at("teacher_forced");
  const std::vector<int> prompt = golden_.at("prompt_ids").get<std::vector<int>>();
  const size_t T = prompt.size();
  ASSERT_EQ(tf.size(), T);
  double ref = 0;
  for (size_t i = T / 2; i + 1 < T; ++i) {
    const std::vector<float> row = tf[i].at("logits").get<std::vector<float>>();
    ref += nll_of(row.data(), row.size(), static_cast<size_t>(prompt[i + 1]));
  }
  const double ref_mean = ref / static_cast<double>(T - 1 - T / 2);
  r = run_process(ktier() + " perplexity" + model() + " --ids " + prompt_ids() + " --json " +
                  json.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json g = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(g.at("window_tokens"), static_cast<int>(T));  // shorter than -c: one window
  EXPECT_NE(r.err.find("the text has " + std::to_string(T) + " tokens, fewer than -c 512: one "
                       "window of " + std::to_string(T) + " instead"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(other.err.find("fewer than -c"), std::string::npos) << other.err;  // whole windows
  EXPECT_NEAR(g.at("mean_nll").get<double>(), ref_mean, 1e-4);
  // Input it cannot score: usage errors before the load.
  for (const std::string& bad :
       {std::string(" --ids 5"), std::string(" --ids 1,2"), std::string(" --ids 1,2,3 -c 2"),
        std::string(" --ids 1,2,3 --chunk 0"), std::string(" --ids 1,999999"), std::string(""),
        std::string(" --ids 1,2,3 -p x")}) {
    r = run_process(ktier() + " perplexity" + model() + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.err;
  }
  r = run_process(ktier() + " perplexity" + model() + " --ids 1,2,3");  // the fewest: one scored
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("over 1 token (1 window of 3)"), std::string::npos) << r.out;
  fs::remove(json);
  fs::remove(logits);
}

TEST_F(RunEvalCli, GreedyRunPrintsReferenceIdsAfterTheText) {
  const auto r = run_process(ktier() + " run" + model() + " --ids " + prompt_ids() +
                             " -n 20 --temp 0 --print-ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(last_line(r.out), join_ids(golden_.at("greedy").get<std::vector<int>>()));
  EXPECT_NE(r.err.find("prompt 12 tokens, generated 20"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
  // "020" is twenty, as written (CLI11 alone read it as octal 16); spaces and a '+' as strtoll
  // took them; a subnormal float is a double's value, not an underflow.
  for (const char* n : {"020", "' +20 '"}) {
    const auto padded = run_process(ktier() + " run" + model() + " --ids " + prompt_ids() +
                                    " -n " + n + " --temp 0 --min-p 1e-310 --print-ids");
    ASSERT_EQ(padded.exit_code, 0) << n << ": " << padded.err;
    EXPECT_EQ(padded.out, r.out) << n;
  }
}

// The stop ids (K3-MODEL D3): each --stop-id ends the run right after it is generated, beside
// the config's eos_token_id; a checkpoint whose config.json and generation_config.json name no
// eos_token_id runs only with one (exit 2 naming the files otherwise: it would never end its
// text), or with -n 0; a --stop-id outside the vocabulary is refused by value.
TEST_F(RunEvalCli, RunStopsAtEachStopIdAndNeedsOne) {
  const auto greedy = golden_.at("greedy").get<std::vector<int>>();
  // The first greedy id past the first that the run has not generated before.
  size_t k = 1;
  while (k < greedy.size() && std::count(greedy.begin(), greedy.begin() + k, greedy[k]) > 0) ++k;
  ASSERT_LT(k, greedy.size());
  const std::string run_ids = " --ids " + prompt_ids() + " -n 20 --print-ids";
  const auto stopped = run_process(ktier() + " run" + model() + run_ids + " --stop-id " +
                                   std::to_string(greedy[k]));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(last_line(stopped.out), join_ids({greedy.begin(), greedy.begin() + k + 1}));
  EXPECT_NE(stopped.err.find("generated " + std::to_string(k + 1) + " (stop token)"),
            std::string::npos)
      << stopped.err;

  const fs::path bare = dir_.string() + "-no-eos";
  fs::remove_all(bare);
  fs::copy(dir_, bare);
  for (const char* name : {"config.json", "generation_config.json"}) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(bare / name));
    j["eos_token_id"] = nullptr;
    if (j.contains("text_config")) j["text_config"]["eos_token_id"] = nullptr;
    std::ofstream(bare / name) << j.dump();
  }
  const std::string bare_run = ktier() + " run -m " + bare.string() + run_ids;
  const auto refused = run_process(bare_run);
  const auto one = run_process(bare_run + " --stop-id " + std::to_string(greedy[k]));
  const auto none_generated = run_process(ktier() + " run -m " + bare.string() + " --ids " +
                                          prompt_ids() + " -n 0");
  const auto outside = run_process(bare_run + " --stop-id 0 --stop-id 320");
  const auto ignoring = run_process(bare_run + " --ignore-eos");  // runs to -n 20 either way
  // Several ids in one flag, as --ids takes them (it said "Could not convert"); each counts,
  // whichever place it has: beside an id the run does not generate before its k+1 tokens.
  int never = 1;
  while (std::count(greedy.begin(), greedy.begin() + k + 1, never) > 0) ++never;
  const auto listed = run_process(bare_run + " --stop-id " + std::to_string(never) + "," +
                                  std::to_string(greedy[k]));
  const auto listed_first = run_process(bare_run + " --stop-id " + std::to_string(greedy[k]) +
                                        "," + std::to_string(never));
  fs::remove(bare / "generation_config.json");
  const auto config_only = run_process(bare_run);
  fs::remove_all(bare);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_EQ(refused.out, "");
  EXPECT_NE(refused.err.find(bare.string() + ": config.json and generation_config.json name no "
                             "eos_token_id"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("pass --stop-id ID"), std::string::npos) << refused.err;
  EXPECT_EQ(config_only.exit_code, 2);
  EXPECT_NE(config_only.err.find(": config.json (and no generation_config.json) names no "
                                 "eos_token_id"),
            std::string::npos)
      << config_only.err;
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.out, stopped.out);
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(listed.out, stopped.out);
  ASSERT_EQ(listed_first.exit_code, 0) << listed_first.err;
  EXPECT_EQ(listed_first.out, stopped.out);
  EXPECT_EQ(none_generated.exit_code, 0) << none_generated.err;
  ASSERT_EQ(ignoring.exit_code, 0) << ignoring.err;
  EXPECT_EQ(last_line(ignoring.out), join_ids({greedy.begin(), greedy.begin() + 20}));
  EXPECT_EQ(outside.exit_code, 2);
  EXPECT_NE(outside.err.find("--stop-id 320 is outside the vocabulary (0..319"), std::string::npos)
      << outside.err;
}

// llama-cli's --ignore-eos (the stop ids never drawn: the answer runs to -n) and -l/--logit-bias
// ID(+|-)BIAS (added to the logit before the penalties; -inf: never drawn); bad values exit 2
// naming the flag.
TEST_F(RunEvalCli, IgnoreEosAndLogitBiasAsLlamaCli) {
  const auto greedy = golden_.at("greedy").get<std::vector<int>>();
  size_t k = 1;  // as above: greedy[k] is not among the ids before it
  while (k < greedy.size() && std::count(greedy.begin(), greedy.begin() + k, greedy[k]) > 0) ++k;
  ASSERT_LT(k, greedy.size());
  const std::string cmd = ktier() + " run" + model() + " --ids " + prompt_ids() + " --print-ids";
  const std::string stop = std::to_string(greedy[k]);
  const auto ids_of = [](const std::string& line) {
    std::vector<int> ids;
    std::istringstream in(line);
    for (std::string id; std::getline(in, id, ',');) ids.push_back(std::stoi(id));
    return ids;
  };
  const auto ignoring = run_process(cmd + " -n 20 --stop-id " + stop + " --ignore-eos");
  ASSERT_EQ(ignoring.exit_code, 0) << ignoring.err;
  const std::vector<int> ran = ids_of(last_line(ignoring.out));
  ASSERT_EQ(ran.size(), 20u) << ignoring.out;
  EXPECT_EQ(std::vector<int>(ran.begin(), ran.begin() + k),
            std::vector<int>(greedy.begin(), greedy.begin() + k));
  EXPECT_EQ(std::count(ran.begin(), ran.end(), greedy[k]), 0) << ignoring.out;
  EXPECT_NE(ran[k], greedy[k]);

  const std::string first = std::to_string(greedy[0]);
  const auto banned = run_process(cmd + " -n 1 --logit-bias " + first + "-inf");
  ASSERT_EQ(banned.exit_code, 0) << banned.err;
  EXPECT_NE(last_line(banned.out), first);
  // Each flag counts; a large finite bias draws its id whatever the logits.
  int other = 1;
  while (other == greedy[0] || other == greedy[1]) ++other;
  const auto pushed = run_process(cmd + " -n 3 -l " + first + "-inf -l " +
                                  std::to_string(other) + "+1e30 --logit-bias 7-1");
  ASSERT_EQ(pushed.exit_code, 0) << pushed.err;
  const std::string o = std::to_string(other);
  EXPECT_EQ(last_line(pushed.out), o + "," + o + "," + o);
  EXPECT_EQ(last_line(run_process(cmd + " -n 20 -l 0+0").out), join_ids(greedy));

  // Every id banned: refused before the load (the sampler would draw id 0 from a row of -inf).
  std::string all_but_stop;
  for (int id = 0; id < 320; ++id)
    if (id != greedy[k]) all_but_stop += " -l " + std::to_string(id) + "-inf";
  const auto open = run_process(cmd + " -n 3 --stop-id " + stop + all_but_stop);
  ASSERT_EQ(open.exit_code, 0) << open.err;
  EXPECT_EQ(last_line(open.out), stop);  // the one id left, which stops the run
  const auto shut = run_process(cmd + " -n 3 --ignore-eos --stop-id " + stop + all_but_stop);
  EXPECT_EQ(shut.exit_code, 2) << shut.err;
  EXPECT_NE(shut.err.find("--logit-bias and --ignore-eos leave no token that can be drawn: each "
                          "of the 320 ids"),
            std::string::npos)
      << shut.err;
  EXPECT_EQ(shut.out, "");
  for (const std::string bad : {"5", "5+", "x+1", "320+1", "5+inf", "5-nan", "5+1e60", "5*2"}) {
    const auto r = run_process(cmd + " -n 1 --logit-bias " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--logit-bias '" + bad + "'"), std::string::npos) << r.err;
  }
}

TEST_F(RunEvalCli, RunsFromIdsWithoutTokenizerFiles) {
  const fs::path bare = dir_.string() + "-bare";
  fs::remove_all(bare);
  fs::copy(dir_, bare);
  // Half a tokenizer (tokenizer_config.json missing): --ids runs print ids and say why; text
  // prompts are refused naming the missing file.
  fs::remove(bare / "tokenizer_config.json");
  const std::string ids_run =
      ktier() + " run -m " + bare.string() + " --ids " + prompt_ids() + " -n 5";
  const auto half = run_process(ids_run);
  const auto half_text = run_process(ktier() + " run -m " + bare.string() + " -p hello -n 2");
  fs::remove(bare / "tiktoken.model");
  const auto r = run_process(ids_run);
  const auto text = run_process(ktier() + " run -m " + bare.string() + " -p hello -n 2");
  fs::remove_all(bare);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto greedy = golden_.at("greedy").get<std::vector<int>>();
  EXPECT_EQ(r.out, join_ids({greedy.begin(), greedy.begin() + 5}) + "\n");
  EXPECT_EQ(text.exit_code, 2);
  EXPECT_NE(text.err.find("tiktoken.model"), std::string::npos) << text.err;
  ASSERT_EQ(half.exit_code, 0) << half.err;
  EXPECT_EQ(half.out, r.out);
  EXPECT_NE(half.err.find("tokenizer_config.json: file not found; running from --ids without the "
                          "tokenizer"),
            std::string::npos)
      << half.err;
  EXPECT_EQ(half_text.exit_code, 2);
  EXPECT_NE(half_text.err.find("tokenizer_config.json: file not found; text prompts need the "
                               "tokenizer (run from token ids with --ids instead)"),
            std::string::npos)
      << half_text.err;
}

TEST_F(RunEvalCli, TextPromptStreamsTextAndSeededSamplingRepeats) {
  const std::string cmd = ktier() + " run" + model() +
                          " -p 'The lighthouse keeper' -n 12 --temp 0.9 --top-k 40 --top-p 0.95 "
                          "--seed 11 --print-ids";
  // Explicit counts: the default may itself be 1 on a one-core runner.
  const auto a = run_process(cmd + " --threads 1"), b = run_process(cmd + " --threads 3");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  std::string short_seed = cmd;  // llama.cpp's -s
  short_seed.replace(short_seed.find("--seed 11"), 9, "-s 11");
  EXPECT_EQ(run_process(short_seed + " --threads 1").out, a.out);
  const auto c = run_process(ktier() + " run" + model() +
                             " -p 'The lighthouse keeper' -n 12 --temp 0.9 --seed 12 --print-ids");
  EXPECT_NE(last_line(a.out), last_line(c.out));
  // -s -1 (llama.cpp's random seed): the seed drawn is logged, and giving it repeats the run.
  const std::string random_cmd = ktier() + " run" + model() +
                                 " -p 'The lighthouse keeper' -n 12 --temp 0.9 --print-ids -s ";
  const fs::path seed_report = dir_.string() + "-seed.json";
  const auto r = run_process(random_cmd + "-1 --report-json " + seed_report.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string mark = "sampling seed ";
  const size_t at = r.err.find(mark);
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string drawn = r.err.substr(at + mark.size(), r.err.find(' ', at + mark.size()) -
                                                               (at + mark.size()));
  EXPECT_EQ(run_process(random_cmd + drawn).out, r.out) << "seed " << drawn;
  std::ifstream seed_in(seed_report);  // the report keeps it too (a log level may hide the line)
  EXPECT_EQ(std::to_string(nlohmann::json::parse(seed_in).at("sampling_seed").get<uint64_t>()),
            drawn);
  fs::remove(seed_report);
}

// -f reads the prompt as llama.cpp's -f does: the file less one final newline (an editor's), so
// a file saved from `-p`'s text runs what -p runs, in run and perplexity alike; a second
// newline is text. A file holding only a newline is an empty prompt.
TEST_F(RunEvalCli, APromptFileLosesOneFinalNewline) {
  const fs::path file = dir_.string() + "-prompt.txt";
  const auto write = [&](const std::string& text) { std::ofstream(file) << text; };
  const std::string text = "The lighthouse keeper";
  const std::string run = ktier() + " run" + model() + " -n 6 --temp 0 --print-ids ";
  const ProcessResult given = run_process(run + "-p '" + text + "'");
  ASSERT_EQ(given.exit_code, 0) << given.err;
  const std::string count = "prompt 17 tokens";
  ASSERT_NE(given.err.find(count), std::string::npos) << given.err;
  write(text + "\n");
  const ProcessResult from_file = run_process(run + "-f " + file.string());
  EXPECT_EQ(from_file.out, given.out);
  EXPECT_NE(from_file.err.find(count), std::string::npos) << from_file.err;
  EXPECT_EQ(run_process("printf '" + text + "\\n' | " + run + "-f -").out, given.out);
  const std::string ppl = ktier() + " perplexity" + model() + " -c 8 ";
  const ProcessResult ppl_given = run_process(ppl + "-p '" + text + "'");
  ASSERT_EQ(ppl_given.exit_code, 0) << ppl_given.err;
  EXPECT_EQ(run_process(ppl + "-f " + file.string()).out, ppl_given.out);
  write(text + "\n\n");
  const ProcessResult two = run_process(run + "-f " + file.string());
  EXPECT_NE(two.err.find("prompt 18 tokens"), std::string::npos) << two.err;
  write("\n");
  const ProcessResult empty = run_process(run + "-f " + file.string());
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_NE(empty.err.find("has no text"), std::string::npos) << empty.err;
  fs::remove(file);
}

// A presence penalty past any logit keeps every id already in the sequence out (llama.cpp's
// rule, greedy included) where plain greedy repeats; the same for any thread count. Values out
// of range exit 2 naming the flag.
TEST_F(RunEvalCli, PenaltiesKeepIdsAlreadyInTheSequenceOut) {
  const auto ids_of = [](const std::string& line) {
    std::vector<std::string> ids;
    std::istringstream in(line);
    for (std::string id; std::getline(in, id, ',');) ids.push_back(id);
    return ids;
  };
  const std::string cmd = ktier() + " run" + model() + " --ids " + prompt_ids() +
                          " -n 40 --print-ids --threads ";
  const auto plain = run_process(cmd + "1");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto repeats = [&](const std::string& out) {
    std::vector<std::string> seen = ids_of(prompt_ids());
    for (const std::string& id : ids_of(last_line(out))) {
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) return true;
      seen.push_back(id);
    }
    return false;
  };
  ASSERT_TRUE(repeats(plain.out)) << "the fixture's greedy answer repeats no id: " << plain.out;
  const std::string penalized = " --presence-penalty 1e6 --repeat-last-n -1";
  const auto a = run_process(cmd + "1" + penalized), b = run_process(cmd + "3" + penalized);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_FALSE(repeats(a.out)) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_GE(ids_of(last_line(a.out)).size(), 8u) << a.out;
  // The default window is llama.cpp's 64 ids.
  const std::string longer = ktier() + " run" + model() + " --ids " + prompt_ids() +
                             " -n 60 --print-ids --presence-penalty 1e6";
  const auto by_default = run_process(longer);
  ASSERT_EQ(by_default.exit_code, 0) << by_default.err;
  EXPECT_EQ(run_process(longer + " --repeat-last-n 64").out, by_default.out);
  EXPECT_NE(run_process(ktier() + " run --help").out.find("--repeat-last-n INT=64"),
            std::string::npos);
  for (const std::string bad : {"--repeat-penalty 0", "--repeat-last-n -2",
                                "--presence-penalty nan", "--frequency-penalty inf"}) {
    const auto r = run_process(cmd + "1 " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.err;
  }
}

// -n -1 (llama.cpp's; -2 too): until a stop id or the context is full. The fixture's greedy
// answer has no stop id in its first 40 tokens, so -c 30 with a 12-token prompt gives its first
// 19.
TEST_F(RunEvalCli, NPredictMinusOneFillsTheContext) {
  const std::string cmd = ktier() + " run" + model() + " --ids " + prompt_ids() + " --print-ids";
  const auto plain = run_process(cmd + " -n 40");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_NE(plain.err.find("generated 40 (length limit)"), std::string::npos) << plain.err;
  const auto filled = run_process(cmd + " -n -1 -c 30");
  ASSERT_EQ(filled.exit_code, 0) << filled.err;
  const std::string ids = last_line(filled.out);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ',') + 1, 30 - 12 + 1) << ids;
  EXPECT_NE(filled.err.find("generated 19 (context end)"), std::string::npos) << filled.err;
  EXPECT_EQ(last_line(plain.out).rfind(ids + ",", 0), 0u) << ids;
  EXPECT_EQ(run_process(cmd + " -n -2 -c 30").out, filled.out);  // llama.cpp's other spelling
  // Without -c: 4096 positions, far past where the fixture's answer reaches a stop id.
  const auto unbounded = run_process(cmd + " -n -1");
  ASSERT_EQ(unbounded.exit_code, 0) << unbounded.err;
  EXPECT_NE(unbounded.err.find(" (stop token)"), std::string::npos) << unbounded.err;
  for (const std::string bad : {" -n -3", " -n -1 -c 11"}) {
    const auto r = run_process(cmd + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
  }
}

// Special tokens are generated like any other but not printed as text unless --special (as
// llama.cpp); --print-ids lists them either way.
TEST_F(RunEvalCli, SpecialTokensAreHiddenFromTheTextUnlessAsked) {
  // Sampled hot (seed fixed) so that the tiny model's 64 tokens include special ones.
  const std::string cmd = ktier() + " run" + model() + " --ids " + prompt_ids() +
                          " -n 64 --temp 1.5 --seed 2 --print-ids";
  const auto plain = run_process(cmd), special = run_process(cmd + " --special");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(special.exit_code, 0) << special.err;
  const std::string ids = last_line(plain.out);
  ASSERT_EQ(ids, last_line(special.out)) << "the same tokens are generated";
  auto tok = tok::Tokenizer::load(dir_);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  std::vector<std::string> hidden;
  for (size_t at = 0; at < ids.size();) {
    const size_t comma = std::min(ids.find(',', at), ids.size());
    const uint32_t id = static_cast<uint32_t>(std::stoul(ids.substr(at, comma - at)));
    if (tok->is_special(id)) hidden.push_back(std::string(*tok->token_bytes(id)));
    at = comma + 1;
  }
  ASSERT_FALSE(hidden.empty()) << "the fixture's 64 tokens include no special token: " << ids;
  const std::string plain_text = plain.out.substr(0, plain.out.size() - ids.size() - 1);
  const std::string special_text = special.out.substr(0, special.out.size() - ids.size() - 1);
  for (const std::string& content : hidden) {
    EXPECT_EQ(plain_text.find(content), std::string::npos) << content << " printed by default";
    EXPECT_NE(special_text.find(content), std::string::npos) << content << " hidden with --special";
  }
}

// --chat runs the rendered chat prompt (tokenizer/chat.h; the same ids given with --ids) and
// stops right after the model closes its response (<|close|>) or its message (eos), sampled
// hot so that the tiny model's tokens are varied; it takes text only.
TEST_F(RunEvalCli, ChatRunsTheRenderedPromptAndStopsAtTheResponseClose) {
  auto tok = tok::Tokenizer::load(dir_);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const std::string text = "Tell me about the lighthouse <|close|>";
  auto markers = tok::chat_markers(*tok);
  ASSERT_TRUE(markers.is_ok()) << markers.status().message();
  const std::vector<uint32_t> rendered = tok::render_user_turn(*tok, *markers, text);
  std::vector<int> ids(rendered.begin(), rendered.end());
  // Seeds whose raw runs reach the length limit, the close marker and eos (checked below).
  int closed = 0, ended = 0;
  for (const uint64_t seed : {1, 5, 7}) {
    const std::string sampling = " -n 48 --temp 1.5 --seed " + std::to_string(seed) + " --print-ids";
    const auto chat = run_process(ktier() + " run" + model() + " --chat -p '" + text + "'" + sampling);
    const auto raw = run_process(ktier() + " run" + model() + " --ids " + join_ids(ids) + sampling);
    ASSERT_EQ(chat.exit_code, 0) << chat.err;
    ASSERT_EQ(raw.exit_code, 0) << raw.err;
    EXPECT_NE(chat.err.find("prompt " + std::to_string(ids.size()) + " tokens"), std::string::npos)
        << chat.err;
    // The raw run's ids up to and including the first close or eos.
    std::string want;
    const std::string all = last_line(raw.out);
    for (size_t at = 0; at < all.size();) {
      const size_t comma = std::min(all.find(',', at), all.size());
      const std::string id = all.substr(at, comma - at);
      want += (want.empty() ? "" : ",") + id;
      const uint32_t v = static_cast<uint32_t>(std::stoul(id));
      if (v == markers->close || v == markers->end_of_msg) {
        (v == markers->close ? closed : ended) += 1;
        break;
      }
      at = comma + 1;
    }
    EXPECT_EQ(last_line(chat.out), want) << "seed " << seed;
  }
  EXPECT_EQ(closed, 1) << "one run stops at <|close|>";
  EXPECT_EQ(ended, 1) << "one run stops at <|end_of_msg|>";
  EXPECT_EQ(run_process(ktier() + " run" + model() + " --chat --ids 1,2 -n 1").exit_code, 2);
  // --special only shows special tokens in the output, which a chat answer may hold too.
  EXPECT_EQ(run_process(ktier() + " run" + model() + " --chat --special -p hi -n 1").exit_code, 0);
}

// A -p prompt's special-token names are their ids (as llama-cli and serve's completions read a
// prompt): the run is that of those ids; --no-parse-special reads them as text.
TEST_F(RunEvalCli, APromptsSpecialTokenNamesAreTheirIdsUnlessReadAsText) {
  auto tok = tok::Tokenizer::load(dir_);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const std::string text = "the lighthouse<|end_of_msg|>keeper";
  auto ids_of = [&](bool names_as_ids) {
    const std::vector<uint32_t> ids = tok->encode(text, names_as_ids);
    return join_ids(std::vector<int>(ids.begin(), ids.end()));
  };
  ASSERT_NE(ids_of(true), ids_of(false)) << "the name is one of the tokenizer's added tokens";
  const std::string sampling = " -n 6 --temp 1.5 --seed 3 --print-ids";
  for (const bool names_as_ids : {true, false}) {
    const std::string flag = names_as_ids ? "" : " --no-parse-special";
    const auto from_text = run_process(ktier() + " run" + model() + " -p '" + text + "'" + flag +
                                       sampling);
    const std::string ids = ids_of(names_as_ids);
    const auto from_ids = run_process(ktier() + " run" + model() + " --ids " + ids + sampling);
    ASSERT_EQ(from_text.exit_code, 0) << from_text.err;
    ASSERT_EQ(from_ids.exit_code, 0) << from_ids.err;
    EXPECT_EQ(last_line(from_text.out), last_line(from_ids.out)) << flag;
    const size_t n = std::count(ids.begin(), ids.end(), ',') + 1;
    EXPECT_NE(from_text.err.find("prompt " + std::to_string(n) + " tokens"), std::string::npos)
        << flag << ": " << from_text.err;
  }
  EXPECT_EQ(run_process(ktier() + " run" + model() + " --ids 1,2 --no-parse-special -n 1")
                .exit_code, 2);
}

// The interactive chat tests' conversation (two messages, answers of at most 9 greedy ids), and
// the checkpoint's tokenizer and chat markers.
constexpr const char* kFirstMessage = "Tell me about the lighthouse";
constexpr const char* kSecondMessage = "And the lamp?";
constexpr const char* kNineIds = " -n 9 --print-ids";
struct ChatStart {
  std::optional<tok::Tokenizer> tok;
  std::optional<tok::ChatMarkers> markers;
  std::string first_answer;  // `run --chat -p kFirstMessage` kNineIds's ids
};
// `run` is "ktier run -m DIR" of the checkpoint in `dir`.
void start_chat(const fs::path& dir, const std::string& run, ChatStart& out) {
  auto loaded = tok::Tokenizer::load(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  out.tok.emplace(std::move(*loaded));
  auto m = tok::chat_markers(*out.tok);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  out.markers = *m;
  const auto r = run_process(run + " --chat -p '" + kFirstMessage + "'" + kNineIds);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  out.first_answer = last_line(r.out);
}
// A fresh run (`run` as for start_chat) over the rendered `history` ids, kNineIds and `flags`,
// stopping at <|close|> as --chat does (an --ids run stops there only when told).
ProcessResult run_history(const std::string& run, const ChatStart& chat,
                          const std::vector<uint32_t>& history, const std::string& flags = "") {
  return run_process(run + " --ids " + join_ids(std::vector<int>(history.begin(), history.end())) +
                     kNineIds + flags + " --stop-id " + std::to_string(chat.markers->close));
}

// A --stop-id the answer stops at (not <|close|> or <|end_of_msg|>) is not part of the
// conversation: the next turn closes the response without it, as after a length limit.
TEST_F(RunEvalCli, AChatStopIdIsLeftOutOfTheConversation) {
  ChatStart started;
  ASSERT_NO_FATAL_FAILURE(start_chat(dir_, ktier() + " run" + model(), started));
  const auto& [tok, markers, ids1] = started;
  const std::string first = kFirstMessage, second = kSecondMessage, n = kNineIds;
  // The stop: the first answer's first id after its first that is new and not markup.
  const std::vector<int> answer = split_ids(ids1);
  size_t k = 1;
  while (k < answer.size() &&
         (answer[k] == static_cast<int>(markers->close) ||
          answer[k] == static_cast<int>(markers->end_of_msg) ||
          std::find(answer.begin(), answer.begin() + k, answer[k]) != answer.begin() + k))
    ++k;
  ASSERT_LT(k, answer.size()) << ids1;
  const uint32_t stop = static_cast<uint32_t>(answer[k]);
  const std::string stop_flag = " --stop-id " + std::to_string(stop);
  std::vector<uint32_t> history = tok::render_user_turn(*tok, *markers, first);
  history.insert(history.end(), answer.begin(), answer.begin() + k);
  const std::vector<uint32_t> closing =
      tok::end_assistant_turn(*tok, *markers, stop, /*last_is_stop=*/true);
  const std::vector<uint32_t> kept = tok::end_assistant_turn(*tok, *markers, stop, false);
  EXPECT_EQ(closing, std::vector<uint32_t>(kept.begin() + 1, kept.end()));
  const std::vector<uint32_t> second_ids = tok::render_user_turn(*tok, *markers, second);
  history.insert(history.end(), closing.begin(), closing.end());
  history.insert(history.end(), second_ids.begin(), second_ids.end());
  const auto fresh = run_history(ktier() + " run" + model(), started, history, stop_flag);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  const auto talk = run_process("printf '" + second + "\\n' | " + ktier() + " run" + model() +
                                " --chat -i -p '" + first + "'" + n + stop_flag);
  ASSERT_EQ(talk.exit_code, 0) << talk.err;
  EXPECT_NE(talk.out.find("\n" + join_ids(std::vector<int>(answer.begin(),
                                                            answer.begin() + k + 1)) + "\n"),
            std::string::npos)
      << "the first answer ends at the stop: " << talk.out;
  EXPECT_EQ(last_line(talk.out), last_line(fresh.out)) << talk.out;
  EXPECT_NE(talk.err.find("prompt " + std::to_string(closing.size() + second_ids.size()) +
                          " tokens, generated"),
            std::string::npos) << talk.err;
}

// --chat --interactive goes on in the same sequence: the second answer is what a fresh greedy
// run over the whole rendered history (first message, first answer, its close, second message)
// gives; a conversation that outgrows -c/--ctx-size stops with exit 4 naming it; the flags'
// misuses exit 2.
TEST_F(RunEvalCli, InteractiveChatContinuesTheSequence) {
  ChatStart started;
  ASSERT_NO_FATAL_FAILURE(start_chat(dir_, ktier() + " run" + model(), started));
  const auto& [tok, markers, ids1] = started;
  const std::string first = kFirstMessage, second = kSecondMessage, n = kNineIds;
  const std::vector<uint32_t> first_ids = tok::render_user_turn(*tok, *markers, first);
  const std::vector<uint32_t> second_ids = tok::render_user_turn(*tok, *markers, second);
  std::vector<uint32_t> history = first_ids;
  for (const int id : split_ids(ids1)) history.push_back(static_cast<uint32_t>(id));
  const uint32_t last = history.back();
  history.pop_back();  // never run: the second turn starts with it
  // (Its stops are markup: <|close|> and config.json's eos, <|end_of_msg|>.)
  const std::vector<uint32_t> closing =
      tok::end_assistant_turn(*tok, *markers, last, /*last_is_stop=*/false);
  history.insert(history.end(), closing.begin(), closing.end());
  history.insert(history.end(), second_ids.begin(), second_ids.end());
  const auto fresh = run_history(ktier() + " run" + model(), started, history);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  const std::string ids2 = last_line(fresh.out);
  const std::string chat = ktier() + " run" + model() + " --chat -i -p '" + first + "'" + n;
  const auto talk = run_process("printf '" + second + "\\n' | " + chat);
  ASSERT_EQ(talk.exit_code, 0) << talk.err;
  const size_t at1 = talk.out.find("\n" + ids1 + "\n");
  ASSERT_NE(at1, std::string::npos) << talk.out;
  EXPECT_EQ(last_line(talk.out), ids2) << talk.out;
  EXPECT_GT(talk.out.size() - ids2.size(), at1 + ids1.size()) << "the second answer comes after";
  // The first message may come from standard input too: the same conversation (with a CRLF line
  // and a last line without its newline).
  const auto both_piped = run_process("printf '" + first + "\\r\\n" + second + "' | " + ktier() +
                                      " run" + model() + " --chat -i" + n);
  ASSERT_EQ(both_piped.exit_code, 0) << both_piped.err;
  EXPECT_EQ(both_piped.out, talk.out);
  EXPECT_NE(talk.err.find("prompt " + std::to_string(closing.size() + second_ids.size()) +
                          " tokens, generated"),
            std::string::npos) << talk.err;
  // -c at the boundaries: a turn of K ids with -n 9 takes K + 8 positions (its last token is
  // never run). The first turn's alone: exit 2 (usage) below it; the conversation's: exit 4.
  const int64_t first_needs = static_cast<int64_t>(first_ids.size()) + 8;
  const int64_t both_need =
      first_needs + static_cast<int64_t>(closing.size() + second_ids.size()) + 8;
  const std::string single = ktier() + " run" + model() + " --chat -p '" + first + "'" + n + " -c ";
  EXPECT_EQ(run_process(single + std::to_string(first_needs)).exit_code, 0);
  const auto tight = run_process(single + std::to_string(first_needs - 1));
  EXPECT_EQ(tight.exit_code, 2) << tight.err;
  const std::string piped = "printf '" + second + "\\n' | " + chat + " -c ";
  const auto exact = run_process(piped + std::to_string(both_need));
  EXPECT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_EQ(last_line(exact.out), ids2);
  // Refused before its turn ran: the first answer's trace is whole and kept.
  const fs::path trace = dir_.string() + "-chat.ktrace";
  const auto full = run_process(piped + std::to_string(both_need - 1) + " --trace " +
                                trace.string());
  EXPECT_EQ(full.exit_code, 4) << full.err;
  EXPECT_NE(full.err.find("past -c/--ctx-size " + std::to_string(both_need - 1)), std::string::npos)
      << full.err;
  const auto info = run_process(ktier() + " trace info " + trace.string());
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("tokens:           " + std::to_string(first_needs)), std::string::npos)
      << info.out;
  // Without -c, a conversation whose first message comes from standard input has room for it
  // and -n past 4096 (the auto size was -n - 1, which no message fits; exit 4 blamed "-c").
  const auto long_n =
      run_process("echo hi | " + ktier() + " run" + model() + " --chat -i -n 5000");
  EXPECT_EQ(long_n.exit_code, 0) << long_n.err;
  EXPECT_EQ(run_process(ktier() + " run" + model() + " -i -p hi -n 2").exit_code, 2);
  const auto empty = run_process(ktier() + " run" + model() + " -p '' -n 2");
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_NE(empty.err.find("the prompt is empty (-p \"\")"), std::string::npos) << empty.err;
  const auto no_ids = run_process(ktier() + " run" + model() + " --ids ' ' -n 2");
  EXPECT_EQ(no_ids.exit_code, 2);
  EXPECT_NE(no_ids.err.find("--ids is empty: give at least one token id"), std::string::npos)
      << no_ids.err;
  const auto eval_no_ids = run_process(ktier() + " eval" + model() + " --ids ' ' --argmax");
  EXPECT_EQ(eval_no_ids.exit_code, 2);
  EXPECT_NE(eval_no_ids.err.find("--ids is empty: give at least one token id"), std::string::npos)
      << eval_no_ids.err;
  EXPECT_EQ(run_process("echo hi | " + ktier() + " run" + model() + " --chat -i -f - -n 2").exit_code, 2);
  // Standard input by another name: the whole conversation became the first message.
  for (const char* name : {"/dev/stdin", "/dev/fd/0"}) {
    const auto same = run_process("printf 'hi\\nthere\\n' | " + ktier() + " run" + model() +
                                  " --chat -i -f " + name + " -n 2");
    EXPECT_EQ(same.exit_code, 2) << name << ": " << same.err;
    EXPECT_NE(same.err.find("--interactive reads the conversation from standard input"),
              std::string::npos)
        << name << ": " << same.err;
  }
  EXPECT_EQ(run_process(ktier() + " run" + model() + " --chat -p hi -n 2 -c 3").exit_code, 2);
  // Standard input a folder: named. Closed: read as empty (before, the descriptor went to the
  // next file ktier opened and a shard's bytes became the conversation).
  const auto folder =
      run_process(ktier() + " run" + model() + " --chat -i -n 2 < " + dir_.string());
  EXPECT_EQ(folder.exit_code, 2) << folder.err;
  EXPECT_NE(folder.err.find("standard input: is a directory"), std::string::npos) << folder.err;
  const auto closed = run_process(ktier() + " run" + model() + " --chat -i -n 2 <&-");
  EXPECT_EQ(closed.exit_code, 0) << closed.err;
  EXPECT_EQ(closed.out, "");
}

// Outputs that are not plain new files: a FIFO gets the whole report (the writability probe
// must not open it and end its reader's input), the run's own stdout (/dev/stdout redirected to
// a file) gets the report after the ids instead of truncating them, a dangling symlink's target
// is created. Seeds are decimal: 010 is ten, not octal eight.
TEST_F(RunEvalCli, OutputsToFifosStdoutAndSymlinks) {
  const fs::path base = dir_.string() + "-outputs";
  fs::remove_all(base);
  fs::create_directories(base);
  const std::string run = ktier() + " run" + model() + " --ids 1,2 -n 3 --print-ids";
  const fs::path fifo = base / "fifo", got = base / "got.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  // timeout: if ktier failed before opening the FIFO, cat would wait for a writer forever.
  auto r = run_process("timeout 60 cat " + fifo.string() + " > " + got.string() + " & " + run +
                       " --report-json " + fifo.string() + "; rc=$?; wait; exit $rc");
  EXPECT_EQ(r.exit_code, 0) << r.err;  // ktier's status, not wait's (always 0)
  const std::string report = read_text(got);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report.rfind("{", 0), 0u) << report;
  EXPECT_EQ(report.back(), '\n') << report;  // the whole report, not a prefix
  EXPECT_TRUE(nlohmann::json::accept(report)) << report;
  const fs::path both = base / "both.txt";
  r = run_process(run + " --report-json /dev/stdout > " + both.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_text(both);
  const size_t brace = text.find("\n{");
  ASSERT_NE(brace, std::string::npos) << text;
  EXPECT_NE(text.substr(0, brace).find_first_of("0123456789"), std::string::npos) << text;
  fs::create_symlink(base / "later.f32", base / "link");
  r = run_process(ktier() + " eval" + model() + " --ids 1,2 --logits-out " +
                  (base / "link").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(base / "later.f32"));
  const auto seeded = [&](const char* seed) {
    return run_process(run + " --temp 1 --seed " + seed).out;
  };
  EXPECT_EQ(seeded("010"), seeded("10"));
  EXPECT_NE(seeded("010"), seeded("8"));
  fs::remove_all(base);
}

// Positions past max_position_embeddings still decode (the CPU path has no table to overflow)
// but are said to be outside what the model was trained on.
TEST_F(RunEvalCli, RunPastMaxPositionEmbeddingsWarns) {
  const fs::path short_ctx = dir_.string() + "-short";
  fs::remove_all(short_ctx);
  fs::copy(dir_, short_ctx);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(short_ctx / "config.json"));
  nlohmann::json& where = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  where["max_position_embeddings"] = 4;
  std::ofstream(short_ctx / "config.json") << cfg.dump(2);
  // Positions run: the prompt's, then one per generated token but the last (never fed back).
  const auto r = run_process(ktier() + " run -m " + short_ctx.string() + " --ids 1,2,3,4 -n 2");
  const auto fits = run_process(ktier() + " run -m " + short_ctx.string() + " --ids 1,2,3 -n 2");
  // eval and perplexity say so too: positions 0..4 of five ids.
  const auto eval = run_process(ktier() + " eval -m " + short_ctx.string() +
                                " --ids 1,2,3,4,5 --argmax");
  const auto ppl = run_process(ktier() + " perplexity -m " + short_ctx.string() +
                               " --ids 1,2,3,4,5");
  const auto eval_fits = run_process(ktier() + " eval -m " + short_ctx.string() +
                                     " --ids 1,2,3,4 --argmax");
  fs::remove_all(short_ctx);
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.err.find("the input (5 tokens) runs positions up to 4, past "
                          "max_position_embeddings = 4"),
            std::string::npos) << eval.err;
  ASSERT_EQ(ppl.exit_code, 0) << ppl.err;
  EXPECT_NE(ppl.err.find("a window of 5 tokens (-c) runs positions up to 4, past "
                         "max_position_embeddings = 4"),
            std::string::npos) << ppl.err;
  ASSERT_EQ(eval_fits.exit_code, 0) << eval_fits.err;
  EXPECT_EQ(eval_fits.err.find("max_position_embeddings"), std::string::npos) << eval_fits.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("prompt (4 tokens) + -n 2 runs positions up to 4, past "
                       "max_position_embeddings = 4"),
            std::string::npos) << r.err;
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_EQ(fits.err.find("max_position_embeddings"), std::string::npos) << fits.err;
}

// An option given twice takes its last value, as llama.cpp's (a script appends an override);
// but every --stop-id counts, first or last.
TEST_F(RunEvalCli, ARepeatedOptionTakesItsLastValue) {
  const std::string run = ktier() + " run" + model() + " --ids " + prompt_ids() + " --print-ids";
  const auto r = run_process(run + " -n 9 -n 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int> ids = split_ids(last_line(r.out));
  ASSERT_EQ(ids.size(), 3u) << r.out;
  ASSERT_TRUE(ids[2] != ids[0] && ids[2] != ids[1]) << r.out;  // it ends the answer there only
  // A stop id that is not among the answer's, and the third id: the answer ends at it.
  int unused = 0;
  while (std::find(ids.begin(), ids.end(), unused) != ids.end()) ++unused;
  const std::string third = std::to_string(ids[2]), other = std::to_string(unused);
  for (const std::string& stops : {" --stop-id " + third + " --stop-id " + other,
                                   " --stop-id " + other + " --stop-id " + third}) {
    const auto stopped = run_process(run + " -n 9" + stops);
    ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
    EXPECT_EQ(split_ids(last_line(stopped.out)), ids) << stops;
  }
}

}  // namespace
}  // namespace ktier::test
