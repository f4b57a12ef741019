// The prompt cache's file (runtime/prompt_cache.h): a saved state restored on the CPU, on the
// emulated device (its memory wall aborts on a host pointer, so every byte goes through the
// backend's upload/download) and on a GPU where there is one continues with the bytes of the run
// that never stopped; damaged or foreign files are refused before anything is computed from
// them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>

#include "backend/cuda_backend.h"
#include "engine_outputs.h"
#include "runtime/prompt_cache.h"

namespace ktier::runtime {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, const std::string& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
}

enum class Where { kCpu, kEmulated, kCuda };

class PromptCacheTest : public ::testing::TestWithParam<Where> {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-prompt-cache-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ASSERT_NO_FATAL_FAILURE(synth_tiny(dir_ / "m"));
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Why the GPU cannot be used here ("" where it can).
  static std::string no_cuda() {
    auto be = backend::make_cuda_backend(backend::probe_cuda_module());
    return be.is_ok() ? "" : be.status().message();
  }
  static std::unique_ptr<Engine> open_engine(Where where) {
    EngineOptions eo;
    eo.model_dir = dir_ / "m";
    eo.threads = 2;
    if (where != Where::kCpu) {
      eo.emulate_device = where == Where::kEmulated;
      if (where == Where::kCuda) eo.device = backend::DeviceKind::kCuda;
      eo.vram_budget = uint64_t{1} << 30;
      eo.workload = {kPositions, static_cast<int64_t>(kDialTestPrompt.size()),
                     model::LogitRows::kAll};
    }
    auto e = Engine::open(eo);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return e.is_ok() ? std::move(*e) : nullptr;
  }
  // The state after prompt[0, k) of a fresh sequence of `m`.
  static model::SequenceState state_after(model::Model& m, size_t k) {
    auto s = m.new_sequence(kPositions);
    EXPECT_TRUE(s.is_ok());
    const std::span<const int32_t> p(kDialTestPrompt);
    EXPECT_TRUE(m.forward(p.first(k), *s, model::LogitRows::kNone, nullptr).is_ok());
    return std::move(*s);
  }
  static constexpr int64_t kPositions = 20;
  static std::string label() {
    return GetParam() == Where::kCpu ? "cpu" : GetParam() == Where::kEmulated ? "dev" : "cuda";
  }
  static inline fs::path dir_;
};

