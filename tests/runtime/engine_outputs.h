#pragma once
// What the memory-dial tests compare across settings: an engine's teacher-forced logits over a
// prompt (in chunks of 5, so every layer is acquired several times), followed by the ids of 6
// greedy tokens, all in one vector. Equal vectors = byte-identical output.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/io_engine.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "synth/synth.h"
#include "tests/common/out_of_memory.h"
#include "tests/common/same_bytes.h"

namespace ktier::runtime {

// The prompt the memory-dial tests run (12 ids of the tiny vocabulary).
inline const std::vector<int32_t> kDialTestPrompt = {17, 42, 1, 99, 128, 7, 200, 63, 150, 31,
                                                     222, 88};

// Which engine the runs of a test comparing IoBackend::kAuto with kPread got: kPread must get
// pread, and kAuto io_uring wherever io_uring can be set up with the runs' options (a container
// may refuse it), so that the comparison is of the two engines. Call count() per opened engine,
// then check() once.
class IoEngineTally {
 public:
  void count(io::IoBackend asked, const Engine& e) {
    const std::string name = e.io_engine()->name();
    if (asked == io::IoBackend::kPread) {
      EXPECT_EQ(name, "pread");
    }
    auto_runs_ += asked == io::IoBackend::kAuto;
    auto_on_uring_ += asked == io::IoBackend::kAuto && name == "io_uring";
  }
  void check(io::IoOptions options) const {
    std::printf("[ note ] %d of %d auto runs on io_uring\n", auto_on_uring_, auto_runs_);
    options.backend = io::IoBackend::kUring;
    if (io::make_io_engine(options).is_ok()) {
      EXPECT_EQ(auto_on_uring_, auto_runs_);
    }
  }

