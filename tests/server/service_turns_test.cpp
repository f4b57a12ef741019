// `ktier serve`'s generation (server/service.h) on the tiny checkpoint, its turns: one request
// generates while the others wait in arrival order (up to a limit), a server told to stop
// starts none, the context bounds a request, a client that leaves ends its answer, and a
// request that ends early or in an exception leaves a sequence the next one can trust. The
// fixture is tests/server/service_fixture.h.
#include "server/service.h"

#include "tests/server/service_fixture.h"

namespace ktier::server {
namespace {

TEST_F(ServiceTest, ARequestThatWaitedWhileTheServerStopsDoesNotStart) {
  auto s = service();
  auto prepared = s->prepare(text_request("The lamp", 4));
  ASSERT_TRUE(prepared.is_ok());
  bool called = false;
  auto r = s->complete(*prepared, [&](std::string_view, auto) { return called = true; },
                       [] { return true; });
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ExitCode::kInterrupted);
  EXPECT_FALSE(called);
}

// The totals behind GET /metrics add up the requests' own figures, reuse and failures included:
// a request whose client left while it waited is not a failure, one the server's stop ended is.
TEST_F(ServiceTest, TotalsAddUpTheRequests) {
  auto s = service();
  EXPECT_EQ(s->totals().requests, 0u);
  const std::string first = "The lighthouse keeper", second = first + " checked the lamp";
  const Completion a = answer(*s, text_request(first, 1));
  const Completion b = answer(*s, text_request(second, 5));
  ASSERT_GT(b.usage.cached_tokens, 0);
  auto prepared = s->prepare(text_request("The lamp", 4));
  ASSERT_TRUE(prepared.is_ok());
  const auto stop = [] { return true; };
  ASSERT_FALSE(s->complete(*prepared, nullptr, stop).is_ok());  // its client left
  ASSERT_FALSE(s->complete(*prepared, nullptr, stop, nullptr, nullptr, stop).is_ok());
  const ServiceTotals t = s->totals();
  EXPECT_EQ(t.requests, 2u);
  EXPECT_EQ(t.requests_failed, 1u);
  EXPECT_EQ(t.requests_left, 1u);
  EXPECT_EQ(t.prompt_tokens, a.report.gen.prompt_tokens + b.report.gen.prompt_tokens);
  EXPECT_EQ(t.prompt_tokens + t.reused_tokens, a.usage.prompt_tokens + b.usage.prompt_tokens);
  EXPECT_EQ(t.reused_tokens, b.usage.cached_tokens);
  EXPECT_EQ(t.generated_tokens, a.usage.completion_tokens + b.usage.completion_tokens);
  EXPECT_EQ(t.decode_steps, a.report.gen.decode_steps + b.report.gen.decode_steps);
  EXPECT_DOUBLE_EQ(t.prefill_seconds, a.report.gen.prefill_seconds + b.report.gen.prefill_seconds);
  EXPECT_EQ(t.processing, 0);
  EXPECT_EQ(t.waiting, 0);
}

// --cache-ram: a request that does not go on from the last keeps its sequence, and a later
// request going on from a kept one (the longest) runs only the rest, with the answer of a fresh
// service, greedy or sampled; past the limit the least recently used is dropped.
TEST_F(ServiceTest, KeptSequencesLetConversationsTakeTurns) {
  const int64_t ctx = 256;
  auto probe = engine_->model().new_sequence(ctx);
  ASSERT_TRUE(probe.is_ok());
  const uint64_t one = probe->bytes();
  const std::string a1 = "The lighthouse keeper", a2 = a1 + " checked the lamp";
  const std::string b1 = "Seven ships sailed", b2 = b1 + " before dawn";
  const std::string c1 = "A quiet harbour";
  const runtime::SamplingParams sampled{.temperature = 0.9, .seed = 7};
  const auto fresh_text = [&](const std::string& prompt, const runtime::SamplingParams& p) {
    auto fresh = service(ctx);
    return answer(*fresh, text_request(prompt, 8, p)).text;
  };
  for (const runtime::SamplingParams& sampling : {runtime::SamplingParams{}, sampled}) {
    SCOPED_TRACE("temperature " + std::to_string(sampling.temperature));
    auto s = service(ctx, 9, 0, 3 * one);
    const Completion a = answer(*s, text_request(a1, 1, sampling));
    const Completion b = answer(*s, text_request(b1, 1, sampling));
    EXPECT_EQ(b.usage.cached_tokens, 0);
    EXPECT_EQ(s->totals().kept_sequences, 1);
    EXPECT_EQ(s->totals().kept_bytes, one);
    const Completion a_next = answer(*s, text_request(a2, 8, sampling));
    EXPECT_TRUE(a_next.from_kept_sequence);
    EXPECT_EQ(a_next.usage.cached_tokens, a.usage.prompt_tokens);
    EXPECT_EQ(a_next.text, fresh_text(a2, sampling));
    const Completion b_next = answer(*s, text_request(b2, 8, sampling));
    EXPECT_TRUE(b_next.from_kept_sequence);
    EXPECT_EQ(b_next.usage.cached_tokens, b.usage.prompt_tokens);
    EXPECT_EQ(b_next.text, fresh_text(b2, sampling));
    EXPECT_EQ(s->totals().kept_sequence_hits, 2u);
    EXPECT_EQ(s->totals().kept_sequences, 1);  // a_next's (b's was taken back)
  }
  // Room for one: after a, b and c, b's sequence is kept (the most recently left), a's is gone.
  auto s = service(ctx, 9, 0, one);
  const Completion a = answer(*s, text_request(a1, 1));
  answer(*s, text_request(b1, 1));
  answer(*s, text_request(c1, 1));
  EXPECT_EQ(s->totals().kept_sequences, 1);
  const Completion b_next = answer(*s, text_request(b2, 8));
  EXPECT_TRUE(b_next.from_kept_sequence);
  EXPECT_GT(b_next.usage.cached_tokens, 0);
  const Completion a_next = answer(*s, text_request(a2, 8));
  EXPECT_FALSE(a_next.from_kept_sequence);
  EXPECT_EQ(a_next.usage.cached_tokens, 0);
  // A request retried keeps one copy of its sequence: the other conversations stay.
  auto retried = service(ctx, 9, 0, 3 * one);
  const Completion b_first = answer(*retried, text_request(b1, 1));
  for (int i = 0; i < 4; ++i) answer(*retried, text_request(a1, 4));
  EXPECT_EQ(retried->totals().kept_sequences, 2);  // b's and a1's (a1's last run is current)
  const Completion b_again = answer(*retried, text_request(b2, 8));
  EXPECT_TRUE(b_again.from_kept_sequence);
  EXPECT_EQ(b_again.usage.cached_tokens, b_first.usage.prompt_tokens);
  // The request extends the current sequence, but a kept one longer still: that one goes on.
  const std::string p1 = "The";
  const std::vector<uint32_t> p1_ids = tokenizer_->encode(p1, false);
  const std::vector<uint32_t> a1_ids = tokenizer_->encode(a1, false);
  ASSERT_TRUE(std::equal(p1_ids.begin(), p1_ids.end(), a1_ids.begin()));
  auto longest = service(ctx, 9, 0, 3 * one);
  answer(*longest, text_request(a1, 1));
  answer(*longest, text_request(p1, 1));  // a1's kept; p1's current, a prefix of a2
  const Completion from_longest = answer(*longest, text_request(a2, 8));
  EXPECT_TRUE(from_longest.from_kept_sequence);
  EXPECT_EQ(from_longest.usage.cached_tokens, static_cast<int64_t>(a1_ids.size()));
  EXPECT_EQ(from_longest.text, fresh_text(a2, {}));
  // Without --cache-ram nothing is kept.
  auto off = service(ctx);
  answer(*off, text_request(a1, 1));
  answer(*off, text_request(b1, 1));
  const Completion not_kept = answer(*off, text_request(a2, 8));
  EXPECT_EQ(not_kept.usage.cached_tokens, 0);
  EXPECT_EQ(off->totals().kept_sequences, 0);
  EXPECT_EQ(a_next.text, not_kept.text);
  EXPECT_GT(a.usage.prompt_tokens, 0);
}

// A request's thread gives the ops' per-thread buffers back when its turn ends: the server's
// connection threads take turns with the model, and each kept its own set (K3: 117 MB and more
// each, where the budget counts one).
TEST_F(ServiceTest, ARequestsThreadKeepsNoOpBuffersAfterItsTurn) {
  auto s = service();
  auto prepared = s->prepare(text_request("The lighthouse keeper", 3));
  ASSERT_TRUE(prepared.is_ok());
  uint64_t during = 0;
  auto done = s->complete(
      *prepared,
      [&](std::string_view, auto) {
        during = std::max(during, cpu::thread_buffer_bytes());
        return true;
      },
      nullptr);
  ASSERT_TRUE(done.is_ok()) << done.status().message();
  EXPECT_GT(during, 0u) << "the forward pass ran on this thread and grew its buffers";
  EXPECT_EQ(cpu::thread_buffer_bytes(), 0u);
}

// One request generates; the others wait in arrival order, at most max_waiting of them (one
// more is refused at once, "busy", so that waiting requests cannot hold every connection
// thread); a waiting request whose client leaves gives up its place while the first still runs
// (before: it held its thread until the model was free, and a mutex served waiters in no order).
TEST_F(ServiceTest, WaitingRequestsAreServedInArrivalOrderUpToALimit) {
  const std::unique_ptr<Service> service_with_line = service(256, 9, /*max_waiting=*/3);
  Service& s = *service_with_line;
  auto prepared = s.prepare(text_request("The lighthouse keeper", 3));
  ASSERT_TRUE(prepared.is_ok());
  const auto until = [&s](const std::function<bool(const ServiceTotals&)>& ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ready(s.totals()) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return ready(s.totals());
  };
  std::atomic<bool> release{false};
  std::mutex mu;
  std::vector<std::string> order;  // who got the model, in turn
  const auto runs = [&](const std::string& name, std::function<bool()> stop) {
    return std::thread([&, name, stop] {
      bool first_piece = true;
      auto r = s.complete(
          *prepared,
          [&](std::string_view, auto) {
            if (first_piece) {
              first_piece = false;
              std::lock_guard<std::mutex> lock(mu);
              order.push_back(name);
            }
            while (name == "first" && !release)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return true;
          },
          stop);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.is_ok()) order.push_back(name + " not started: " + r.status().message());
    });
  };
  std::atomic<bool> c_left{false};
  std::thread first, b, c, d, e;
  struct JoinAll {  // a failed ASSERT returns early: let every thread end first
    std::atomic<bool>& release;
    std::atomic<bool>& c_left;
    std::vector<std::thread*> threads;
    ~JoinAll() {
      release = true;
      c_left = true;
      for (std::thread* t : threads)
        if (t->joinable()) t->join();
    }
  } join_all{release, c_left, {&first, &b, &c, &d, &e}};
  first = runs("first", nullptr);
  // Until its first piece (its prompt run): a slow machine (a sanitizer, a loaded CI) could
  // otherwise see c leave before the first request streamed anything.
  ASSERT_TRUE(until([&](const ServiceTotals&) {
    std::lock_guard<std::mutex> lock(mu);
    return !order.empty();
  }));
  b = runs("b", nullptr);
  ASSERT_TRUE(until([](const ServiceTotals& t) { return t.waiting == 1; }));
  c = runs("c", [&] { return c_left.load(); });
  ASSERT_TRUE(until([](const ServiceTotals& t) { return t.waiting == 2; }));
  d = runs("d", nullptr);
  ASSERT_TRUE(until([](const ServiceTotals& t) { return t.waiting == 3; }));
  EXPECT_FALSE(s.admission().is_ok());
  bool busy = false;
  auto refused = s.complete(*prepared, nullptr, nullptr, &busy);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_TRUE(busy);
  EXPECT_EQ(refused.status().code(), ExitCode::kInterrupted);
  EXPECT_NE(refused.status().message().find("busy"), std::string::npos);
  c_left = true;
  // c leaves while the first still holds the model (within 0.1 s; 60 s allowed), or the test
  // fails rather than waits for ever.
  ASSERT_TRUE(until([](const ServiceTotals& t) { return t.waiting == 2; }))
      << "the request whose client left did not leave the line";
  c.join();
  EXPECT_EQ(s.totals().waiting, 2);
  EXPECT_TRUE(s.admission().is_ok());
  e = runs("e", nullptr);
  ASSERT_TRUE(until([](const ServiceTotals& t) { return t.waiting == 3; }));
  EXPECT_FALSE(s.admission().is_ok());
  release = true;
  for (std::thread* t : {&first, &b, &d, &e}) t->join();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[0], "first");
  EXPECT_EQ(order[1].rfind("c not started", 0), 0u) << order[1];
  EXPECT_EQ(order[2], "b");
  EXPECT_EQ(order[3], "d");
  EXPECT_EQ(order[4], "e");
  const ServiceTotals t = s.totals();
  EXPECT_EQ(t.requests, 4u);
  EXPECT_EQ(t.requests_failed, 0u);
  EXPECT_EQ(t.requests_left, 1u);  // c; the refused one was never accepted
  EXPECT_EQ(t.waiting, 0);
  EXPECT_EQ(t.processing, 0);
}

