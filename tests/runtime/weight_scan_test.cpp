// The scan for a weight that is not finite (runtime/weight_scan.h), which names where non-finite
// logits came from: nothing in a sound checkpoint; in a damaged one the first such element in
// the order the model binds its tensors, with the tensor, its shard and the element.
#include "runtime/weight_scan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/interrupt.h"
#include "format/checkpoint.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "synth/synth.h"
#include "engine_outputs.h"
#include "tests/common/sigint_disposition.h"

namespace ktier::runtime {
namespace {

namespace fs = std::filesystem;

// Writes the bf16 `bits` over element `element` of `tensor` in `dir`'s checkpoint; the name of
// its shard.
std::string poison(const fs::path& dir, const std::string& tensor, uint64_t element,
                   uint16_t bits) {
  auto ckpt = format::Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  if (!ckpt.is_ok()) return "";
  const std::optional<format::TensorRef> ref = ckpt->find(tensor);
  EXPECT_TRUE(ref.has_value()) << tensor;
  if (!ref) return "";
  EXPECT_EQ(ref->info->dtype, DType::kBF16) << tensor;
  const fs::path shard = ckpt->shard(ref->shard).path();
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(ref->info->file_offset + 2 * element));
  const char bytes[2] = {static_cast<char>(bits & 0xFF), static_cast<char>(bits >> 8)};
  f.write(bytes, 2);
  return shard.filename().string();
}

std::optional<std::string> scan(const fs::path& dir) {
  auto ckpt = format::Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  if (!ckpt.is_ok()) return std::string("(not opened)");
  auto found = find_nonfinite_weight(*ckpt);
  EXPECT_TRUE(found.is_ok()) << found.status().message();
  return found.is_ok() ? *found : std::string("(scan failed)");
}

// Writes `byte` over scale blocks [first, first + n) of expert `e`'s scale part `part` (1, 3, 5:
// w1, w2, w3 weight_scale, ExpertLocation::kPackedPartNames) in MoE layer `layer` of `dir`'s
// checkpoint (n = 0: to the part's end); "TENSOR in SHARD" for it.
std::string set_expert_scale(const fs::path& dir, int64_t layer, int32_t e, size_t part,
                             uint64_t first, uint64_t n, uint8_t byte) {
  auto ckpt = format::Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  if (!ckpt.is_ok()) return "";
  const format::ExpertPart& where = ckpt->expert(layer, e).parts[part];
  if (n == 0) n = where.nbytes - first;
  EXPECT_LE(first + n, where.nbytes);
  const fs::path shard = ckpt->shard(where.shard).path();
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(where.file_offset + first));
  const std::string bytes(n, static_cast<char>(byte));
  f.write(bytes.data(), static_cast<std::streamsize>(n));
  return format::expert_prefix(layer, e) + format::ExpertLocation::kPackedPartNames[part] +
         " in " + shard.filename().string();
}

std::optional<std::string> damaged_scale(const fs::path& dir, int64_t layer,
                                         const std::vector<int32_t>& routed) {
  auto ckpt = format::Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  if (!ckpt.is_ok()) return std::string("(not opened)");
  auto found = find_damaged_expert_scale(*ckpt, layer, routed);
  EXPECT_TRUE(found.is_ok()) << found.status().message();
  return found.is_ok() ? *found : std::string("(scan failed)");
}

