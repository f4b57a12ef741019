// `ktier serve` over HTTP (cli/cmd_serve.cpp): a client of the OpenAI API gets the text
// `ktier run --chat` prints for the same message, streamed or whole; bad requests are answered
// with OpenAI's error body naming the field; Ctrl-C stops the server (exit 0); what cannot start
// says why with its exit code.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/child_process.h"
#include "common/run_process.h"
#include "common/test_paths.h"
#include "serve_cli_fixture.h"
#include "server/service.h"
#include "tokenizer/tokenizer.h"

namespace ktier::test {
namespace {

using nlohmann::json;
using Stream = ChildProcess::Stream;


// The text `ktier run --chat` prints for one message, as JSON carries it.
std::string run_chat_text(const fs::path& model, const std::string& message, int n) {
  const auto r = run_process(ktier_bin().string() + " run -m " + model.string() +
                             " --chat -n " + std::to_string(n) + " -p '" + message + "'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  return server::valid_utf8(r.out.substr(0, r.out.size() - 1));  // without run's last "\n"
}

// The events of a stream, as JSON ([DONE] left out; `done` says whether it came: nothing may
// follow it).
std::vector<json> stream_events(const std::string& body, bool* done = nullptr) {
  std::vector<json> events;
  bool ended = false;
  size_t at = 0;
  for (size_t end; (end = body.find("\n\n", at)) != std::string::npos; at = end + 2) {
    const std::string event = body.substr(at, end - at);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(ended) << "an event after [DONE]: " << event;
    if (event == "data: [DONE]") ended = true;
    else events.push_back(json::parse(event.substr(6)));
  }
  EXPECT_EQ(at, body.size());
  if (done) *done = ended;
  return events;
}

TEST_F(ServeCli, AnswersAsRunDoesStreamedOrWholeAndStopsOnCtrlC) {
  ChildProcess server(serve_argv(dir_ / "model"));
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  httplib::Client client = client_at(port);

  auto health = client.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto v1_health = client.Get("/v1/health");  // a probe given the /v1 base URL
  ASSERT_TRUE(v1_health);
  EXPECT_EQ(v1_health->status, 200);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny-test");
  auto models_alias = client.Get("/models");
  ASSERT_TRUE(models_alias);
  EXPECT_EQ(json::parse(models_alias->body)["data"][0]["id"], "tiny-test");
  auto props = client.Get("/props");  // llama-server's: the defaults and the context
  ASSERT_TRUE(props);
  ASSERT_EQ(props->status, 200) << props->body;
  EXPECT_EQ(json::parse(props->body)["default_generation_settings"]["n_ctx"], 4096);
  // llama-server's /tokenize and /detokenize.
  auto ids = client.Post("/tokenize", R"({"content": "hello there"})", "application/json");
  ASSERT_TRUE(ids);
  ASSERT_EQ(ids->status, 200) << ids->body;
  const json tokens = json::parse(ids->body)["tokens"];
  EXPECT_FALSE(tokens.empty());
  auto detok = client.Post("/detokenize", json{{"tokens", tokens}}.dump(), "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], "hello there") << detok->body;
  // A browser's preflight for a front-end on another origin, answered as llama-server does.
  httplib::Headers preflight = {{"Origin", "http://localhost:3000"},
                                {"Access-Control-Request-Method", "POST"},
                                {"Access-Control-Request-Headers", "content-type"}};
  auto options = client.Options("/v1/chat/completions", preflight);
  ASSERT_TRUE(options);
  EXPECT_EQ(options->status, 204);
  EXPECT_EQ(options->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_NE(options->get_header_value("Access-Control-Allow-Methods").find("POST"),
            std::string::npos);
  EXPECT_EQ(options->get_header_value("Access-Control-Allow-Headers"), "content-type");
  auto no_metrics = client.Get("/metrics");  // without --metrics, as llama-server
  ASSERT_TRUE(no_metrics);
  EXPECT_EQ(no_metrics->status, 501);
  EXPECT_NE(no_metrics->body.find("--metrics"), std::string::npos) << no_metrics->body;

  const std::string want = run_chat_text(dir_ / "model", "hello there", 8);
  const json request = {{"messages", {{{"role", "user"}, {"content", "hello there"}}}},
                        {"max_tokens", 8},
                        {"temperature", 0}};
  auto whole = client.Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json body = json::parse(whole->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "tiny-test");
  // A prefix drawn at start, then the request's number: ids do not repeat across restarts.
  EXPECT_TRUE(std::regex_match(body["id"].get<std::string>(),
                               std::regex("chatcmpl-[0-9a-f]{16}-[0-9]+")))
      << body["id"];
  EXPECT_EQ(whole->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(body["choices"][0]["message"]["content"], want);
  EXPECT_GE(body["usage"]["completion_tokens"].get<int>(), 1);
  // llama-server's timings, its way: rates are n over the time, per-token times the reverse.
  const json& t = body["timings"];
  for (const char* part : {"prompt", "predicted"}) {
    const double n = t[std::string(part) + "_n"].get<double>();
    const double ms = t[std::string(part) + "_ms"].get<double>();
    ASSERT_GT(n, 0) << t;
    EXPECT_DOUBLE_EQ(t[std::string(part) + "_per_second"].get<double>(), ms > 0 ? 1e3 * n / ms : 0)
        << t;
    EXPECT_DOUBLE_EQ(t[std::string(part) + "_per_token_ms"].get<double>(), ms / n) << t;
  }
  EXPECT_TRUE(body["ktier"].contains("tiers"));

  json streaming = request;
  streaming["stream"] = true;
  streaming["stream_options"] = {{"include_usage", true}};
  auto events = client.Post("/v1/chat/completions", streaming.dump(), "application/json");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->status, 200);
  EXPECT_EQ(events->get_header_value("Content-Type"), "text/event-stream");
  std::string text, finish;
  bool role = false, usage = false, done = false;
  for (const json& j : stream_events(events->body, &done)) {
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j.contains("usage")) {
      usage = true;
      EXPECT_EQ(j["usage"], body["usage"]);
      continue;
    }
    const json& choice = j["choices"][0];
    if (choice["delta"].contains("role")) role = true;
    if (choice["delta"].contains("content")) text += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) {
      finish = choice["finish_reason"];
      // llama-server's timings on the last chunk, as in the usage chunk.
      EXPECT_TRUE(j.contains("timings") && j["timings"].contains("predicted_per_second")) << j;
    }
  }
  EXPECT_TRUE(role && usage && done);
  EXPECT_EQ(text, want);
  EXPECT_EQ(finish, body["choices"][0]["finish_reason"]);

  // Text completion: the prompt as it is.
  auto completion = client.Post(
      "/v1/completions", json{{"prompt", "The lamp"}, {"max_tokens", 3}, {"seed", 5}}.dump(),
      "application/json");
  ASSERT_TRUE(completion);
  ASSERT_EQ(completion->status, 200) << completion->body;
  const json v1 = json::parse(completion->body);
  EXPECT_EQ(v1["object"], "text_completion");
  // A batch of prompts (OpenAI's, lm-eval-harness's): one choice each, answered as alone.
  const json ids_request = {{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"seed", 5}};
  auto alone = client.Post("/v1/completions", ids_request.dump(), "application/json");
  ASSERT_TRUE(alone);
  ASSERT_EQ(alone->status, 200) << alone->body;
  const json batch_request = {{"prompt", {"The lamp", {1, 2, 3}}}, {"max_tokens", 3}, {"seed", 5}};
  auto batch = client.Post("/v1/completions", batch_request.dump(), "application/json");
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->status, 200) << batch->body;
  const json b = json::parse(batch->body);
  ASSERT_EQ(b["choices"].size(), 2u) << b.dump();
  EXPECT_EQ(b["choices"][0]["text"], v1["choices"][0]["text"]);
  EXPECT_EQ(b["choices"][1]["text"], json::parse(alone->body)["choices"][0]["text"]);
  EXPECT_EQ(b["choices"][1]["index"], 1);
  EXPECT_EQ(b["choices"][1]["timings"]["predicted_n"],
            json::parse(alone->body)["timings"]["predicted_n"]);
  EXPECT_TRUE(b["choices"][0]["ktier"].is_object()) << b.dump();
  EXPECT_EQ(b["usage"]["completion_tokens"],
            v1["usage"]["completion_tokens"].get<int>() +
                json::parse(alone->body)["usage"]["completion_tokens"].get<int>());
  json streamed_batch = batch_request;
  streamed_batch["stream"] = true;
  auto refused = client.Post("/v1/completions", streamed_batch.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  // A prompt of the batch that cannot run: 400 saying which.
  auto bad_item = client.Post("/v1/completions", R"({"prompt": ["a", [1, 99999]]})",
                              "application/json");
  ASSERT_TRUE(bad_item);
  EXPECT_EQ(bad_item->status, 400) << bad_item->body;
  EXPECT_NE(bad_item->body.find("In the batch: prompt 1 (from 0)"), std::string::npos)
      << bad_item->body;

  // llama-server's own /completion: the same answer, whole or streamed (pieces, then the result
  // with "stop" true and content ""; no [DONE]), the prompt as text or as its token ids.
  auto lamp_ids = client.Post("/tokenize", R"({"content": "The lamp"})", "application/json");
  ASSERT_TRUE(lamp_ids);
  for (const json& prompt : {json("The lamp"), json::parse(lamp_ids->body)["tokens"]}) {
    SCOPED_TRACE(prompt.dump());
    const json native_request = {{"prompt", prompt}, {"n_predict", 3}, {"seed", 5}};
    auto native = client.Post("/completion", native_request.dump(), "application/json");
    ASSERT_TRUE(native);
    ASSERT_EQ(native->status, 200) << native->body;
    const json n = json::parse(native->body);
    EXPECT_EQ(n["content"], v1["choices"][0]["text"]);
    EXPECT_EQ(n["stop"], true);
    EXPECT_EQ(n["tokens_predicted"], v1["usage"]["completion_tokens"]);
    EXPECT_EQ(n["tokens_evaluated"], v1["usage"]["prompt_tokens"]);
    EXPECT_EQ(n["stop_type"], v1["choices"][0]["finish_reason"] == "length" ? "limit" : "eos");
    EXPECT_TRUE(n["timings"].contains("predicted_per_second"));
    // What llama-server says of the request: its prompt's text, the values it ran with, and the
    // positions the sequence now holds (the last token drawn is not run).
    EXPECT_EQ(n["prompt"], "The lamp");
    EXPECT_EQ(n["generation_settings"]["n_predict"], 3);
    EXPECT_EQ(n["generation_settings"]["seed"], 5);
    EXPECT_EQ(n["tokens_cached"],
              n["tokens_evaluated"].get<int64_t>() + n["tokens_predicted"].get<int64_t>() - 1);
    EXPECT_EQ(n["has_new_line"], n["content"].get<std::string>().find('\n') != std::string::npos);
    json stream_request = native_request;
    stream_request["stream"] = true;
    auto pieces = client.Post("/completions", stream_request.dump(), "application/json");
    ASSERT_TRUE(pieces);
    ASSERT_EQ(pieces->status, 200) << pieces->body;
    std::string streamed;
    json last;
    bool done_sent = false;
    for (const json& j : stream_events(pieces->body, &done_sent)) {
      ASSERT_FALSE(last.is_object()) << "an event after the result: " << j.dump();
      if (j["stop"] == true) last = j;
      else streamed += j["content"].get<std::string>();
    }
    EXPECT_FALSE(done_sent);  // llama-server's stream has no [DONE]
    EXPECT_EQ(streamed, n["content"]);
    ASSERT_TRUE(last.is_object()) << pieces->body;
    EXPECT_EQ(last["content"], "");
    EXPECT_EQ(last["stop_type"], n["stop_type"]);
    for (const char* field : {"prompt", "generation_settings", "has_new_line", "tokens_cached"})
      EXPECT_EQ(last[field], n[field]) << field;
  }
  // A stop text: "word", named; the answer ends before it.
  const std::string lamp_text = v1["choices"][0]["text"];
  ASSERT_FALSE(lamp_text.empty());
  auto worded = client.Post(
      "/completion",
      json{{"prompt", "The lamp"}, {"n_predict", 3}, {"seed", 5}, {"stop", {lamp_text}}}.dump(),
      "application/json");
  ASSERT_TRUE(worded);
  const json w = json::parse(worded->body);
  EXPECT_EQ(w["content"], "");
  EXPECT_EQ(w["stop_type"], "word");
  EXPECT_EQ(w["stopping_word"], lamp_text);
  // OpenAI's chat path without /v1, as llama-server answers it.
  auto alias = client.Post("/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(alias);
  EXPECT_EQ(json::parse(alias->body)["choices"][0]["message"]["content"], want);

  // Errors: OpenAI's body, the field named.
  const auto post_error = [&](const std::string& path, const std::string& payload, int status,
                              const std::string& needle) {
    auto res = client.Post(path, payload, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const json e = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << res->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << res->body;
  };
  post_error("/v1/chat/completions", "{not json", 400, "not valid JSON");
  post_error("/v1/chat/completions",
             json{{"messages", {{{"role", "system"}, {"content", "x"}}}}}.dump(), 400,
             "messages[0].role");
  post_error("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 5000}}.dump(), 400,
             "-c/--ctx-size 4096");
  post_error("/v1/completions", json{{"prompt", "x"}, {"n_predict", 5}}.dump(), 400,
             "POST /completion");
  post_error("/completion", json{{"prompt", {1, 2, 100000}}}.dump(), 400,
             "id 100000 is past the vocabulary");
  post_error("/completion", json{{"prompt", std::vector<int>(4097, 1)}}.dump(), 400,
             "the prompt's 4097 tokens need more positions");
  // `curl -d` sends JSON as a form: read as JSON, past cpp-httplib's 8 KiB form limit too.
  const json long_ids = {{"prompt", std::vector<int>(3000, 300)}, {"n_predict", 0}};
  ASSERT_GT(long_ids.dump().size(), 8192u);
  auto form = client.Post("/completion", long_ids.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  ASSERT_EQ(form->status, 200) << form->body;
  EXPECT_EQ(json::parse(form->body)["tokens_evaluated"], 3000);
  EXPECT_EQ(json::parse(form->body)["content"], "");
  // A chunked body (no Content-Length) is held to the payload limit as it arrives: 256 bytes a
  // position of -c 4096 plus 1 MiB.
  const size_t limit = 4096 * 256 + (size_t{1} << 20);
  httplib::Client kept = client_at(port);  // a keep-alive client (httplib's default closes)
  kept.set_keep_alive(true);
  for (const size_t size : {limit, limit + 1}) {
    std::string big = R"({"content": "a")";
    big.append(size - big.size() - 1, ' ');
    big += "}";
    size_t at = 0;
    auto res = kept.Post(
        "/tokenize",
        [&](size_t, httplib::DataSink& sink) {
          const size_t n = std::min<size_t>(64 << 10, big.size() - at);
          if (n == 0) {
            sink.done();
            return true;
          }
          at += n;
          return sink.write(big.data() + at - n, n);
        },
        "application/json");
    ASSERT_TRUE(res) << size << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, size == limit ? 200 : 413) << size << ": " << res->body;
    // The rest of a refused body is left unread: the connection must not be kept.
    if (size > limit) {
      EXPECT_EQ(res->get_header_value("Connection"), "close");
    }
  }
  auto missing = client.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["message"], "no such endpoint: GET /v1/nothing");
  auto bad_field = client.Post("/v1/completions", R"({"prompt": "a", "top_p": 2})",
                               "application/json");
  ASSERT_TRUE(bad_field);
  EXPECT_EQ(json::parse(bad_field->body)["error"]["param"], "top_p");

  // A second server on the port taken by this one does not start (and share it).
  std::vector<std::string> second = serve_argv(dir_ / "model");
  second[5] = std::to_string(port);
  ASSERT_EQ(second[4], "--port");
  ChildProcess other(second);
  EXPECT_EQ(other.wait(), 1) << other.err();
  EXPECT_NE(other.err().find("cannot listen on 127.0.0.1:" + std::to_string(port)),
            std::string::npos) << other.err();

  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
  EXPECT_NE(server.err().find("server stopped"), std::string::npos) << server.err();
  EXPECT_NE(server.err().find("/v1/chat/completions: prompt"), std::string::npos);
  EXPECT_NE(server.err().find("/completion: prompt"), std::string::npos);
}

// Log-probabilities in each endpoint's form, whole or streamed with the text they belong to:
// the same tokens either way, one for each token of the answer (chat: of its content), the
// bytes of those the text shows making it up.
TEST_F(ServeCli, LogprobsComeWithTheAnswerWholeOrStreamed) {
  ChildProcess server(serve_argv(dir_ / "model"));
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  httplib::Client client = client_at(port);
  auto tokenizer = tok::Tokenizer::load((dir_ / "model").string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().message();
  struct Case {
    const char* path;
    json request;
    // The text and the logprobs entries (one JSON per token, legacy completions' put together)
    // of a whole body or of a stream's event.
    std::function<std::pair<std::string, std::vector<json>>(const json&)> read;
  };
  const auto chat_read = [](const json& j) {
    std::pair<std::string, std::vector<json>> out;
    if (!j.contains("choices") || j["choices"].empty()) return out;  // the usage event
    const json& c = j["choices"][0];
    const json& m = c.contains("message") ? c["message"] : c["delta"];
    if (m.contains("content")) out.first = m["content"];
    EXPECT_TRUE(c.contains("logprobs")) << j.dump();  // null where there are none
    if (!c.value("logprobs", json()).is_null())
      for (const json& e : c["logprobs"]["content"]) out.second.push_back(e);
    return out;
  };
  const auto legacy_read = [](const json& j) {
    std::pair<std::string, std::vector<json>> out;
    const json& c = j["choices"][0];
    out.first = c["text"];
    if (c["logprobs"].is_null()) return out;
    const json& lp = c["logprobs"];
    for (size_t i = 0; i < lp["tokens"].size(); ++i)
      out.second.push_back({{"token", lp["tokens"][i]},
                            {"logprob", lp["token_logprobs"][i]},
                            {"top", lp["top_logprobs"][i]},
                            {"text_offset", lp["text_offset"][i]}});
    return out;
  };
  const auto native_read = [](const json& j) {
    std::pair<std::string, std::vector<json>> out;
    out.first = j["content"];
    if (j.contains("completion_probabilities"))
      for (const json& e : j["completion_probabilities"]) out.second.push_back(e);
    return out;
  };
  const json user = json::array({{{"role", "user"}, {"content", "hello there"}}});
  const std::vector<Case> cases = {
      {"/v1/chat/completions",
       {{"messages", user}, {"max_tokens", 9}, {"seed", 3}, {"logprobs", true},
        {"top_logprobs", 2}},
       chat_read},
      {"/v1/completions", {{"prompt", "The lamp"}, {"max_tokens", 9}, {"seed", 3}, {"logprobs", 2}},
       legacy_read},
      {"/completion", {{"prompt", "The lamp"}, {"n_predict", 9}, {"seed", 3}, {"n_probs", 2}},
       native_read},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    auto whole = client.Post(c.path, c.request.dump(), "application/json");
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const auto [text, tokens] = c.read(json::parse(whole->body));
    ASSERT_FALSE(tokens.empty()) << whole->body;
    std::string bytes;  // the tokens' bytes (legacy completions: their offsets, no bytes)
    int64_t offset = 0;
    for (const json& t : tokens) {
      // (/completion lists a stop or special token too, which the text does not show.)
      if (!t.contains("id") || tok::shown_as_text(*tokenizer, {}, t["id"].get<int32_t>()))
        for (const json& b : t.value("bytes", json::array()))
          bytes += static_cast<char>(b.get<int>());
      EXPECT_LE(offset, t.value("text_offset", offset));
      offset = t.value("text_offset", offset);
      if (t.contains("top")) {  // legacy: text -> logprob, the sampled token's text in it
        EXPECT_TRUE(t["top"].contains(t["token"].get<std::string>())) << t.dump();
        EXPECT_LE(t["top"].size(), 3u);
      } else {
        EXPECT_EQ(t["top_logprobs"].size(), 2u);
      }
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
    }
    if (std::string_view(c.path) != "/v1/completions") {
      EXPECT_EQ(server::valid_utf8(bytes), text);
    } else {
      EXPECT_LT(offset, static_cast<int64_t>(text.size()));
    }
    json streaming = c.request;
    streaming["stream"] = true;
    auto events = client.Post(c.path, streaming.dump(), "application/json");
    ASSERT_TRUE(events);
    ASSERT_EQ(events->status, 200) << events->body;
    std::string streamed;
    std::vector<json> streamed_tokens;
    for (const json& e : stream_events(events->body)) {
      auto [piece, with] = c.read(e);
      if (e.value("stop", false)) {
        EXPECT_TRUE(with.empty()) << "the last event repeats them";
      }
      streamed += piece;
      streamed_tokens.insert(streamed_tokens.end(), with.begin(), with.end());
    }
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(streamed_tokens, tokens);
    // Not asked: null (OpenAI's) or absent (llama-server's).
    json plain = c.request;
    for (const char* field : {"logprobs", "top_logprobs", "n_probs"}) plain.erase(field);
    auto none = client.Post(c.path, plain.dump(), "application/json");
    ASSERT_TRUE(none);
    const json n = json::parse(none->body);
    EXPECT_EQ(c.read(n).first, text);
    EXPECT_TRUE(c.read(n).second.empty());
    EXPECT_TRUE(n.contains("choices") ? n["choices"][0]["logprobs"].is_null()
                                      : !n.contains("completion_probabilities"));
  }
  // lm-eval-harness's loglikelihood request: the prompt's ids, echo, max_tokens 1, logprobs 1:
  // the prompt's tokens first, the first unscored (null).
  auto lit = client.Post("/tokenize", R"({"content": "The lamp is lit"})", "application/json");
  ASSERT_TRUE(lit);
  const json prompt_ids = json::parse(lit->body)["tokens"];
  auto scored = client.Post("/v1/completions",
                            json{{"prompt", prompt_ids}, {"max_tokens", 1}, {"logprobs", 1},
                                 {"echo", true}, {"temperature", 0}}
                                .dump(),
                            "application/json");
  ASSERT_TRUE(scored);
  ASSERT_EQ(scored->status, 200) << scored->body;
  const json choice = json::parse(scored->body)["choices"][0];
  EXPECT_EQ(choice["text"].get<std::string>().rfind("The lamp is lit", 0), 0u);
  const json& lp = choice["logprobs"];
  ASSERT_GE(lp["tokens"].size(), prompt_ids.size());
  EXPECT_LE(lp["tokens"].size(), prompt_ids.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < lp["tokens"].size(); ++i) {
    EXPECT_LT(lp["token_logprobs"][i].get<double>(), 0.0) << i;
    EXPECT_TRUE(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>())) << i;
  }
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

// The port listens before the load: meanwhile every request is answered 503 (as llama-server
// does), not left waiting, and the same server answers once the model is loaded.
TEST_F(ServeCli, AnswersLoadingUntilTheModelIsLoaded) {
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.begin(), {"/usr/bin/env", "KTIER_DEBUG_SERVE_LOAD_DELAY_MS=4000"});
  argv.push_back("--metrics");
  ChildProcess server(argv);
  ASSERT_TRUE(server.started());
  ASSERT_TRUE(server.wait_for(Stream::kErr, "until it is loaded")) << server.err();
  const std::string err = server.err();
  const int port = listening_port(err);
  ASSERT_GT(port, 0) << err;
  EXPECT_EQ(err.find("Ctrl-C stops"), std::string::npos) << "loaded before the delay: " << err;
  httplib::Client client = client_at(port);
  // On a kept-alive connection (as SDKs' pools) a POST refused before its body was read closes
  // it: the body left unread would be read as the next request (the retry then failed 400).
  client.set_keep_alive(true);
  for (const bool post : {false, true, true}) {
    auto res = post ? client.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 1})",
                                  "application/json")
                    : client.Get("/health");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 503) << res->body;
    if (post) {
      EXPECT_EQ(res->get_header_value("Connection"), "close");
    }
    const json e = json::parse(res->body);
    EXPECT_EQ(e["error"]["type"], "unavailable_error");
    EXPECT_NE(e["error"]["message"].get<std::string>().find("loading"), std::string::npos);
  }
  ASSERT_EQ(start(server), port) << server.err();
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;
  auto answer = client.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 1})",
                            "application/json");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200) << answer->body;
  // --metrics: Prometheus's text, counting the request.
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_NE(metrics->body.find("\nktier:requests_total 1\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("\nktier:tokens_predicted_total 1\n"), std::string::npos)
      << metrics->body;
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

// A request whose generation throws (std::bad_alloc: memory outside the budgets; here made to
// by KTIER_DEBUG_SERVE_THROW) is answered as an error, whole (500, OpenAI's body) or streamed
// (an error event after the status line: it escaped cpp-httplib there and ended the process),
// and the server goes on serving.
TEST_F(ServeCli, ARequestWhoseGenerationThrowsIsAnsweredAsAnError) {
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.begin(), {"/usr/bin/env", "KTIER_DEBUG_SERVE_THROW=1"});
  ChildProcess server(argv);
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  httplib::Client client = client_at(port);
  const json request = {{"prompt", "The lighthouse keeper"}, {"max_tokens", 4}};
  auto whole = client.Post("/v1/completions", request.dump(), "application/json");
  ASSERT_TRUE(whole) << httplib::to_string(whole.error());
  EXPECT_EQ(whole->status, 500) << whole->body;
  EXPECT_NE(json::parse(whole->body)["error"]["message"].get<std::string>().find("out of memory"),
            std::string::npos)
      << whole->body;
  json streaming = request;
  streaming["stream"] = true;
  auto events = client.Post("/v1/completions", streaming.dump(), "application/json");
  ASSERT_TRUE(events) << httplib::to_string(events.error()) << "\n" << server.err();
  EXPECT_EQ(events->status, 200);
  const std::vector<json> got = stream_events(events->body);
  ASSERT_FALSE(got.empty()) << events->body;
  EXPECT_NE(got.back()["error"]["message"].get<std::string>().find("out of memory"),
            std::string::npos)
      << events->body;
  auto health = client.Get("/health");
  ASSERT_TRUE(health) << server.err();
  EXPECT_EQ(health->status, 200);
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

// SIGINT or SIGTERM while the model loads end the process at once; SIGTERM once it serves
// stops it as Ctrl-C does (exit 0).
TEST_F(ServeCli, SignalsDuringAndAfterTheLoad) {
  for (const int sig : {SIGINT, SIGTERM}) {
    std::vector<std::string> argv = serve_argv(dir_ / "model");
    argv.insert(argv.begin(), {"/usr/bin/env", "KTIER_DEBUG_SERVE_LOAD_DELAY_MS=20000"});
    ChildProcess loading(argv);
    ASSERT_TRUE(loading.wait_for(Stream::kErr, "until it is loaded")) << loading.err();
    loading.signal(sig);
    EXPECT_EQ(loading.wait(std::chrono::seconds(10)), 128 + sig) << loading.err();
    EXPECT_EQ(loading.term_signal(), sig) << "ended by the signal, as a shell expects";
    EXPECT_NE(loading.err().find("stopped while loading"), std::string::npos) << loading.err();
  }
  // Serving: SIGTERM stops it as Ctrl-C, also where SIGINT is ignored (a script's background
  // job), and an idle keep-alive client does not hold it.
  for (const bool int_ignored : {false, true}) {
    SCOPED_TRACE(int_ignored ? "SIGINT ignored" : "SIGINT default");
    std::vector<std::string> argv = serve_argv(dir_ / "model");
    if (int_ignored) {
      std::string command = "trap '' INT; exec";
      for (const std::string& arg : argv) command += " '" + arg + "'";
      argv = {"/bin/sh", "-c", command};
    }
    ChildProcess server(argv);
    const int port = start(server);
    ASSERT_GT(port, 0) << server.err();
    const int sock = connect_to(port);
    ASSERT_GE(sock, 0);
    const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(sock, get.data(), get.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(get.size()));
    char reply[512];
    ASSERT_GT(::recv(sock, reply, sizeof reply, 0), 0);  // answered; the connection stays open
    server.signal(SIGTERM);
    EXPECT_EQ(server.wait(std::chrono::seconds(30)), 0) << server.err();
    ::close(sock);
    EXPECT_NE(server.err().find("server stopped"), std::string::npos) << server.err();
    EXPECT_EQ(server.err().find("connections still open"), std::string::npos) << server.err();
  }
}

// A client still sending its request does not hold a server that stops: after a load that
// failed, the load's error and exit code within seconds (cpp-httplib would wait for it).
TEST_F(ServeCli, ASlowClientDoesNotHoldAServerThatStops) {
  std::vector<std::string> argv = serve_argv(broken_model("broken-for-slow"));
  // Long enough for the client below to be accepted and read before the load fails.
  argv.insert(argv.begin(), {"/usr/bin/env", "KTIER_DEBUG_SERVE_LOAD_DELAY_MS=5000"});
  ChildProcess server(argv);
  ASSERT_TRUE(server.wait_for(Stream::kErr, "until it is loaded")) << server.err();
  const int port = listening_port(server.err());
  ASSERT_GT(port, 0) << server.err();
  const int sock = connect_to(port);
  ASSERT_GE(sock, 0);
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
  ASSERT_EQ(::send(sock, head.data(), head.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(head.size()));
  std::atomic<bool> done{false};
  std::thread trickle([&] {  // one byte every 200 ms: never idle long enough to time out
    for (int i = 0; i < 150 && !done.load(); ++i) {
      ::send(sock, "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const int code = server.wait(std::chrono::seconds(25));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  trickle.join();
  ::close(sock);
  EXPECT_EQ(code, 3) << server.err();
  EXPECT_LT(seconds, 18.0);
  EXPECT_NE(server.err().find("header length"), std::string::npos) << server.err();
  EXPECT_NE(server.err().find("connections still open"), std::string::npos) << server.err();
}

// A client that leaves ends its answer, streamed or not: the server watches the connection, so a
// client that timed out does not hold the one generating request. Reads capped at 1 MB/s stream
// the trunk at about 2 s per token, so the 40 tokens asked for would take over a minute; a
// second request, left waiting while the first generates, is not started once its client left;
// a batch of prompts stops after the answer its client left.
TEST_F(ServeCli, AClientThatLeavesEndsItsWholeAnswer) {
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.end(), {"-c", "256", "--ram", "4M", "--io-rate-limit", "1", "--metrics"});
  ChildProcess server(argv);
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  const auto until_metric = [port](const std::string& line) { return metric_shown(port, line); };
  // A raw client's connection that has sent POST /v1/completions with `body` (-1: it could
  // not be made or sent).
  const auto post = [port](const std::string& body) {
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
    const int sock = connect_to(port);
    if (sock >= 0 && ::send(sock, request.data(), request.size(), MSG_NOSIGNAL) !=
                         static_cast<ssize_t>(request.size())) {
      ::close(sock);
      return -1;
    }
    return sock;
  };
  const std::string body = R"({"prompt": "Hello", "max_tokens": 40})";
  const int first = post(body);
  ASSERT_GE(first, 0);
  ASSERT_TRUE(until_metric("ktier:requests_processing 1"));
  const int second = post(body);
  ASSERT_GE(second, 0);
  ASSERT_TRUE(until_metric("ktier:requests_deferred 1"));
  ::close(second);
  const linger reset{1, 0};
  ASSERT_EQ(::setsockopt(first, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
  ::close(first);  // an RST, as a client that leaves with the answer unread
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cut = "cut short (the client went away)";
  ASSERT_TRUE(server.wait_until([&] { return server.err().find(cut) != std::string::npos; },
                                std::chrono::seconds(40)))
      << server.err();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  std::smatch m;
  const std::string err = server.err();
  ASSERT_TRUE(std::regex_search(err, m, std::regex("generated ([0-9]+) \\(length\\), cut short")))
      << err;
  EXPECT_LT(std::stoi(m[1].str()), 40);
  EXPECT_TRUE(server.wait_for(Stream::kErr, "the client went away before its request started"))
      << server.err();
  const int third = post(R"({"prompt": ["Hello", "Hi"], "max_tokens": 40})");
  ASSERT_GE(third, 0);
  ASSERT_TRUE(until_metric("ktier:requests_processing 1"));
  ::close(third);
  EXPECT_TRUE(server.wait_for(Stream::kErr, "went away after 1 of the 2 prompts of its batch"))
      << server.err();
  httplib::Client client = client_at(port);  // the server goes on answering
  const auto res = client.Post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 1})",
                               "application/json");
  ASSERT_TRUE(res) << server.err();
  EXPECT_EQ(res->status, 200) << res->body;
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

// Ctrl-C or SIGTERM while an answer's forward pass runs ends it after the layer running, not
// after the pass: reads capped at 0.2 MB/s stream the trunk's 9 streamed layers at about 1.2 s
// each, so the prompt's pass takes some 11 s, and a stop at a token would come after it, with
// the first token sampled. The client gets 503 naming the stop, with no token; serve exits 0.
TEST_F(ServeCli, AServerThatStopsEndsTheAnswerInsideItsPass) {
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.end(), {"-c", "256", "--ram", "4M", "--io-rate-limit", "0.2", "--metrics"});
  ChildProcess server(argv);
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  int status = 0;  // the answer's HTTP status; 0 where none came (`body` says why)
  std::string body;
  std::thread asks([&] {
    httplib::Client client = client_at(port);
    const httplib::Result r = client.Post(
        "/v1/completions", R"({"prompt": "Hello", "max_tokens": 3})", "application/json");
    status = r ? r->status : 0;
    body = r ? r->body : httplib::to_string(r.error());
  });
  struct Join {  // a failed ASSERT returns early: the client's thread ends first
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{asks};
  ASSERT_TRUE(metric_shown(port, "ktier:requests_processing 1")) << server.err();
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(std::chrono::seconds(60)), 0) << server.err();
  asks.join();
  EXPECT_EQ(status, 503) << body << "\n" << server.err();
  EXPECT_NE(body.find("the answer was cut after 0 tokens"), std::string::npos) << body;
}

// Under a thread limit (ulimit -u, a container's pids.max) the connection threads leave room for
// the rest of serve (before, they took every thread the limit left, and serve failed to start
// its listening thread: "Resource temporarily unavailable", exit 1). Run as a user id of its
// own, whose threads the limit counts (root's it does not), with room for five: the limit counts
// every process of that user on the machine, so not nobody's, which others may run as.
TEST_F(ServeCli, ServesUnderAThreadLimit) {
  if (::geteuid() != 0 || !fs::exists("/usr/bin/setpriv") || !fs::exists("/usr/bin/prlimit"))
    GTEST_SKIP() << "needs root, setpriv and prlimit (util-linux) to run serve as another user";
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.begin(), {"/usr/bin/setpriv", "--reuid", "54329", "--regid", "54329",
                             "--clear-groups", "/usr/bin/prlimit", "--nproc=5"});
  ChildProcess server(argv);
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  EXPECT_NE(server.err().find("connection threads"), std::string::npos) << server.err();
  httplib::Client client = client_at(port);
  auto answer = client.Post("/v1/completions", R"({"prompt": "The lamp", "max_tokens": 2})",
                            "application/json");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200) << answer->body;
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(std::chrono::seconds(30)), 0) << server.err();
}

// A POST with neither Content-Length nor a chunked body has an empty one (RFC 9112): answered
// 400 at once, naming what is missing, and the connection goes on (cpp-httplib read on until
// its 5 s read timeout, then answered "the request could not be read").
TEST_F(ServeCli, APostWithoutABodyIsAnsweredAtOnce) {
  ChildProcess server(serve_argv(dir_ / "model"));
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  const int sock = connect_to(port);
  ASSERT_GE(sock, 0);
  const timeval wait{30, 0};  // a bound on a broken server, not a timing claim
  ASSERT_EQ(::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait), 0);
  // What arrives on `sock` until `needle` has (or nothing more comes).
  const auto until = [sock](const std::string& needle) {
    std::string got;
    char buf[4096];
    while (got.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  };
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(sock, post.data(), post.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(post.size()));
  const std::string refused = until("}}");
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
  EXPECT_NE(refused.find("the request has no body"), std::string::npos) << refused;
  EXPECT_NE(refused.find("\"type\":\"invalid_request_error\""), std::string::npos) << refused;
  EXPECT_EQ(refused.find("\"param\":\""), std::string::npos) << refused;
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(sock, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  const std::string health = until("\"ok\"}");
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  ::close(sock);
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

// A streamed answer to an HTTP/1.0 client, which reads no chunked body (RFC 9112 §6.1), comes
// unframed and ends with the connection, which is closed even where the client asked to keep it
// (its end would be unknown); an HTTP/1.1 client's is chunked.
TEST_F(ServeCli, AStreamToAnHttp10ClientIsNotChunked) {
  ChildProcess server(serve_argv(dir_ / "model"));
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  const std::string body = R"({"prompt": "The lamp", "max_tokens": 3, "stream": true})";
  const std::pair<std::string, std::string> asked[] = {
      {"HTTP/1.0", "close"}, {"HTTP/1.0", "Keep-Alive"}, {"HTTP/1.1", "close"}};
  for (const auto& [version, connection] : asked) {
    SCOPED_TRACE(version + ", Connection: " + connection);
    const int sock = connect_to(port);
    ASSERT_GE(sock, 0);
    const timeval wait{30, 0};  // a bound on a broken server, not a timing claim
    ASSERT_EQ(::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait), 0);
    const std::string post = "POST /v1/completions " + version + "\r\nHost: x\r\nConnection: " +
                             connection + "\r\nContent-Length: " + std::to_string(body.size()) +
                             "\r\n\r\n" + body;
    ASSERT_EQ(::send(sock, post.data(), post.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(post.size()));
    std::string got;  // all until the server closes
    char buf[4096];
    for (ssize_t n; (n = ::recv(sock, buf, sizeof buf, 0)) > 0;)
      got.append(buf, static_cast<size_t>(n));
    ::close(sock);
    const size_t head_end = got.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << got;
    const std::string head = got.substr(0, head_end), events = got.substr(head_end + 4);
    EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
    const bool chunked = head.find("Transfer-Encoding: chunked") != std::string::npos;
    EXPECT_EQ(chunked, version == "HTTP/1.1") << head;
    if (!chunked) {
      EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
    }
    // Chunked: each piece after its size line in hex.
    const size_t first = chunked ? events.find("\r\n") + 2 : 0;
    EXPECT_TRUE(!chunked || std::isxdigit(static_cast<unsigned char>(events[0]))) << events;
    EXPECT_EQ(events.compare(first, 7, "data: {"), 0) << events;
    const std::string last = chunked ? "data: [DONE]\n\n\r\n0\r\n\r\n" : "data: [DONE]\n\n";
    EXPECT_TRUE(events.size() >= last.size() &&
                events.compare(events.size() - last.size(), last.size(), last) == 0)
        << events;
  }
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0) << server.err();
}

TEST_F(ServeCli, HelpListsServe) {
  auto r = run_process(ktier_bin().string() + " --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("serve"), std::string::npos) << r.out;
  r = run_process(ktier_bin().string() + " serve --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--port", "--host", "--ctx-size", "--temp", "--seed", "--ram"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST_F(ServeCli, WhatCannotStartSaysWhy) {
  // Without the tokenizer: exit 2, naming the file.
  const fs::path bare = dir_ / "no-tokenizer";
  fs::create_directories(bare);
  for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "model"))
    if (e.path().filename() != "tiktoken.model")
      fs::create_symlink(e.path(), bare / e.path().filename());
  auto r = run_process(ktier_bin().string() + " serve -m " + bare.string() + " --port 0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("tiktoken.model"), std::string::npos) << r.err;

  // A port that is taken: exit 1.
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  r = run_process(ktier_bin().string() + " serve -m " + (dir_ / "model").string() +
                  " --port " + std::to_string(port));
  ::close(taken);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << r.err;

  // A load that fails while the port listens: the load's exit code, the listening ended.
  std::string shard;
  ChildProcess failing(serve_argv(broken_model("broken-shard", &shard)));
  ASSERT_TRUE(failing.started());
  EXPECT_EQ(failing.wait(), 3) << failing.err();
  EXPECT_NE(failing.err().find("listening on"), std::string::npos) << failing.err();
  EXPECT_NE(failing.err().find(shard), std::string::npos) << failing.err();

  // A context whose state cannot be reserved: exit 4 once loaded, not a 500 for every request.
  r = run_process("ulimit -v 4000000; " + ktier_bin().string() + " serve -m " +
                  (dir_ / "model").string() + " --port 0 -c 2000000000");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("-c/--ctx-size 2000000000: the sequence's state for that many positions "
                       "cannot be reserved"),
            std::string::npos)
      << r.err;

  for (const char* flag : {" --port 70000", " --temp 3", " -c 0", " --presence-penalty 2.5",
                           " --frequency-penalty -3", " --repeat-penalty 0", " --cache-ram x",
                           " -n 0"}) {
    r = run_process(ktier_bin().string() + " serve -m " + (dir_ / "model").string() + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(flag).substr(1, std::string(flag).find(' ', 1) - 1)),
              std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("-n 0 would answer nothing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ktier::test