// A completions batch keeps its place in the line between its prompts (its connection's thread is
// taken all along): the place counts against max_waiting, so another request cannot take it and
// the batch's next prompt, which joins with it unrefused, push the line past the limit (before,
// a batch's later prompts joined past the limit while others had filled it meanwhile: 27
// waiting against 24 under load).
TEST_F(ServiceTest, ABatchKeepsItsPlaceInLineBetweenItsPrompts) {
  const std::unique_ptr<Service> service_with_line = service(256, 9, /*max_waiting=*/1);
  Service& s = *service_with_line;
  auto prepared = s.prepare(text_request("The lighthouse keeper", 2));
  ASSERT_TRUE(prepared.is_ok());
  const auto sink = [](std::string_view, auto) { return true; };
  {
    LinePlace place(s);
    for (int prompt = 0; prompt < 3; ++prompt) {
      SCOPED_TRACE(prompt);
      bool busy = true;
      auto r = s.complete(*prepared, sink, nullptr, &busy, &place);
      ASSERT_TRUE(r.is_ok()) << r.status().message();
      EXPECT_FALSE(busy);
      EXPECT_EQ(s.totals().waiting, 1);  // the batch, between two prompts
      EXPECT_FALSE(s.admission().is_ok()) << "the batch's place was free for another request";
      auto other = s.complete(*prepared, sink, nullptr, &busy);
      EXPECT_FALSE(other.is_ok());
      EXPECT_TRUE(busy);
    }
  }
  EXPECT_TRUE(s.admission().is_ok()) << "the batch ended and kept its place";
  EXPECT_EQ(s.totals().waiting, 0);
  EXPECT_EQ(s.totals().requests, 3u);
}