// An expert scale far above the others of the experts a layer routed to (a top bit set by
// damage) is named, w2's first, then w1's, w3's, each in expert id order; one within the span
// trained blocks have (the tiny model's are 123-125), a zero block (255) and the experts not
// routed to are not.
TEST(WeightScan, NamesAnExpertScaleFarAboveTheOthersOfTheRoutedExperts) {
  const fs::path dir =
      fs::temp_directory_path() / ("ktier-expert-scale-" + std::to_string(::getpid()));
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir));
  auto ckpt = format::Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
  ASSERT_EQ(ckpt->expert_storage(), format::ExpertStorage::kMxfp4);
  const int64_t layer = ckpt->config().first_k_dense_replace;  // the first MoE layer
  const std::vector<int32_t> routed = {5, 3, 3, 0};             // one token's, say
  EXPECT_EQ(damaged_scale(dir, layer, routed), std::nullopt);
  set_expert_scale(dir, layer, 3, 3, 7, 1, 160);  // 2^36 above the rest
  EXPECT_EQ(damaged_scale(dir, layer, routed), std::nullopt);
  const std::string w1_of_5 = set_expert_scale(dir, layer, 5, 1, 2, 1, 200);
  std::optional<std::string> named = damaged_scale(dir, layer, routed);
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->rfind(w1_of_5 + ": block 2's scale is 2^73 (byte 200), 2^7", 0), 0u) << *named;
  EXPECT_NE(named->find("times the median block's of the experts layer " +
                        std::to_string(layer) + " routed to"),
            std::string::npos) << *named;
  const std::string w2_of_3 = set_expert_scale(dir, layer, 3, 3, 7, 1, 254);
  named = damaged_scale(dir, layer, routed);
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->rfind(w2_of_3 + ": block 7's scale is 2^127 (byte 254)", 0), 0u) << *named;
  set_expert_scale(dir, layer, 3, 3, 7, 1, 255);  // a zero block
  named = damaged_scale(dir, layer, routed);
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->rfind(w1_of_5 + ": block 2's", 0), 0u) << *named;
  EXPECT_EQ(damaged_scale(dir, layer, {0, 3}), std::nullopt);
  EXPECT_EQ(damaged_scale(dir, layer + 1, routed), std::nullopt);
  fs::remove_all(dir);
}

// A pass whose last MoE layer's experts overflow (every w2 scale 2^127: the top bit of 126 set
// in each) has non-finite logits; the engine names a scale of an expert the pass routed to.
// (w2's: SiTU bounds what an overflowing w1 gives.)
TEST(WeightScan, NonFiniteLogitsAfterDamagedExpertsNameTheirScale) {
  const fs::path dir =
      fs::temp_directory_path() / ("ktier-expert-overflow-" + std::to_string(::getpid()));
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir));
  int64_t layer = -1, experts = 0, V = 0;
  {
    auto ckpt = format::Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    const format::ModelConfig& c = ckpt->config();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if (c.is_moe(l)) layer = l;
    experts = c.num_experts;
    V = c.vocab_size;
  }
  ASSERT_GE(layer, 0);
  for (int32_t e = 0; e < experts; ++e) set_expert_scale(dir, layer, e, 3, 0, 0, 254);
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "emulated device" : "cpu");
    EngineOptions eo;
    eo.model_dir = dir;
    eo.threads = 2;
    eo.emulate_device = device;
    if (device) eo.vram_budget = uint64_t{1} << 32;
    auto e = Engine::open(eo);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    const int64_t n = static_cast<int64_t>(kDialTestPrompt.size());
    std::vector<float> logits(static_cast<size_t>(n * V));
    ASSERT_TRUE(evaluate((*e)->model(), kDialTestPrompt, 5, logits.data()).is_ok());
    const Status bad = check_logits(logits.data() + (n - 1) * V, V, n);
    ASSERT_TRUE(is_nonfinite_logits(bad)) << bad.message();
    const std::string why = (*e)->explain_nonfinite(bad).message();
    EXPECT_NE(why.find("The checkpoint's bytes are damaged: " + format::layer_prefix(layer) +
                       "block_sparse_moe.experts."),
              std::string::npos) << why;
    EXPECT_NE(why.find(".w2.weight_scale in "), std::string::npos) << why;
    EXPECT_NE(why.find(": block 0's scale is 2^127 (byte 254)"), std::string::npos) << why;
  }
  fs::remove_all(dir);
}