// The continuation is the state's before it was saved, and the whole prompt's evaluation in any
// chunking (on a GPU too: its default fused kernels do not depend on the chunk).
TEST_P(PromptCacheTest, RestoredStateContinuesWithTheBytesOfTheWholeRun) {
  if (GetParam() == Where::kCuda && !no_cuda().empty()) GTEST_SKIP() << "no GPU: " << no_cuda();
  std::unique_ptr<Engine> e = open_engine(GetParam());
  ASSERT_NE(e, nullptr);
  model::Model& m = e->model();
  const int64_t V = m.config().vocab_size, P = static_cast<int64_t>(kDialTestPrompt.size());
  const std::span<const int32_t> prompt(kDialTestPrompt);
  // What a run without the cache gives: every position's logits, in chunks of 5.
  std::vector<float> whole(static_cast<size_t>(P * V));
  ASSERT_TRUE(evaluate(m, prompt, 5, whole.data()).is_ok());
  for (size_t k : {size_t{1}, size_t{5}, size_t{11}}) {
    SCOPED_TRACE("saved after " + std::to_string(k) + " ids");
    const fs::path file = dir_ / ("k" + std::to_string(k) + "-" + label() + ".st");
    std::vector<float> unsaved(static_cast<size_t>((P - k) * V), -7.f);
    {
      model::SequenceState s = state_after(m, k);
      ASSERT_TRUE(save_sequence(file, m, s, prompt.first(k), 0x1234abcd, 77).is_ok());
      ASSERT_TRUE(m.forward(prompt.subspan(k), s, model::LogitRows::kAll, unsaved.data()).is_ok());
    }
    auto saved = SavedSequence::open(file, m.config(), 77);
    ASSERT_TRUE(saved.is_ok()) << saved.status().message();
    EXPECT_EQ(saved->checkpoint(), 0x1234abcdu);
    // The emulated device gives the CPU's bytes.
    EXPECT_EQ(saved->backend(), GetParam() == Where::kCuda ? "cuda" : "cpu");
    ASSERT_EQ(saved->ids().size(), k);
    EXPECT_TRUE(std::equal(saved->ids().begin(), saved->ids().end(), prompt.begin()));
    auto restored = saved->restore(m, kPositions);
    ASSERT_TRUE(restored.is_ok()) << restored.status().message();
    EXPECT_EQ(restored->n_tokens, static_cast<int64_t>(k));
    // Saved again, the restored state is the same file.
    const fs::path again = dir_ / "again.st";
    ASSERT_TRUE(save_sequence(again, m, *restored, prompt.first(k), 0x1234abcd, 77).is_ok());
    EXPECT_EQ(read_bytes(again), read_bytes(file));
    // The rest of the prompt from the restored state: the whole run's logits, bit for bit.
    std::vector<float> rest(static_cast<size_t>((P - k) * V), -7.f);
    ASSERT_TRUE(
        m.forward(prompt.subspan(k), *restored, model::LogitRows::kAll, rest.data()).is_ok());
    EXPECT_EQ(std::memcmp(rest.data(), unsaved.data(), rest.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(rest.data(), whole.data() + k * V, rest.size() * sizeof(float)), 0);
  }
}

TEST_P(PromptCacheTest, DamagedOrForeignFilesAreRefusedBeforeUse) {
  if (GetParam() == Where::kCuda && !no_cuda().empty()) GTEST_SKIP() << "no GPU: " << no_cuda();
  std::unique_ptr<Engine> e = open_engine(GetParam());
  ASSERT_NE(e, nullptr);
  model::Model& m = e->model();
  const fs::path good = dir_ / ("good-" + label() + ".st");
  auto config_hash = config_identity(dir_ / "m");
  ASSERT_TRUE(config_hash.is_ok()) << config_hash.status().message();
  const uint64_t h = *config_hash;
  {
    model::SequenceState s = state_after(m, 7);
    ASSERT_TRUE(save_sequence(good, m, s, std::span(kDialTestPrompt).first(7), 1, h).is_ok());
  }
  const std::string bytes = read_bytes(good);
  const fs::path bad = dir_ / "bad.st";
  const format::ModelConfig& c = m.config();
  // Every check is made when the file is opened, before anything else reads it.
  auto expect_corrupt = [&](const std::string& b, const std::string& what,
                            const format::ModelConfig& config) {
    SCOPED_TRACE(what);
    write_bytes(bad, b);
    const Status s = SavedSequence::open(bad, config, h).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt) << s.message();
    EXPECT_NE(s.message().find(bad.string()), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  // One flipped bit in the ids (just after the header), in the middle, in the last byte.
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const size_t first_id = 8 + header;
  for (size_t at : {first_id, bytes.size() / 2 + first_id / 2, bytes.size() - 1}) {
    std::string b = bytes;
    b[at] = static_cast<char>(b[at] ^ 1);
    expect_corrupt(b, "do not match its \"xxh3\"", c);
  }
  std::string b = bytes;
  b.replace(b.size() - 4, 4, std::string("\x00\x00\xc0\x7f", 4));  // the last float a NaN
  expect_corrupt(b, "holds a NaN or Inf", c);
  expect_corrupt(bytes.substr(0, bytes.size() - 4), "truncated", c);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string e = bytes;
    const size_t at = e.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? e : e.replace(at, from.size(), to);
  };
  expect_corrupt(edited("\"version\":\"1\"", "\"version\":\"2\""), "version \"2\"", c);
  expect_corrupt(edited("\"ktier.sequence\"", "\"ktier.sequencf\""), "\"format\"", c);
  // The metadata is under the checksum too (positions must also be the ids' count, checked
  // first).
  expect_corrupt(edited("\"positions\":\"7\"", "\"positions\":\"8\""),
                 "tensor 0 is 'ids' I32[7], a state begins with 'ids' I32[8]", c);
  expect_corrupt(
      edited("\"checkpoint\":\"0000000000000001\"", "\"checkpoint\":\"0000000000000002\""),
      "\"xxh3\"", c);
  expect_corrupt(edited("\"positions\":\"7\"", "\"positions\":\"0\""), "\"positions\"", c);
  {  // the checksum in upper case: not as the writer spells it
    const std::string key = "\"xxh3\":\"";
    const std::string digits = bytes.substr(bytes.find(key) + key.size(), 16);
    std::string upper = digits;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (upper != digits) expect_corrupt(edited(key + digits, key + upper), "\"xxh3\" is", c);
  }
  const std::string backend = GetParam() == Where::kCuda ? "cuda" : "cpu";
  // A name of the same length (the header's length is in the file): "gpu" or "gpu0".
  const std::string unknown = std::string("gpu0").substr(0, backend.size());
  expect_corrupt(edited("\"backend\":\"" + backend + "\"", "\"backend\":\"" + unknown + "\""),
                 "\"backend\"", c);
  const std::string number(backend.size() + 2, '7');  // the same length, not a string
  expect_corrupt(edited("\"backend\":\"" + backend + "\"", "\"backend\":" + number),
                 "is not a string", c);
  // Tensor 0 is checked to be the ids before its bytes are held, whoever's the file is (for
  // another model's config too: damaged, not foreign).
  expect_corrupt(edited("\"ids\":{", "\"idz\":{"),
                 "tensor 0 is 'idz' I32[7], a state begins with 'ids' I32[7]", c);
  {
    write_bytes(bad, edited("\"ids\":{", "\"idz\":{"));
    const Status s = SavedSequence::open(bad, c, h + 1).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt) << s.message();
  }
  format::ModelConfig other = c;
  other.kv_lora_rank += 1;  // a forged file: this config's hash, another shape
  expect_corrupt(bytes, "mla.c", other);
  // Another model's config.json: exit 2, both files intact.
  write_bytes(bad, bytes);
  const Status foreign = SavedSequence::open(bad, c, h + 1).status();
  EXPECT_EQ(foreign.code(), ExitCode::kUsage) << foreign.message();
  EXPECT_NE(foreign.message().find("another model"), std::string::npos) << foreign.message();
  // Changed between open and restore: restore hashes what it reads again.
  {
    auto saved = SavedSequence::open(bad, c, h);
    ASSERT_TRUE(saved.is_ok()) << saved.status().message();
    std::string changed = bytes;
    changed[bytes.size() - 1] = static_cast<char>(changed[bytes.size() - 1] ^ 1);
    write_bytes(bad, changed);
    const Status s = saved->restore(m, kPositions).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt) << s.message();
    EXPECT_NE(s.message().find("changed since it was opened"), std::string::npos) << s.message();
  }
  // Intact files (their checksums right) with an id or a conversation's pending token outside
  // the vocabulary.
  {
    model::SequenceState st = state_after(m, 3);
    std::vector<int32_t> ids(kDialTestPrompt.begin(), kDialTestPrompt.begin() + 3);
    const PendingTurn past_vocab{static_cast<int32_t>(c.vocab_size), 0, std::nullopt};
    ASSERT_TRUE(save_sequence(bad, m, st, ids, 1, h, past_vocab).is_ok());
    Status s = SavedSequence::open(bad, c, h).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt);
    EXPECT_NE(s.message().find("\"pending\" " + std::to_string(c.vocab_size)), std::string::npos)
        << s.message();
    ids[1] = static_cast<int32_t>(c.vocab_size) + 5;
    ASSERT_TRUE(save_sequence(bad, m, st, ids, 1, h, PendingTurn{2, 0, std::nullopt}).is_ok());
    s = SavedSequence::open(bad, c, h).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt);
    EXPECT_NE(s.message().find("id 1 is " + std::to_string(c.vocab_size + 5)), std::string::npos)
        << s.message();
    // A conversation's sampler draws: at most its positions and pending token (one per token
    // sampled); more would have the resumed sampler skip for as long as the file says.
    ids[1] = 2;
    // Whether the pending token was a stop id is kept as saved, and unknown where not saved.
    for (const std::optional<bool> stop : {std::optional<bool>(), std::optional<bool>(true),
                                           std::optional<bool>(false)}) {
      ASSERT_TRUE(save_sequence(bad, m, st, ids, 1, h, PendingTurn{2, 4, stop}).is_ok());
      auto fine = SavedSequence::open(bad, c, h);
      ASSERT_TRUE(fine.is_ok()) << fine.status().message();
      ASSERT_TRUE(fine->conversation());
      EXPECT_EQ(fine->conversation()->id, 2);
      EXPECT_EQ(fine->conversation()->sampler_draws, 4u);
      EXPECT_EQ(fine->conversation()->stop, stop);
    }
    ASSERT_TRUE(save_sequence(bad, m, st, ids, 1, h, PendingTurn{2, 4, true}).is_ok());
    const std::string conversation = read_bytes(bad);
    const std::string key = "\"pending_stop\":\"1\"";
    const size_t at = conversation.find(key);
    ASSERT_NE(at, std::string::npos);
    expect_corrupt(std::string(conversation).replace(at, key.size(), "\"pending_stop\":\"2\""),
                   "\"pending_stop\" is \"2\", not 0 or 1", c);
    ASSERT_TRUE(save_sequence(bad, m, st, ids, 1, h, PendingTurn{2, 5, std::nullopt}).is_ok());
    s = SavedSequence::open(bad, c, h).status();
    EXPECT_EQ(s.code(), ExitCode::kCorrupt);
    EXPECT_NE(s.message().find("\"sampler_draws\" 5 is more than its 3 positions"),
              std::string::npos) << s.message();
  }
  // A header past a prompt cache's size (here __metadata__ padded past 1 MiB; up to the reader's
  // 100 MiB it would be parsed whole first) is refused unread.
  {
    std::string json = "{\"__metadata__\":{\"format\":\"x\",\"pad\":\"" +
                       std::string(size_t{1} << 20, 'a') + "\"}}";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i)
      file[static_cast<size_t>(i)] = static_cast<char>(json.size() >> (8 * i));
    expect_corrupt(file + json,
                   "not a ktier prompt cache (a header of " + std::to_string(json.size()) +
                       " bytes", c);
  }
  // A checkpoint shard is safetensors, not a saved state.
  auto shard = SavedSequence::open(e->checkpoint().shard(0).path(), c, h);
  ASSERT_FALSE(shard.is_ok());
  EXPECT_EQ(shard.status().code(), ExitCode::kCorrupt);
  EXPECT_NE(shard.status().message().find("not a ktier prompt cache (no __metadata__)"),
            std::string::npos)
      << shard.status().message();
}

