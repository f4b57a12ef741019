#pragma once
// What the memory-dial tests compare across settings: an engine's teacher-forced logits over a
// prompt (in chunks of 5, so every layer is acquired several times), followed by the ids of 6
// greedy tokens, all in one vector. Equal vectors = byte-identical output.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"

namespace ktier::runtime {

inline std::vector<float> logits_then_greedy_ids(const EngineOptions& eo,
                                                 const std::vector<int32_t>& prompt) {
  auto e = Engine::open(eo);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return {};
  Engine& engine = *e.value();
  const int64_t V = engine.checkpoint().config().vocab_size;
  std::vector<float> out(prompt.size() * static_cast<size_t>(V));
  EXPECT_TRUE(evaluate(engine.model(), prompt, 5, out.data(), engine.exec()).is_ok());
  GenerationOptions g;
  g.max_new_tokens = 6;
  auto st = generate(engine.model(), engine.experts(), prompt, g, engine.exec(), [&](int32_t id) {
    out.push_back(static_cast<float>(id));
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.status().message();
  return out;
}

}  // namespace ktier::runtime