// llama-server's /tokenize and /detokenize (server/tokenize_api.h) with the model's tokenizer:
// the ids a completion's prompt runs (special-token names as their ids), pieces that
// concatenate to the text, ids read back.
TEST_F(ServiceTest, TokenizeAndDetokenizeAsLlamaServer) {
  const std::string text = "The lamp <|open|> caf\u00e9";
  const nlohmann::json body = {{"content", text}};
  auto r = tokenize_response(*tokenizer_, body.dump());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const std::vector<uint32_t> want = tokenizer_->encode(text, true);
  EXPECT_EQ((*r)["tokens"].get<std::vector<uint32_t>>(), want);
  auto as_text = tokenize_response(
      *tokenizer_, nlohmann::json{{"content", text}, {"parse_special", false}}.dump());
  ASSERT_TRUE(as_text.is_ok());
  EXPECT_EQ((*as_text)["tokens"].get<std::vector<uint32_t>>(), tokenizer_->encode(text, false));
  EXPECT_GT((*as_text)["tokens"].size(), want.size());  // <|open|> is one id in `want`
  auto pieces = tokenize_response(
      *tokenizer_, nlohmann::json{{"content", text}, {"with_pieces", true}}.dump());
  ASSERT_TRUE(pieces.is_ok());
  std::string joined;
  for (const nlohmann::json& p : (*pieces)["tokens"]) {
    if (p["piece"].is_string()) {
      joined += p["piece"].get<std::string>();
    } else {  // a piece that is not UTF-8 by itself: its bytes
      for (const nlohmann::json& b : p["piece"]) joined += static_cast<char>(b.get<int>());
    }
  }
  EXPECT_EQ(joined, text);
  auto back = detokenize_response(*tokenizer_, nlohmann::json{{"tokens", want}}.dump());
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ((*back)["content"], text);

  const auto refused = [&](const Result<nlohmann::json>& res, const std::string& param) {
    ASSERT_FALSE(res.is_ok());
    EXPECT_EQ(res.status().code(), ExitCode::kUsage);
    EXPECT_EQ(error_param(res.status()).value_or(""), param) << res.status().message();
  };
  refused(tokenize_response(*tokenizer_, R"({"content": 5})"), "content");
  refused(tokenize_response(*tokenizer_, R"({"content": "a", "add_special": true})"),
          "add_special");
  refused(tokenize_response(*tokenizer_, R"({"content": "a", "with_pieces": 1})"), "with_pieces");
  refused(detokenize_response(*tokenizer_, R"({"tokens": [1, -2]})"), "tokens[1]");
  refused(detokenize_response(*tokenizer_, nlohmann::json{{"tokens", {tokenizer_->vocab_size()}}}
                                               .dump()),
          "tokens[0]");
  refused(detokenize_response(*tokenizer_, R"({"tokens": "1,2"})"), "tokens");
  EXPECT_FALSE(detokenize_response(*tokenizer_, "[1]").is_ok());
}

