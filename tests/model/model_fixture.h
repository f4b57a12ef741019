#pragma once
// Shared set-up of the end-to-end model tests: the `tiny` checkpoints the committed goldens were
// made from (tests/fixtures/golden/, tools/reference/make_golden.py), synthesised once per test
// process, and an Engine over each.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "tests/common/same_bytes.h"

namespace ktier::test {

struct Variant {
  std::string name;    // "mxfp4" or "float"
  std::string golden;  // file under tests/fixtures/golden/
};
const std::vector<Variant>& variants();

// Synthesises (once) the tiny seed-0 checkpoint of this variant; returns its folder.
std::filesystem::path tiny_checkpoint(const Variant& v);
const nlohmann::json& golden(const Variant& v);
std::vector<int32_t> golden_prompt(const Variant& v);

std::unique_ptr<runtime::Engine> open_engine(const Variant& v, int threads = 2,
                                             std::optional<cpu::Isa> isa = std::nullopt);

// Teacher-forced logits [ids.size(), V] in chunks of `chunk`.
std::vector<float> eval_logits(runtime::Engine& e, const std::vector<int32_t>& ids, int64_t chunk);


}  // namespace ktier::test