// Plain-float experts (BF16): a NaN in an expert an earlier MoE layer routed to turns the next
// layer's router scores NaN; the engine names the expert's tensor, not the finite router's
// weight (a probe's find), and nothing where the damaged expert was not routed to.
TEST(WeightScan, NamesANonFiniteFloatExpertTheLayerRoutedTo) {
  const fs::path dir =
      fs::temp_directory_path() / ("ktier-float-expert-nan-" + std::to_string(::getpid()));
  synth::SynthOptions o;
  o.out_dir = dir;
  o.threads = 1;
  o.experts = synth::ExpertFormat::kBF16;
  ASSERT_TRUE(synth::run_synth(o).is_ok());
  int64_t layer = -1, experts = 0;
  {
    auto ckpt = format::Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    ASSERT_EQ(ckpt->expert_storage(), format::ExpertStorage::kPlainFloat);
    const format::ModelConfig& c = ckpt->config();
    layer = c.first_k_dense_replace;  // the first MoE layer: another follows in tiny
    ASSERT_TRUE(c.is_moe(layer));
    experts = c.num_experts;
    auto none = find_nonfinite_expert(*ckpt, layer, {{0, 1}});
    ASSERT_TRUE(none.is_ok());
    EXPECT_EQ(*none, std::nullopt);
  }
  std::string shard;
  for (int32_t e = 0; e < experts; ++e)
    shard = poison(dir, format::expert_prefix(layer, e) + "w2.weight", 3, 0x7FC0);
  auto ckpt = format::Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok());
  auto named = find_nonfinite_expert(*ckpt, layer, {{4, 2, 2}});
  ASSERT_TRUE(named.is_ok());
  EXPECT_EQ(named->value_or(""), format::expert_prefix(layer, 2) + "w2.weight in " + shard +
                                     ": element 3 is NaN");
  EngineOptions eo;
  eo.model_dir = dir;
  eo.threads = 2;
  auto e = Engine::open(eo);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const int64_t n = static_cast<int64_t>(kDialTestPrompt.size());
  const int64_t V = (*e)->checkpoint().config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * V));
  const Status bad = evaluate((*e)->model(), kDialTestPrompt, 5, logits.data());
  ASSERT_TRUE(is_nonfinite_logits(bad)) << bad.message();
  const std::string why = (*e)->explain_nonfinite(bad).message();
  EXPECT_NE(why.find("The checkpoint's bytes are damaged: " + format::expert_prefix(layer, 0)
                         .substr(0, format::expert_prefix(layer, 0).size() - 2)),
            std::string::npos)
      << why;
  EXPECT_NE(why.find(".w2.weight in " + shard + ": element 3 is NaN"), std::string::npos) << why;
  fs::remove_all(dir);
}

TEST(WeightScan, NamesTheFirstElementThatIsNotFinite) {
  const fs::path dir =
      fs::temp_directory_path() / ("ktier-weight-scan-" + std::to_string(::getpid()));
  synth::SynthOptions o;
  o.out_dir = dir;
  o.threads = 1;
  ASSERT_TRUE(synth::run_synth(o).is_ok());
  EXPECT_EQ(scan(dir), std::nullopt);
  // A matrix of layer 2 (a KDA layer's output projection), +Inf at element 5.
  const std::string o_proj = "language_model.model.layers.2.self_attn.o_proj.weight";
  const std::string o_shard = poison(dir, o_proj, 5, 0x7F80);
  EXPECT_EQ(scan(dir), o_proj + " in " + o_shard + ": element 5 is infinite");
  // NaN in a later layer does not change it; in the embedding (bound first) it does.
  poison(dir, "language_model.model.layers.9.block_sparse_moe.shared_experts.up_proj.weight", 0,
         0xFFC1);
  EXPECT_EQ(scan(dir), o_proj + " in " + o_shard + ": element 5 is infinite");
  const std::string e_shard = poison(dir, model::embedding_tensor_name(), 321, 0xFFC1);
  EXPECT_EQ(scan(dir),
            model::embedding_tensor_name() + " in " + e_shard + ": element 321 is NaN");
  // Ctrl-C stops the scan (it reads the whole trunk: up to a minute on K3).
  {
    test::SigintDisposition default_action(SIG_DFL);  // not ignored, as a background job has it
    InterruptRequest interrupt("(test: Ctrl-C)\n");
    ::raise(SIGINT);
    auto ckpt = format::Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok());
    auto stopped = find_nonfinite_weight(*ckpt);
    ASSERT_FALSE(stopped.is_ok());
    EXPECT_EQ(stopped.status().code(), ExitCode::kInterrupted) << stopped.status().message();
    EXPECT_NE(stopped.status().message().find("stopped (Ctrl-C or SIGTERM) at " +
                                              model::embedding_tensor_name()),
              std::string::npos)
        << stopped.status().message();
  }
  // A failed status carries the note only where it is check_logits' own.
  EXPECT_TRUE(is_nonfinite_logits(Status::corrupt("the logits after 3 positions hold NaN")));
  EXPECT_FALSE(is_nonfinite_logits(Status::corrupt("x.safetensors: tensor y is truncated")));
  EXPECT_FALSE(is_nonfinite_logits(Status::runtime("the logits after 3 positions hold NaN")));
  fs::remove_all(dir);
}