TEST_F(ServiceTest, TheContextBoundsARequest) {
  auto s = service(/*ctx=*/12);
  const std::string long_prompt = "The lighthouse keeper checked the lamp, the lens and the";
  ASSERT_GT(tokenizer_->encode(long_prompt, false).size(), 12u);
  auto p = s->prepare(text_request(long_prompt, 1));
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), ExitCode::kBudget);
  EXPECT_NE(p.status().message().find("-c/--ctx-size 12"), std::string::npos);
  const std::string prompt = "The lamp";
  const int64_t n = static_cast<int64_t>(tokenizer_->encode(prompt, false).size());
  ASSERT_LT(n, 12);
  p = s->prepare(text_request(prompt, 12 - n + 2));
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("max_tokens"), std::string::npos);
  // Without max_tokens: the default (9), capped to what is left.
  CompletionRequest r = text_request(prompt, 1);
  r.max_tokens.reset();
  p = s->prepare(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, std::min<int64_t>(9, 12 - n + 1));
  EXPECT_EQ(p->max_tokens_is_context_end, 9 > 12 - n + 1);
  // A limit asked for that the context holds exactly is the request's, not the context's.
  p = s->prepare(text_request(prompt, 12 - n + 1));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, 12 - n + 1);
  EXPECT_FALSE(p->max_tokens_is_context_end);
  r.to_context_end = true;  // llama-server's n_predict -1: all that is left
  p = s->prepare(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, 12 - n + 1);
  EXPECT_TRUE(p->max_tokens_is_context_end);
  // llama-server's /completion stops where the context ends, past it too.
  CompletionRequest native = text_request(prompt, 100);
  native.endpoint = Endpoint::kLlamaCompletion;
  p = s->prepare(native);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, 12 - n + 1);
  EXPECT_TRUE(p->max_tokens_is_context_end);
  const Completion filled = answer(*s, native);
  ASSERT_EQ(filled.finish, FinishReason::kLength) << "the tiny model's answer changed";
  EXPECT_EQ(filled.report_json.at("stop"), "context end");
  // The same where the server's -n is -1 and the request gives no limit.
  auto unbounded = service(/*ctx=*/12, /*default_max_tokens=*/-1);
  r.to_context_end = false;
  p = unbounded->prepare(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, 12 - n + 1);
  EXPECT_TRUE(p->max_tokens_is_context_end);
  p = unbounded->prepare(text_request(prompt, 2));
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->max_tokens, 2);
  EXPECT_FALSE(p->max_tokens_is_context_end);
  EXPECT_EQ(answer(*unbounded, text_request(prompt, 2)).report_json.at("stop"), "length limit");
  // The prompt as token ids (OpenAI's and llama-server's array): those ids, checked against
  // the vocabulary (a client's error, naming the field).
  const std::vector<uint32_t> encoded = tokenizer_->encode(prompt, false);
  CompletionRequest by_ids = text_request("", 2);
  by_ids.prompt_pieces = id_pieces(encoded);
  p = s->prepare(by_ids);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->ids, std::vector<int32_t>(encoded.begin(), encoded.end()));
  const int32_t vocab = static_cast<int32_t>(engine_->checkpoint().config().vocab_size);
  by_ids.prompt_pieces = {1, vocab};
  p = s->prepare(by_ids);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), ExitCode::kUsage);
  EXPECT_EQ(error_param(p.status()), "prompt") << p.status().message();
  // n_predict 0 (llama-server's): the prompt runs and is kept, nothing is generated; a prompt
  // of all 12 positions fits.
  CompletionRequest full = by_ids;
  full.prompt_pieces.assign(12, 1);
  full.max_tokens = 0;
  EXPECT_TRUE(s->prepare(full).is_ok());
  full.prompt_pieces.emplace_back(1);
  p = s->prepare(full);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), ExitCode::kBudget);
  auto roomy = service();
  CompletionRequest warm = text_request(prompt, 1);
  warm.endpoint = Endpoint::kLlamaCompletion;
  warm.max_tokens = 0;
  const Completion warmed = answer(*roomy, warm);
  EXPECT_EQ(warmed.text, "");
  EXPECT_EQ(warmed.usage.completion_tokens, 0);
  EXPECT_EQ(warmed.finish, FinishReason::kLength);
  // The same prompt again samples from the logits the sequence holds: nothing runs before it.
  const Completion same = answer(*roomy, text_request(prompt, 4));
  EXPECT_EQ(same.usage.cached_tokens, n);
  EXPECT_EQ(same.report.gen.prompt_tokens, 0);
  EXPECT_EQ(same.text, answer(*service(), text_request(prompt, 4)).text);
  EXPECT_EQ(answer(*roomy, warm).usage.cached_tokens, 0);  // not a prefix of what ran now
  const Completion next = answer(*roomy, text_request(prompt + " and the lens", 2));
  EXPECT_EQ(next.usage.cached_tokens, n);
  auto empty = s->prepare(text_request("", 3));
  ASSERT_FALSE(empty.is_ok());
  EXPECT_EQ(empty.status().code(), ExitCode::kUsage);
}