// The last id run on its own gives the same bytes (on a GPU too, with its default fused
// kernels): the greedy ids as the prompt cache runs it (last rows only), and every prompt row's
// logits where they are asked for (serve's echo); and the state before it is handed to the
// snapshot.
TEST_P(PromptCacheTest, GenerationSnapshotsTheStateBeforeThePromptsLastId) {
  if (GetParam() == Where::kCuda && !no_cuda().empty()) GTEST_SKIP() << "no GPU: " << no_cuda();
  std::unique_ptr<Engine> e = open_engine(GetParam());
  ASSERT_NE(e, nullptr);
  GenerationOptions g;
  g.max_new_tokens = 6;
  g.prefill_chunk = 5;
  g.reserve_positions = kPositions;
  std::vector<int32_t> plain, snapped;
  auto into = [](std::vector<int32_t>& v) {
    return [&v](int32_t id) {
      v.push_back(id);
      return Status::ok();
    };
  };
  ASSERT_TRUE(generate(e->model(), e->experts(), kDialTestPrompt, g, into(plain)).is_ok());
  std::vector<int64_t> seen;
  const auto snapshot = [&](const model::SequenceState& s) {
    seen.push_back(s.n_tokens);
    return Status::ok();
  };
  g.before_last_prompt_id = snapshot;
  ASSERT_TRUE(generate(e->model(), e->experts(), kDialTestPrompt, g, into(snapped)).is_ok());
  EXPECT_EQ(snapped, plain);  // the last id run on its own: the same bytes
  EXPECT_EQ(seen, std::vector<int64_t>{static_cast<int64_t>(kDialTestPrompt.size()) - 1});
  // Every prompt row's logits asked for: the same bytes with and without the snapshot.
  const int64_t V = e->checkpoint().config().vocab_size;
  std::vector<float> plain_rows, snapped_rows;
  auto rows_into = [V](std::vector<float>& v) {
    return [&v, V](int64_t, int64_t n, const float* logits) {
      v.insert(v.end(), logits, logits + n * V);
      return Status::ok();
    };
  };
  std::vector<int32_t> plain_all_rows, snapped_all_rows;
  g.before_last_prompt_id = nullptr;
  g.prompt_logits = rows_into(plain_rows);
  ASSERT_TRUE(
      generate(e->model(), e->experts(), kDialTestPrompt, g, into(plain_all_rows)).is_ok());
  g.before_last_prompt_id = snapshot;
  g.prompt_logits = rows_into(snapped_rows);
  ASSERT_TRUE(
      generate(e->model(), e->experts(), kDialTestPrompt, g, into(snapped_all_rows)).is_ok());
  EXPECT_EQ(plain_rows.size(), kDialTestPrompt.size() * static_cast<size_t>(V));
  EXPECT_TRUE(test::same_bytes(snapped_rows, plain_rows));
  EXPECT_EQ(snapped_all_rows, plain);
  EXPECT_EQ(plain_all_rows, plain);
  seen.clear();
  g.prompt_logits = nullptr;
  std::vector<int32_t> one;
  ASSERT_TRUE(generate(e->model(), e->experts(), std::span(kDialTestPrompt).first(1), g,
                       into(one)).is_ok());
  EXPECT_TRUE(seen.empty());  // a one-id prompt has nothing before its last id
  g.before_last_prompt_id = [](const model::SequenceState&) {
    return Status::runtime("disk full");
  };
  std::vector<int32_t> none;
  auto failed = generate(e->model(), e->experts(), kDialTestPrompt, g, into(none));
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().message(), "disk full");
  EXPECT_TRUE(none.empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, PromptCacheTest,
                         ::testing::Values(Where::kCpu, Where::kEmulated, Where::kCuda),
                         [](const ::testing::TestParamInfo<Where>& i) {
                           return std::string(i.param == Where::kCpu        ? "cpu"
                                              : i.param == Where::kEmulated ? "emulated"
                                                                            : "cuda");
                         });

}  // namespace
}  // namespace ktier::runtime
