// The scan for a weight that is not finite (runtime/weight_scan.h), which names where non-finite
// logits came from: nothing in a sound checkpoint; in a damaged one the first such element in
// the order the model binds its tensors, with the tensor, its shard and the element.
#include "runtime/weight_scan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/interrupt.h"
#include "format/checkpoint.h"
#include "model/weights.h"
#include "synth/synth.h"
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

}  // namespace
}  // namespace ktier::runtime