TEST_F(ServiceTest, AClientThatGoesAwayEndsTheAnswerAndTheNextRequestIsSound) {
  auto s = service();
  const std::string prompt = "The lighthouse keeper";
  auto prepared = s->prepare(text_request(prompt, 16));
  ASSERT_TRUE(prepared.is_ok());
  int pieces = 0;
  auto gone = s->complete(*prepared, [&](std::string_view, auto) { return ++pieces < 1; }, nullptr);
  ASSERT_TRUE(gone.is_ok()) << gone.status().message();
  EXPECT_TRUE(gone->cancelled);
  EXPECT_EQ(pieces, 1);
  EXPECT_LT(gone->usage.completion_tokens, 16);
  // A stop requested (the server stopping) ends it the same way.
  bool stop = false;
  auto stopped = s->complete(*prepared, [&](std::string_view, auto) { return stop = true; },
                             [&] { return stop; });
  ASSERT_TRUE(stopped.is_ok());
  EXPECT_TRUE(stopped->cancelled);
  EXPECT_LT(stopped->usage.completion_tokens, 16);
  auto fresh = service();
  EXPECT_EQ(answer(*s, text_request(prompt + " checked", 6)).text,
            answer(*fresh, text_request(prompt + " checked", 6)).text);
}

// An exception out of a forward pass (std::bad_alloc in a layer; cpp-httplib answers 500 and
// serves on) leaves the sequence part-run: some layers' states hold the chunk, the ids do not.
// The next request that begins with the same ids must not go on from it.
TEST_F(ServiceTest, AnExceptionInAForwardPassLeavesNoSequenceToReuse) {
  struct ThrowInSecondChunk final : model::LayerObserver {
    int forwards = 0;
    void after_layer(int64_t layer, const float*, int64_t, int64_t) override {
      if (layer == 0) ++forwards;
      if (forwards == 2 && layer == 2) throw std::bad_alloc();
    }
  } thrower;
  auto s = service();  // chunks of 7
  const std::string prompt = "The lighthouse keeper checked the lamp, the lens and the log";
  auto prepared = s->prepare(text_request(prompt, 4));
  ASSERT_TRUE(prepared.is_ok());
  ASSERT_GT(prepared->ids.size(), 14u);
  engine_->model().set_layer_observer(&thrower);
  EXPECT_THROW((void)s->complete(*prepared, [](std::string_view, auto) { return true; }, nullptr),
               std::bad_alloc);
  engine_->model().set_layer_observer(nullptr);
  EXPECT_EQ(s->totals().processing, 0);
  const Completion next = answer(*s, text_request(prompt, 4));
  EXPECT_EQ(next.usage.cached_tokens, 0);
  EXPECT_EQ(next.text, answer(*service(), text_request(prompt, 4)).text);
}

