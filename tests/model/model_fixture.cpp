#include "model/model_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include "common/temp_dir.h"
#include "common/test_paths.h"
#include "runtime/generator.h"
#include "synth/synth.h"

namespace ktier::test {

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {{"mxfp4", "tiny-mxfp4.json"}, {"float", "tiny-float.json"}};
  return v;
}

std::filesystem::path tiny_checkpoint(const Variant& v) {
  static std::mutex mu;
  // Removed at exit: CTest runs every case in a process of its own, each making its own.
  static std::map<std::string, std::unique_ptr<TempDir>> made;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = made.find(v.name); it != made.end()) return it->second->path() / "ckpt";
  auto folder = std::make_unique<TempDir>("model_" + v.name);
  const std::filesystem::path dir = folder->path() / "ckpt";
  synth::SynthOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.seed = 0;  // the goldens' seed
  o.force = true;
  o.threads = 1;
  if (v.name == "float") o.experts = synth::ExpertFormat::kF32;  // `synth --float-experts`
  auto r = synth::run_synth(o);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  made[v.name] = std::move(folder);
  return dir;
}

const nlohmann::json& golden(const Variant& v) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(v.golden);
  if (it != cache.end()) return it->second;
  std::ifstream in(source_dir() / "tests" / "fixtures" / "golden" / v.golden);
  EXPECT_TRUE(in.good()) << v.golden;
  return cache[v.golden] = nlohmann::json::parse(in);
}

std::vector<int32_t> golden_prompt(const Variant& v) {
  return golden(v).at("prompt_ids").get<std::vector<int32_t>>();
}

std::unique_ptr<runtime::Engine> open_engine(const Variant& v, int threads,
                                             std::optional<cpu::Isa> isa) {
  runtime::EngineOptions o;
  o.model_dir = tiny_checkpoint(v);
  o.threads = threads;
  o.isa = isa;
  auto e = runtime::Engine::open(o);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

std::vector<float> eval_logits(runtime::Engine& e, const std::vector<int32_t>& ids,
                               int64_t chunk) {
  const int64_t V = e.checkpoint().config().vocab_size;
  // Poisoned: a row the forward forgets to write shows up as NaN.
  std::vector<float> logits(ids.size() * static_cast<size_t>(V), std::nanf(""));
  const Status s = runtime::evaluate(e.model(), ids, chunk, logits.data());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return logits;
}


}  // namespace ktier::test