 private:
  int auto_runs_ = 0, auto_on_uring_ = 0;
};

// Writes the tiny synthetic checkpoint to `dir` (call under ASSERT_NO_FATAL_FAILURE).
inline void synth_tiny(const std::filesystem::path& dir) {
  synth::SynthOptions o;
  o.out_dir = dir;
  o.threads = 1;
  ASSERT_TRUE(synth::run_synth(o).is_ok());
}

// The parts a tier is opened on without an Engine: an I/O engine and one ReadFile per shard of
// `ckpt`, in Checkpoint order (call under ASSERT_NO_FATAL_FAILURE; `engine` is null on failure).
// An engine already in `out` opens the files; otherwise one is made from `options`.
struct ShardFiles {
  std::unique_ptr<io::IoEngine> engine;
  std::vector<io::ReadFile> files;
};
inline void open_shard_files(const format::Checkpoint& ckpt, ShardFiles& out,
                             const io::IoOptions& options = {}) {
  if (!out.engine) {
    auto io = io::make_io_engine(options);
    ASSERT_TRUE(io.is_ok()) << io.status().message();
    out.engine = std::move(*io);
  }
  for (size_t i = 0; i < ckpt.num_shards(); ++i) {
    auto f = out.engine->open(ckpt.shard(i).path());
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    out.files.push_back(std::move(*f));
  }
}

// Logits poisoned with all-ones bits (a NaN no arithmetic makes) before a pass, so that a logit
// the pass never writes is caught by unwritten_logits(), not compared equal to a reference that
// missed it the same way (or to the bytes of an earlier pass in the same buffer).
inline constexpr uint32_t kLogitPoison = 0xffffffffu;

inline void poison_logits(std::vector<float>& logits) {
  std::fill(logits.begin(), logits.end(), std::bit_cast<float>(kLogitPoison));
}

// How many of `logits` still hold the poison poison_logits() wrote.
inline int64_t unwritten_logits(const std::vector<float>& logits) {
  return std::count_if(logits.begin(), logits.end(),
                       [](float x) { return std::bit_cast<uint32_t>(x) == kLogitPoison; });
}

inline std::vector<float> logits_then_greedy_ids(const EngineOptions& eo,
                                                 const std::vector<int32_t>& prompt) {
  auto e = Engine::open(eo);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  Engine& engine = *e.value();
  const int64_t V = engine.checkpoint().config().vocab_size;
  std::vector<float> out(prompt.size() * static_cast<size_t>(V));
  poison_logits(out);
  EXPECT_TRUE(evaluate(engine.model(), prompt, 5, out.data()).is_ok());
  EXPECT_EQ(unwritten_logits(out), 0) << "logits evaluate() did not write";
  GenerationOptions g;
  g.max_new_tokens = 6;
  g.reserve_positions = static_cast<int64_t>(prompt.size()) + g.max_new_tokens - 1;  // GPU mode's plan
  auto st = generate(engine.model(), engine.experts(), prompt, g, [&](int32_t id) {
    out.push_back(static_cast<float>(id));
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.status().message();
  return out;
}

// Runs a 3-token forward pass of `engine` out of memory at every `stride`-th allocation of the
// calling thread in turn (test::fail_allocations_in_turn), and checks that after each failure
// the next pass on the same engine gives the bytes of a warm pass that never failed (which must
// equal `reference`'s first logits when one is given). `test` names the run in the log.
inline void expect_forward_out_of_memory_leaves_engine_whole(
    const std::string& test, long stride, Engine& engine, const std::vector<int32_t>& prompt,
    const std::vector<float>* reference = nullptr) {
  ASSERT_GE(prompt.size(), 3u);
  const std::vector<int32_t> ids(prompt.begin(), prompt.begin() + 3);
  std::vector<float> out(ids.size() * static_cast<size_t>(engine.checkpoint().config().vocab_size));
  // Poisoned before each pass: a pass that says ok but leaves logits unwritten cannot pass for
  // the one before it.
  const auto pass = [&] {
    poison_logits(out);
    return evaluate(engine.model(), ids, 3, out.data());
  };
  ASSERT_TRUE(pass().is_ok());
  const std::vector<float> want = out;
  ASSERT_EQ(unwritten_logits(want), 0) << "the warm pass left logits unwritten";
  if (reference != nullptr) {
    ASSERT_GE(reference->size(), want.size());
    ASSERT_TRUE(test::same_bytes(want, {reference->begin(), reference->begin() + want.size()}))
        << "the warm pass is not the reference";
  }
  // A failure may be caught inside and end in a fallback (its Status ok): not checked here.
  const auto recovered = [&](long k, const Status&) {
    const Status again = pass();
    ASSERT_TRUE(again.is_ok()) << "after allocation " << k << " failed: " << again.message();
    ASSERT_TRUE(test::same_bytes(out, want)) << "after allocation " << k << " failed";
  };
  const long failures = test::fail_allocations_in_turn(test, stride, pass, recovered);
  EXPECT_GT(failures, 0);
  EXPECT_TRUE(test::same_bytes(out, want)) << "the pass that got through";
}

// Turns over `prompt` (12 ids: prompt chunks of 5, 5 and 2, then tokens) abandoned between two
// layers (GenerationOptions::abandon_requested, Ctrl-C in a run that saves nothing) at every
// `stride`-th layer boundary of the first 5 passes, each followed by a teacher-forced pass on
// the same engine, which must end (no hang, no CHECK) with `reference`'s first logits, with
// the read-ahead, copies and prefetches the abandoned pass made for the layers it never reached
// still about. (Output bytes never depend on the tiers, so what begin_pass clears of their
// counters is checked by the tiers' own tests.)
inline void expect_abandoned_passes_leave_engine_whole(Engine& engine,
                                                       const std::vector<int32_t>& prompt,
                                                       const std::vector<float>& reference,
                                                       int64_t stride) {
  ASSERT_EQ(prompt.size(), 12u);
  const int64_t boundaries = engine.checkpoint().config().num_hidden_layers - 1;  // per pass
  const size_t vocab = static_cast<size_t>(engine.checkpoint().config().vocab_size);
  ASSERT_GE(reference.size(), prompt.size() * vocab);
  for (int64_t stop_at = 1; stop_at <= 5 * boundaries; stop_at += stride) {
    SCOPED_TRACE("stopped at boundary " + std::to_string(stop_at));
    GenerationOptions g;
    g.prefill_chunk = 5;
    g.max_new_tokens = 6;
    g.reserve_positions = static_cast<int64_t>(prompt.size()) + g.max_new_tokens - 1;
    int64_t asked = 0;
    g.abandon_requested = [&] { return ++asked == stop_at; };
    auto session = GenerationSession::open(engine.model(), engine.experts(), g);
    ASSERT_TRUE(session.is_ok()) << session.status().message();
    auto turn = (*session)->turn(prompt, [](int32_t) { return Status::ok(); });
    ASSERT_TRUE(turn.is_ok()) << turn.status().message();
    EXPECT_TRUE(turn->interrupted);
    EXPECT_TRUE((*session)->abandoned());
    const int64_t pass = (stop_at - 1) / boundaries;  // the pass it stopped inside
    EXPECT_EQ(turn->prompt_tokens, std::min<int64_t>(5 * pass, 12));
    EXPECT_EQ(turn->generated_tokens, std::max<int64_t>(pass - 2, 0));
    session->reset();
    std::vector<float> out(prompt.size() * vocab);
    poison_logits(out);
    const Status s = evaluate(engine.model(), prompt, 12, out.data());
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(test::same_bytes(out, {reference.begin(), reference.begin() + out.size()}));
  }
}

}  // namespace ktier::runtime