// A client that leaves while its prompt runs (`serve` asks between prompt chunks) stops it
// there; the prompt's chunks that ran are reused by the next request, which answers as a fresh
// sequence would.
TEST_F(ServiceTest, AnAnswerStoppedInItsPromptLeavesASoundPrefix) {
  auto s = service();  // chunks of 7
  const std::string prompt =
      "The lighthouse keeper checked the lamp, the lens and the log before the storm came in";
  auto prepared = s->prepare(text_request(prompt, 4));
  ASSERT_TRUE(prepared.is_ok());
  const int64_t n = static_cast<int64_t>(prepared->ids.size());
  ASSERT_GT(n, 21);
  int asked = 0;  // the first ask is before the request starts
  auto stopped = s->complete(*prepared, [](std::string_view, auto) { return true; },
                             [&] { return ++asked > 2; });
  ASSERT_TRUE(stopped.is_ok()) << stopped.status().message();
  EXPECT_TRUE(stopped->cancelled);
  EXPECT_EQ(stopped->usage.completion_tokens, 0);
  EXPECT_EQ(stopped->text, "");
  const Completion next = answer(*s, text_request(prompt, 4));
  EXPECT_GT(next.usage.cached_tokens, 0);
  EXPECT_LT(next.usage.cached_tokens, n);
  EXPECT_EQ(next.text, answer(*service(), text_request(prompt, 4)).text);
}