// No trunk weight that is not finite reaches a kernel (runtime/finite_trunk.h), whatever holds
// the trunk: an infinite weight behind a gate (sigmoid(+Inf) = 1) ran to exit 0 with other
// tokens (layer 0's gate_proj, layer 1's f_a_proj: a fuzzing find); now a pass through its layer
// is Status::corrupt naming it, and so is every later one. An embedding row is checked as it is
// read, the head's matrix when the engine opens (a NaN there reached the logits check; an
// infinite weight may make a logit -Inf, which the check allows: a token never drawn).
TEST(FiniteTrunk, NoWeightThatIsNotFiniteReachesAKernel) {
  const fs::path root =
      fs::temp_directory_path() / ("ktier-finite-trunk-" + std::to_string(::getpid()));
  ASSERT_NO_FATAL_FAILURE(synth_tiny(root / "clean"));
  auto clean = format::Checkpoint::open(root / "clean", format::OpenMode::kPread);
  ASSERT_TRUE(clean.is_ok()) << clean.status().message();
  const int64_t E = clean->config().hidden_size;
  struct Mode {
    const char* name;
    EngineOptions options;
  };
  std::vector<Mode> modes(4);
  modes[0].name = "mapped";
  modes[1].name = "streamed (the dial's minimum)";
  modes[1].options.ram_budget = minimum_budget_bytes(*clean, nullptr, kDefaultLookahead);
  modes[2].name = "pinned";
  modes[2].options.ram_budget = uint64_t{1} << 30;
  modes[3].name = "emulated device";
  modes[3].options.emulate_device = true;
  modes[3].options.vram_budget = uint64_t{1} << 32;
  struct Case {
    std::string tensor;
    uint64_t element;
    uint16_t bits;
    std::string what;  // how the error begins
  };
  const std::string gate = "language_model.model.layers.0.mlp.gate_proj.weight";
  const std::string f_a = "language_model.model.layers.1.self_attn.f_a_proj.weight";
  const std::vector<Case> cases = {
      {gate, static_cast<uint64_t>(clean->find(gate)->info->numel() - 1), 0x7F80,
       "layer 0's weights hold a value that is not finite: "},
      {f_a, 0, 0xFF80, "layer 1's weights hold a value that is not finite: "},
      {model::embedding_tensor_name(), static_cast<uint64_t>(17 * E + 3), 0x7FC1,
       "the embedding of token id 17 holds a value that is not finite: "},
      {"language_model.lm_head.weight", static_cast<uint64_t>(2 * E + 5), 0x7F80,
       "the head's weights (lm_head, final norm, output AttnRes) hold a value that is not "
       "finite: "},
  };
  ASSERT_NE(std::find(kDialTestPrompt.begin(), kDialTestPrompt.end(), 17), kDialTestPrompt.end());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    const fs::path dir = root / "damaged";
    fs::remove_all(dir);
    fs::copy(root / "clean", dir);
    const std::string shard = poison(dir, c.tensor, c.element, c.bits);
    const std::string want = c.what + c.tensor + " in " + shard + ": element " +
                             std::to_string(c.element) + " is " +
                             (c.bits == 0x7FC1 ? "NaN" : "infinite");
    for (const Mode& m : modes) {
      SCOPED_TRACE(m.name);
      EngineOptions eo = m.options;
      eo.model_dir = dir;
      eo.threads = 2;
      auto e = Engine::open(eo);
      std::vector<Status> failed;
      if (!e.is_ok()) {
        failed.push_back(e.status());
      } else {
        std::vector<float> logits(kDialTestPrompt.size() *
                                  static_cast<size_t>(clean->config().vocab_size));
        for (int pass = 0; pass < 2; ++pass)
          failed.push_back(evaluate((*e)->model(), kDialTestPrompt, 5, logits.data()));
      }
      for (const Status& s : failed) {
        EXPECT_EQ(s.code(), ExitCode::kCorrupt) << s.message();
        EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
      }
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace ktier::runtime