// The server stopping (abandon_requested) ends the answer inside a forward pass of its prompt:
// nothing is sampled, the part-run sequence is not reused by the next request, which answers as
// a fresh one would, and the request counts as failed (its client gets an error).
TEST_F(ServiceTest, AnAnswerAbandonedInsideAPassLeavesNoSequenceToReuse) {
  auto s = service();  // chunks of 7
  const std::string prompt =
      "The lighthouse keeper checked the lamp, the lens and the log before the storm came in";
  auto prepared = s->prepare(text_request(prompt, 4));
  ASSERT_TRUE(prepared.is_ok());
  ASSERT_GT(prepared->ids.size(), 14u);
  const int64_t boundaries = engine_->checkpoint().config().num_hidden_layers - 1;
  int64_t asked = 0;  // inside the second chunk, after its third layer; then it stays stopping
  auto stopped = s->complete(
      *prepared, [](std::string_view, auto) { return true; }, nullptr, nullptr,
      nullptr, [&] { return asked == boundaries + 3 || ++asked == boundaries + 3; });
  ASSERT_TRUE(stopped.is_ok()) << stopped.status().message();
  EXPECT_EQ(asked, boundaries + 3);
  EXPECT_TRUE(stopped->cancelled);
  EXPECT_EQ(stopped->usage.completion_tokens, 0);
  EXPECT_EQ(stopped->report.gen.prompt_tokens, 7);
  EXPECT_EQ(stopped->text, "");
  EXPECT_EQ(s->totals().requests_failed, 1u);
  EXPECT_EQ(s->totals().requests, 0u);
  const Completion next = answer(*s, text_request(prompt, 4));
  EXPECT_EQ(next.usage.cached_tokens, 0);
  EXPECT_EQ(next.text, answer(*service(), text_request(prompt, 4)).text);
}

}  // namespace
}  // namespace ktier::server
