// ktier serve: an OpenAI-compatible HTTP server, as llama-server (docs/TUNING.md "Serving").
//
//   ktier serve -m DIR [--host 127.0.0.1] [--port 8080] [-c 4096] [-n 512] [--temp 1]
//               [--top-k 0] [--top-p 1] [--min-p 0] [--seed -1] [penalties] [--alias NAME]
//               [--metrics] [run's memory, strata, --threads, --chunk and --isa options]
//
//   POST /v1/chat/completions, POST /v1/completions (stream: server-sent events),
//   GET /v1/models, GET /health, GET /metrics (Prometheus, with --metrics), and llama-server's
//   POST /completion, /tokenize, /detokenize, GET /props.
//
// One sequence serves every request, one at a time (server/service.h): a request that begins
// with what the previous one ran (a conversation's next message) runs only its new tokens;
// with --cache-ram, one that begins with what an earlier sequence kept in RAM ran, too.
// Listening starts before the (long) load; until the model is ready every request is answered
// 503 "the model is loading", as llama-server does, so that health checks see it.
// Ctrl-C stops the server (exit 0): the answer in progress ends after the layer running as an
// error (503), waiting requests do not start. HTTP from Debian's cpp-httplib, linked only when the
// build found it (KTIER_SERVER).

#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "cli/serve_threads.h"
#include "cli/strata_options.h"
#include "common/check.h"
#include "common/debug_env.h"
#include "common/interrupt.h"
#include "common/size.h"
#include "format/checkpoint.h"
#include "io/read_file.h"
#include "ktier/version.h"
#include "runtime/engine.h"
#include "server/llama_api.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/peer_watch.h"
#include "server/service.h"
#include "server/tokenize_api.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ktier::cli {
namespace {

// Generation requests may wait for the one running (a connection thread each, a batch between
// its prompts included: server::LinePlace) while this many of the threads that started stay
// free for /health, /metrics, /v1/models; the next is answered 503 at once. At least one waits.
constexpr int64_t kFreeConnectionThreads = 8;

struct ServeArgs {
  std::string model, host = "127.0.0.1", alias, isa = "auto", cache_ram = "0";
  MemoryArgs memory;
  StrataArgs strata;
  int port = 8080, threads = 0;
  bool metrics = false;
  int64_t ctx = 4096, chunk = 256, max_tokens = 512;
  // OpenAI's default temperature; a random seed for each request that gives none (as
  // llama-server and OpenAI: the same request twice gives two answers).
  runtime::SamplingParams sampling{.temperature = 1.0, .seed = runtime::kRandomSeed};
};

using nlohmann::json;

// HTTP status and OpenAI error type for a Status.
std::pair<int, std::string> http_error(const Status& s) {
  switch (s.code()) {
    case ExitCode::kUsage:
    case ExitCode::kBudget:  // code "context_length_exceeded"
      return {400, "invalid_request_error"};
    case ExitCode::kInterrupted:  // the server is stopping (or the client left: nobody reads it)
      return {503, "server_error"};
    default:
      return {500, "server_error"};
  }
}

json error_json(const Status& s) {
  const std::optional<std::string> code =
      s.code() == ExitCode::kBudget ? std::optional<std::string>("context_length_exceeded")
                                    : std::nullopt;
  return server::error_body(s.message(), http_error(s).second, code, server::error_param(s));
}

void send_error(httplib::Response& res, const Status& s) {
  res.status = http_error(s).first;
  res.set_content(server::dump(error_json(s)), "application/json");
}

// A request refused because too many wait (503 "busy"). Its connection is not kept: its idle
// thread would be one fewer for /health (cpp-httplib gives a connection its thread for its
// whole life).
void send_busy(httplib::Response& res, const Status& s) {
  res.set_header("Retry-After", "1");
  res.set_header("Connection", "close");
  send_error(res, s);
}

// ktier's fields beside OpenAI's: llama-server's "timings" and the run report.
// The timings are llama-server's, computed its way: each rate is the tokens over the time.
// predicted_n counts the first generated token, which is sampled from the prompt's logits in
// the prefill's time; the run report's decode rate counts the decode steps (one fewer).
json extra_fields(const server::Completion& c) {
  const runtime::GenerationStats& g = c.report.gen;
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const double prompt_ms = g.prefill_seconds * 1e3, predicted_ms = g.decode_seconds * 1e3;
  const auto prompt_n = static_cast<double>(g.prompt_tokens);
  const auto predicted_n = static_cast<double>(g.generated_tokens);
  return {{"timings",
           {{"cache_n", c.usage.cached_tokens},
            {"prompt_n", g.prompt_tokens},
            {"prompt_ms", prompt_ms},
            {"prompt_per_token_ms", ratio(prompt_ms, prompt_n)},
            {"prompt_per_second", ratio(1e3 * prompt_n, prompt_ms)},
            {"predicted_n", g.generated_tokens},
            {"predicted_ms", predicted_ms},
            {"predicted_per_token_ms", ratio(predicted_ms, predicted_n)},
            {"predicted_per_second", ratio(1e3 * predicted_n, predicted_ms)}}},
          {"ktier", c.report_json}};
}

// The routes. Until ready() (set_service), every request is answered 503 before routing.
class ApiHandlers {
 public:
  // `max_body_bytes`: the payload limit cpp-httplib was given (it checks only Content-Length
  // for handlers that read the body themselves; read_body checks what arrives).
  ApiHandlers(std::string model_name, std::string model_path, bool metrics,
              size_t max_body_bytes)
      : model_(std::move(model_name)), model_path_(std::move(model_path)), metrics_(metrics),
        max_body_bytes_(max_body_bytes), id_prefix_(random_id_prefix()) {}

  // `service` must outlive listening. Before this call no handler below runs.
  void set_service(server::Service& service) { service_.store(&service); }
  bool ready() const { return service_.load() != nullptr; }

  void route(httplib::Server& http) {
    // Cross-origin requests (a web front-end served elsewhere), allowed as llama-server allows
    // them: every answer says any origin may read it, and a browser's preflight is answered.
    http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
    http.Options(R"(.*)", [](const httplib::Request& req, httplib::Response& res) {
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? std::string("Content-Type, Authorization") : asked);
      res.status = 204;
    });
    // Any other exception out of a handler: OpenAI's error body (cpp-httplib's own 500 has none).
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr thrown) {
          std::string what = "an unknown exception";
          try {
            std::rethrow_exception(thrown);
          } catch (const std::bad_alloc&) {
            what = "out of memory: the system refused an allocation outside the budgets";
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          spdlog::error("request failed: {}", what);
          send_error(res, Status::runtime("the request failed: " + what));
        });
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // A POST with neither Content-Length nor a chunked body has an empty one (RFC 9112 §6.3);
      // cpp-httplib would read on until the client closed or its 5 s read timeout. Answered at
      // once, the connection kept.
      if (req.method == "POST" && !req.has_header("Content-Length") &&
          strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0) {
        send_error(res, Status::usage("the request has no body: a POST here carries JSON, "
                                      "with its Content-Length (or Transfer-Encoding: chunked)"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (ready() || req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
      res.status = 503;
      // Answered before its body is read: the body left on a kept-alive connection would be
      // read as the next request (a client's retry on it then fails 400).
      res.set_header("Connection", "close");
      res.set_content(server::dump(server::error_body(
                          "the model is loading; try again when GET /health answers 200",
                          "unavailable_error")),
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    });
    for (const char* path : {"/health", "/v1/health"})  // both, as llama-server
      http.Get(path, [](const httplib::Request&, httplib::Response& res) {
        res.set_content(R"({"status":"ok"})", "application/json");
      });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      if (!metrics_) {  // as llama-server: off unless asked for
        res.status = 501;
        res.set_content(server::dump(server::error_body(
                            "this server does not serve metrics: start it with --metrics",
                            "not_supported_error")),
                        "application/json");
        return;
      }
      res.set_content(server::prometheus_metrics(service().totals()),
                      "text/plain; version=0.0.4");
    });
    for (const char* path : {"/v1/models", "/models"})
      http.Get(path, [this](const httplib::Request&, httplib::Response& res) {
        const json model = {{"id", model_}, {"object", "model"}, {"created", now()},
                            {"owned_by", "ktier"}};
        res.set_content(server::dump(json{{"object", "list"}, {"data", json::array({model})}}),
                        "application/json");
      });
    http.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
      const server::ServiceOptions& o = service().options();
      res.set_content(server::dump(server::llama_props(o.defaults, o.ctx, model_, model_path_,
                                                       std::string("ktier ") + kVersion)),
                      "application/json");
    });
    // Every POST body is JSON, read through a ContentReader (read_body).
    using httplib::ContentReader;
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res,
                                  const ContentReader& reader) {
      if (const std::optional<std::string> body = read_body(req, res, reader))
        reply(res, server::tokenize_response(service().tokenizer(), *body));
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res,
                                    const ContentReader& reader) {
      if (const std::optional<std::string> body = read_body(req, res, reader))
        reply(res, server::detokenize_response(service().tokenizer(), *body));
    });
    // The paths llama-server answers: its own /completion (and /completions), OpenAI's.
    const std::pair<const char*, server::Endpoint> completions[] = {
        {"/completion", server::Endpoint::kLlamaCompletion},
        {"/completions", server::Endpoint::kLlamaCompletion},
        {"/v1/completions", server::Endpoint::kCompletions},
        {"/v1/chat/completions", server::Endpoint::kChatCompletions},
        {"/chat/completions", server::Endpoint::kChatCompletions}};
    for (const auto& [path, endpoint] : completions)
      http.Post(path, [this, endpoint](const httplib::Request& req, httplib::Response& res,
                                       const ContentReader& reader) {
        if (const std::optional<std::string> body = read_body(req, res, reader))
          handle(endpoint, *body, req, res);
      });
  }

 private:
  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // A request's body whatever its Content-Type says: `curl -d` sends JSON as a form, which
  // cpp-httplib's own reading (for handlers without a ContentReader) refuses past 8 KiB. Read
  // here, up to max_body_bytes_ as it arrives (chunked or compressed bodies have no
  // Content-Length to check): past it 413. nullopt: `res` is the answer (a multipart body is
  // no JSON: 400), with "Connection: close": the rest of the body is left unread on the
  // socket, where a kept-alive connection would read it as requests.
  std::optional<std::string> read_body(const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) const {
    if (req.is_multipart_form_data()) {
      send_error(res, Status::usage("the request body must be JSON, not multipart form data"));
      res.set_header("Connection", "close");
      return std::nullopt;
    }
    std::string body;
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t size) {
      too_large = size > max_body_bytes_ - body.size();
      if (!too_large) body.append(data, size);
      return !too_large;
    });
    if (too_large) res.status = 413;  // cpp-httplib's error handler writes the body
    if (!read || too_large) {
      if (res.status < 400) res.status = 400;
      res.set_header("Connection", "close");
      return std::nullopt;
    }
    return body;
  }

  static void reply(httplib::Response& res, const Result<json>& body) {
    if (!body.is_ok()) return send_error(res, body.status());
    res.set_content(server::dump(*body), "application/json");
  }

  // `req`'s connection is watched: a client that closes it ends its answer at the next token or
  // prompt chunk (the answer's text goes nowhere), and its batch's next prompt does not start.
  void handle(server::Endpoint endpoint, const std::string& body, const httplib::Request& req,
              httplib::Response& res) {
    const server::PeerWatch peer = server::PeerWatch::find(req.local_addr, req.local_port,
                                                           req.remote_addr, req.remote_port);
    const bool chat = endpoint == server::Endpoint::kChatCompletions;
    server::ResponseHead head{(chat ? "chatcmpl-" : "cmpl-") + id_prefix_ +
                                  std::to_string(++requests_),
                              now(), model_};
    const Result<json> object = server::parse_body_object(body);
    if (!object.is_ok()) return send_error(res, object.status());
    // Busy: 503 before a stream's status line (200) is sent or a batch's first answer is made
    // (complete() refuses a request that came too late to be refused here).
    if (const Status busy = service().admission(); !busy.is_ok()) {
      spdlog::warn("{}: refused: {}", server::endpoint_name(endpoint), busy.message());
      return send_busy(res, busy);
    }
    // Completions' batch of prompts: every one checked first, then each answered in turn,
    // whole, as a choice of one answer.
    if (endpoint == server::Endpoint::kCompletions) {
      Result<std::vector<json>> batch = server::split_prompt_batch(*object, max_body_bytes_);
      if (!batch.is_ok()) return send_error(res, batch.status());
      if (!batch->empty()) {
        std::vector<server::PreparedRequest> prompts;
        for (const json& one : *batch) {
          Result<server::CompletionRequest> parsed =
              server::parse_request(endpoint, one, service().options().defaults);
          Result<server::PreparedRequest> prepared =
              parsed.is_ok() ? service().prepare(std::move(*parsed)) : parsed.status();
          if (!prepared.is_ok())
            return send_error(res, prepared.status().with_note(
                                       "In the batch: prompt " + std::to_string(prompts.size()) +
                                       " (from 0)"));
          prompts.push_back(std::move(*prepared));
        }
        std::vector<json> answers;
        server::LinePlace place(service());  // its later prompts are not refused as busy
        for (const server::PreparedRequest& prompt : prompts) {
          if (!answers.empty() && peer.gone()) {  // the one before was cut short: no more
            spdlog::info("/v1/completions: the client went away after {} of the {} prompts of "
                         "its batch",
                         answers.size(), prompts.size());
            return send_error(res, Status::interrupted("the client went away"));
          }
          bool busy = false;
          Result<json> answer = handle_whole(prompt, head, peer, &place, &busy);
          if (busy) return send_busy(res, answer.status());
          if (!answer.is_ok()) return send_error(res, answer.status());
          answers.push_back(std::move(*answer));
        }
        return reply(res, server::batch_response(std::move(answers)));
      }
    }
    Result<server::CompletionRequest> parsed =
        server::parse_request(endpoint, *object, service().options().defaults);
    if (!parsed.is_ok()) return send_error(res, parsed.status());
    Result<server::PreparedRequest> prepared = service().prepare(std::move(*parsed));
    if (!prepared.is_ok()) return send_error(res, prepared.status());
    if (!prepared->request.stream) {
      bool busy = false;
      const Result<json> answer =
          handle_whole(*prepared, head, peer, nullptr, &busy);
      return busy ? send_busy(res, answer.status()) : reply(res, answer);
    }
    // Once the server stops, cpp-httplib calls no content provider: the client would get an
    // empty 200 stream, not the 503 the others get (a stop between here and the provider's
    // call still gives one: this narrows the window).
    if (InterruptRequest::requested())
      return send_error(res, Status::interrupted("the server is stopping (Ctrl-C or SIGTERM)"));
    const bool native_api = endpoint == server::Endpoint::kLlamaCompletion;
    auto request = std::make_shared<server::PreparedRequest>(std::move(*prepared));
    res.set_header("Cache-Control", "no-cache");
    // An HTTP/1.0 client reads no chunked body (RFC 9112 §6.1): it gets the events unframed,
    // ended by the connection's close (the provider's false closes it, keep-alive asked or not).
    const bool unframed = req.version == "HTTP/1.0";
    httplib::ContentProviderWithoutLength events =
        [this, request, head, endpoint, native_api, peer, unframed](size_t,
                                                                    httplib::DataSink& sink) {
          // cpp-httplib does not catch what a content provider throws (std::bad_alloc while an
          // event is built: the process would end); false closes the connection instead, the
          // answer cut short. run() answers what the generation throws as an error event.
          try {
            const auto send = [&](const json& j) {
              const std::string event = server::sse_event(j);
              return sink.write(event.data(), event.size());
            };
            bool open = endpoint != server::Endpoint::kChatCompletions ||
                        send(server::stream_role_chunk(head));
            Result<server::Completion> done = run(
                *request,
                [&](std::string_view text, std::span<const server::AnswerToken> tokens) {
                  const json probs = logprobs_of(request->request, tokens);
                  open = open && send(native_api ? server::llama_stream_piece(std::string(text),
                                                                              probs)
                                                 : server::stream_chunk(endpoint, head,
                                                                        std::string(text),
                                                                        std::nullopt, probs));
                  return open;
                },
                peer);
            if (!done.is_ok()) {
              // The status line is sent: the error goes as an event, as llama-server does.
              send(error_json(done.status()));
            } else if (open && native_api) {
              // llama-server's last event: text "", no logprobs (they went with the pieces).
              send(server::llama_completion_result(model_, "", done->finish, done->stopping_word,
                                                   done->usage, llama_extra(*request, *done),
                                                   nullptr));
            } else if (open) {
              const json extra = extra_fields(*done);
              // llama-server's timings go on the last chunk too (its web UI reads the tokens per
              // second there), whether or not the usage chunk follows.
              json last = server::stream_chunk(endpoint, head, "", done->finish);
              last["timings"] = extra["timings"];
              send(last);
              if (request->request.include_usage)
                send(server::stream_usage_chunk(endpoint, head, done->usage, extra));
              const std::string end = "data: [DONE]\n\n";
              sink.write(end.data(), end.size());
            }
            sink.done();
            return !unframed;
          } catch (...) {
            spdlog::error("serve: a streamed answer ended early: building an event failed");
            return false;
          }
        };
    if (unframed) {
      res.set_header("Connection", "close");
      res.set_content_provider("text/event-stream", std::move(events));
    } else {
      res.set_chunked_content_provider("text/event-stream", std::move(events));
    }
  }

  // The logprobs of `tokens` in the request's endpoint's form; null when it asked none.
  static json logprobs_of(const server::CompletionRequest& request,
                          std::span<const server::AnswerToken> tokens) {
    return request.logprobs ? server::logprobs_json(request.endpoint, tokens) : json(nullptr);
  }

  // extra_fields and llama-server's fields about the request (llama_request_fields).
  json llama_extra(const server::PreparedRequest& prepared, const server::Completion& done) const {
    std::string prompt = prepared.request.prompt;
    if (prompt.empty()) {  // given as ids (checked against the vocabulary: they decode)
      const std::vector<uint32_t> ids(prepared.ids.begin(), prepared.ids.end());
      if (Result<std::string> text = service().tokenizer().decode(ids); text.is_ok())
        prompt = std::move(*text);
    }
    const int64_t n_predict = prepared.request.to_context_end ? -1 : prepared.max_tokens;
    json extra = extra_fields(done);
    extra.update(server::llama_request_fields(
        prompt,
        server::llama_generation_settings(prepared.request.sampling, n_predict,
                                          prepared.request.ignore_eos),
        done.text, done.positions_held));
    return extra;
  }

  // A request answered whole (not streamed): its response body.
  Result<json> handle_whole(const server::PreparedRequest& prepared,
                            const server::ResponseHead& head, const server::PeerWatch& peer,
                            server::LinePlace* place = nullptr, bool* busy = nullptr) {
    const server::Endpoint endpoint = prepared.request.endpoint;
    KTIER_ASSIGN_OR_RETURN(
        const server::Completion done,
        run(
            prepared,
            [](std::string_view, std::span<const server::AnswerToken>) { return true; }, peer,
            place, busy));
    const json probs = logprobs_of(prepared.request, done.logprobs);
    if (endpoint == server::Endpoint::kLlamaCompletion)
      return server::llama_completion_result(model_, done.text, done.finish, done.stopping_word,
                                             done.usage, llama_extra(prepared, done), probs);
    return server::completion_response(endpoint, head, done.text, done.finish, done.usage,
                                       extra_fields(done), probs);
  }

  // One generation, logged as a line on stderr. An answer the server's stop (Ctrl-C, SIGTERM) cut
  // is an error (503), so that no client takes it for one that reached its end. The answer of a
  // client that `peer` finds gone ends early (Completion::cancelled), between tokens or prompt
  // chunks; one whose client left while it waited for the model is not started. `refused_busy`
  // (may be null): set to whether too many waited (the error is then the busy refusal).
  Result<server::Completion> run(const server::PreparedRequest& request,
                                 const server::Service::TextSink& on_text,
                                 const server::PeerWatch& peer,
                                 server::LinePlace* place = nullptr,
                                 bool* refused_busy = nullptr) {
    bool busy = false;
    // An exception out of the generation (std::bad_alloc: memory outside the budgets) is this
    // request's error, answered as the others are: in a streamed answer cpp-httplib would not
    // catch it (the process would end), elsewhere it answers 500 with no body. The service has
    // dropped its sequence; the next request starts a fresh one.
    // Debugging only (docs/TUNING.md): every answer's first text throws std::bad_alloc, to try
    // this path (tests/cli/serve_test.cpp).
    static const bool throw_in_answers = debug_env().is_ok() && debug_env()->serve_throw;
    const server::Service::TextSink throwing =
        [&on_text](std::string_view text, std::span<const server::AnswerToken> tokens) -> bool {
      if (throw_in_answers) throw std::bad_alloc();
      return on_text(text, tokens);
    };
    const auto complete = [&]() -> Result<server::Completion> {
      try {
        return service().complete(
            request, throw_in_answers ? throwing : on_text,
            [&peer] { return InterruptRequest::requested() || peer.gone(); }, &busy, place,
            // The server stopping ends the answer inside its pass too (the sequence goes with
            // it); a client gone, at a whole token or chunk (the next request may reuse it).
            [] { return InterruptRequest::requested(); });
      } catch (const std::bad_alloc&) {
        return Status::runtime("out of memory: the system refused an allocation outside the "
                               "budgets while this request ran");
      } catch (const std::exception& e) {
        return Status::runtime(std::string("the request failed: ") + e.what());
      }
    };
    Result<server::Completion> done = complete();
    if (refused_busy) *refused_busy = busy;
    if (busy) {
      spdlog::warn("{}: refused: {}", server::endpoint_name(request.request.endpoint),
                   done.status().message());
      return done;
    }
    if (!done.is_ok() && done.status().code() == ExitCode::kInterrupted &&
        !InterruptRequest::requested()) {
      spdlog::info("{}: the client went away before its request started",
                   server::endpoint_name(request.request.endpoint));
      return Status::interrupted("the client went away before its request started");
    }
    if (done.is_ok() && done->cancelled && InterruptRequest::requested())
      done = Status::interrupted("the server is stopping (Ctrl-C or SIGTERM): the answer was "
                                 "cut after " +
                                 std::to_string(done->usage.completion_tokens) + " tokens");
    if (!done.is_ok()) {
      spdlog::error("request failed: {}", done.status().message());
      return done;
    }
    const runtime::GenerationStats& g = done->report.gen;
    spdlog::info("{}: prompt {} tokens ({} reused{}), generated {} ({}){}; prefill {:.2f} s, "
                 "decode {:.2f} tok/s",
                 server::endpoint_name(request.request.endpoint),
                 done->usage.prompt_tokens, done->usage.cached_tokens,
                 done->from_kept_sequence ? " from a kept sequence" : "", g.generated_tokens,
                 server::finish_reason_name(done->finish),
                 done->cancelled ? ", cut short (the client went away)" : "",
                 g.prefill_seconds,
                 g.decode_seconds > 0 ? double(g.decode_steps) / g.decode_seconds : 0.0);
    return done;
  }

  server::Service& service() const { return *service_.load(); }

  std::atomic<server::Service*> service_{nullptr};
  const std::string model_, model_path_;
  const bool metrics_;
  const size_t max_body_bytes_;
  std::atomic<uint64_t> requests_{0};
  // Drawn at start: response ids ("chatcmpl-<prefix><n>") differ across restarts, so logs and
  // caches keyed by them do not mix two runs' answers.
  const std::string id_prefix_;

  static std::string random_id_prefix() {
    std::random_device rd;
    char buf[24];
    std::snprintf(buf, sizeof buf, "%08x%08x-", rd(), rd());
    return buf;
  }
};

// How long connections may take to end once the server stops and no answer is generating: a
// client still sending its request (a slow upload) would otherwise hold the process for as long
// as it likes (cpp-httplib's stop() waits for every connection's thread).
constexpr auto kDrainTime = std::chrono::seconds(3);
constexpr time_t kKeepAliveSeconds = 2;

// Runs listen_after_bind() on its own thread from construction to stop() (or destruction).
class Listener {
 public:
  explicit Listener(httplib::Server& http)
      : http_(http), thread_([this] {
          try {
            listened_ = http_.listen_after_bind();
          } catch (const std::exception& e) {  // out of its thread it would be std::terminate
            spdlog::error("serve: listening failed: {}", e.what());
            listened_ = false;
          } catch (...) {
            spdlog::error("serve: listening failed: an unknown exception");
            listened_ = false;
          }
          ended_ = true;
        }) {}
  ~Listener() { stop(Status::runtime("the server stopped")); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  bool ended() const { return ended_.load(); }
  // Stops accepting and waits for the connections to end: while `generating()` (may be null)
  // says an answer is being made, then at most kDrainTime. Past that the process ends here, as
  // main would with `outcome` (its message printed, its exit code), the connections left as
  // they are. Returns false when listening ended by itself (the socket failed), not by stop().
  bool stop(const Status& outcome, const std::function<bool()>& generating = nullptr) {
    if (!thread_.joinable()) return listened_;
    // httplib's stop() does nothing before listen_after_bind() has begun: wait for it.
    while (!http_.is_running() && !ended_.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    http_.stop();
    auto deadline = std::chrono::steady_clock::now() + kDrainTime;
    while (!ended_.load()) {
      const auto now = std::chrono::steady_clock::now();
      if (generating && generating()) {
        deadline = now + kDrainTime;
      } else if (now > deadline) {
        spdlog::warn("connections still open {} s after the server stopped (a client still "
                     "connected, or sending its request): leaving them",
                     std::chrono::duration_cast<std::chrono::seconds>(kDrainTime).count());
        spdlog::default_logger()->flush();
        const int code = finish(outcome);
        std::fflush(nullptr);
        std::_Exit(code);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    thread_.join();
    return listened_;
  }

 private:
  httplib::Server& http_;
  std::atomic<bool> ended_{false};
  bool listened_ = false;
  std::thread thread_;  // last: it starts in the constructor and uses the members above
};

// SIGTERM (docker stop, systemd) does what Ctrl-C does. While the model loads, SIGINT and
// SIGTERM end the process at once, by the signal, from a handler: a container's PID 1 gets no
// default action (the kernel delivers it only handled signals), so there it exits 128 + the
// signal. Once serving, SIGINT is InterruptRequest's and SIGTERM asks what it asks, even where
// SIGINT is ignored (a background job). A signal the caller set to be ignored stays ignored.
// Owner thread only; one per process.
class TerminationSignals {
 public:
  TerminationSignals() {
    loading_int_ = install(SIGINT, quit_now, &previous_int_);
    term_ = install(SIGTERM, quit_now, &previous_term_);
  }
  ~TerminationSignals() {
    loaded();
    end_serving();
  }
  TerminationSignals(const TerminationSignals&) = delete;
  TerminationSignals& operator=(const TerminationSignals&) = delete;

  // The load is over: SIGINT as it was, for InterruptRequest to take.
  void loaded() {
    if (loading_int_) ::sigaction(SIGINT, &previous_int_, nullptr);
    loading_int_ = false;
  }
  // While an InterruptRequest lives: SIGTERM is a request to stop. end_serving() (or the
  // destructor) before that InterruptRequest ends.
  void serving() {
    struct sigaction unused;
    if (term_) install(SIGTERM, request_stop, &unused);
  }
  void end_serving() {
    if (term_) ::sigaction(SIGTERM, &previous_term_, nullptr);
    term_ = false;
  }

 private:
  // False (nothing changed) when `sig` is ignored.
  static bool install(int sig, void (*handler)(int), struct sigaction* previous) {
    if (::sigaction(sig, nullptr, previous) != 0 || previous->sa_handler == SIG_IGN) return false;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return ::sigaction(sig, &sa, nullptr) == 0;
  }
  static void quit_now(int sig) {
    constexpr char kNotice[] = "\nktier: stopped while loading the model\n";
    ssize_t ignored = ::write(STDERR_FILENO, kNotice, sizeof kNotice - 1);
    (void)ignored;
    quit_at_once(sig);
  }
  static void quit_at_once(int sig) {
    // By the signal, as a shell expects of a process stopped so (a loop stops too).
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
    ::kill(::getpid(), sig);
    ::_exit(128 + sig);  // PID 1: the default action is not taken
  }
  // A second SIGTERM quits at once, as a second Ctrl-C does (the stop may wait for the layer
  // running: seconds or more on a big model).
  static void request_stop(int sig) {
    if (InterruptRequest::request_from_signal_handler()) quit_at_once(sig);
  }

  struct sigaction previous_int_ {}, previous_term_ {};
  bool loading_int_ = false, term_ = false;
};

// The --cache-ram `asked` a service keeps sequences of `sequence_bytes` each in: 0 in GPU
// mode (its sequence lives in the VRAM set aside for one), or where not one fits (said).
uint64_t cache_ram_in_use(const runtime::Engine& engine, uint64_t asked, uint64_t sequence_bytes) {
  if (engine.device_vram_bytes() > 0) {
    spdlog::warn("--cache-ram ignored: GPU mode keeps one sequence, in the VRAM set aside for it");
    return 0;
  }
  if (asked < sequence_bytes)
    spdlog::warn("--cache-ram {} holds no sequence: each takes {} (-c positions reserved); give "
                 "a multiple of that (a bare number is bytes)", format_size(asked),
                 format_size(sequence_bytes));
  else
    spdlog::info("--cache-ram {}: up to {} earlier sequences kept ({} each)", format_size(asked),
                 asked / sequence_bytes, format_size(sequence_bytes));
  if (const uint64_t available = runtime::mem_available_bytes(); available && asked > available)
    spdlog::warn("--cache-ram {} is more than the {} MemAvailable now that the model is loaded: "
                 "kept sequences may crowd out the page cache, or the system end the server; "
                 "where a new sequence cannot be made every kept one is dropped",
                 format_size(asked), format_size(available));
  return asked;
}

// The model's name in responses: --alias, or the folder's own name ("k3" for /models/k3/).
std::string model_name(const ServeArgs& a) {
  if (!a.alias.empty()) return a.alias;
  std::filesystem::path folder = std::filesystem::path(a.model).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();
  return folder.filename().empty() ? a.model : folder.filename().string();
}

Status serve(const ServeArgs& a) {
  // A client that goes away mid-answer is a failed write, not SIGPIPE's death.
  ignore_sigpipe();
  server::ServiceOptions so;
  so.ctx = a.ctx;
  so.prefill_chunk = a.chunk;
  so.defaults.sampling = a.sampling;
  so.defaults.max_tokens = a.max_tokens;
  if (a.max_tokens == 0) return Status::usage("-n 0 would answer nothing: give 1 or more, or -1");
  KTIER_RETURN_IF_ERROR(runtime::validate(so.defaults.sampling));
  // A request's own temperature or penalty is refused past OpenAI's range; so is a default.
  KTIER_RETURN_IF_ERROR(server::check_openai_bounds(a.sampling));
  if (a.chunk < 1) return Status::usage("--chunk must be >= 1");
  KTIER_ASSIGN_OR_RETURN(so.cache_ram_bytes, parse_size(a.cache_ram, "--cache-ram"));
  KTIER_ASSIGN_OR_RETURN(const std::optional<cpu::Isa> isa, runtime::parse_isa(a.isa));
  KTIER_RETURN_IF_ERROR(format::Checkpoint::check_directory(a.model));
  KTIER_ASSIGN_OR_RETURN(const bool has_tokenizer,
                         io::path_exists(std::filesystem::path(a.model) / "tiktoken.model"));
  if (!has_tokenizer)
    return Status::usage("ktier serve needs the model's tokenizer: " + a.model +
                         " has no tiktoken.model");
  KTIER_ASSIGN_OR_RETURN(const tok::Tokenizer tokenizer, tok::Tokenizer::load(a.model));
  KTIER_ASSIGN_OR_RETURN(const tok::ChatMarkers markers, tok::chat_markers(tokenizer));

  KTIER_ASSIGN_OR_RETURN(runtime::EngineOptions eo,
                         model_engine_options(a.model, a.threads, isa, a.memory, a.strata));
  eo.workload.positions = a.ctx;
  eo.workload.chunk = a.chunk;
  // An echo with logprobs scores every prompt row (lm_head over a whole chunk: K3 at --chunk
  // 256 holds 168 MB of logits); the plan sets that aside, so such a request fits GPU mode's
  // --vram as any other.
  eo.workload.rows = model::LogitRows::kAll;

  httplib::Server http;
  // A request's text is at most 256 bytes per position of -c (as -f's bound for K3's context),
  // plus room for its JSON: a larger body is refused (413) before anything tokenizes it.
  const size_t max_body_bytes =
      std::min<size_t>(kMaxInputBytes, static_cast<size_t>(a.ctx) * 256 + (size_t{1} << 20));
  http.set_payload_max_length(max_body_bytes);
  // cpp-httplib's default also sets SO_REUSEPORT, with which a second server on a port in use
  // starts and shares it; SO_REUSEADDR alone lets a restart take a port in TIME_WAIT.
  http.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Connections wait on one sequence; more threads than the default 8 keep /health and
  // /v1/models answering behind slow or idle clients. Started here, not when cpp-httplib starts
  // listening, so that the limit on waiting requests counts the threads the system gave.
  std::unique_ptr<HttpTaskQueue> connection_threads = start_connection_threads();
  so.max_waiting = std::max<int64_t>(
      1, static_cast<int64_t>(connection_threads->threads()) - kFreeConnectionThreads);
  http.new_task_queue = [&connection_threads] {  // once, by the Listener below (it owns it then)
    KTIER_CHECK(connection_threads != nullptr);
    return connection_threads.release();
  };
  // An idle keep-alive connection (a scraper, an SDK client) ends within this when the server
  // stops, inside kDrainTime (cpp-httplib's default is 5 s).
  http.set_keep_alive_timeout(kKeepAliveSeconds);
  // What cpp-httplib answers itself (no such path or method, a body too large) in OpenAI's body.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404   ? "no such endpoint: " + req.method + " " +
                                                      req.path
                             : res.status == 413 ? "the request body is too large"
                                                 : "the request could not be read";
    res.set_content(server::dump(server::error_body(what, "invalid_request_error")),
                    "application/json");
  });
  ApiHandlers api(model_name(a), a.model, a.metrics, max_body_bytes);
  api.route(http);
  // The port before the (long) load: one in use is said at once, and requests made during the
  // load are answered (503) rather than left waiting.
  // An IPv6 address goes in brackets before a port (http://[::1]:8080).
  const std::string host = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  const int port = a.port == 0 ? http.bind_to_any_port(a.host) : a.port;
  if (port < 0 || (a.port != 0 && !http.bind_to_port(a.host, a.port)))
    return Status::runtime("cannot listen on " + host + ":" + std::to_string(a.port) +
                           " (the port in use, or not an address of this machine?)");
  TerminationSignals signals;
  Listener listener(http);
  const std::string url = "http://" + host + ":" + std::to_string(port);
  std::fprintf(stderr, "ktier: listening on %s; loading %s (requests are answered 503 until it "
               "is loaded)\n", url.c_str(), a.model.c_str());
  std::fflush(stderr);
  // Debugging only (docs/TUNING.md): a longer load, to try clients against the 503 answers.
  if (debug_env().is_ok() && debug_env()->serve_load_delay_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(*debug_env()->serve_load_delay_ms));
  Result<std::unique_ptr<runtime::Engine>> opened = runtime::Engine::open(eo);
  if (!opened.is_ok()) {
    listener.stop(opened.status());
    return opened.status();
  }
  const std::unique_ptr<runtime::Engine> engine = std::move(*opened);
  if (static_cast<int64_t>(tokenizer.vocab_size()) != engine->checkpoint().config().vocab_size)
    spdlog::warn("the tokenizer has {} ids and config.json's vocab_size is {}",
                 tokenizer.vocab_size(), engine->checkpoint().config().vocab_size);
  // (`run` refuses such a model, K3-MODEL D3; chat still ends where the response closes.)
  if (engine->checkpoint().config().eos_token_ids.empty())
    spdlog::warn("neither config.json nor generation_config.json names an eos_token_id: "
                 "completions end only at max_tokens, a stop text or the context's end");
  if (const auto limit = engine->checkpoint().config().max_position_embeddings;
      limit && a.ctx > *limit)
    spdlog::warn("-c/--ctx-size {} is past max_position_embeddings = {} of config.json", a.ctx,
                 *limit);
  // Every request reserves the state for -c positions: one that cannot be had is refused now,
  // not as a 500 for each request (a memory limit, -c far past what the machine holds).
  // Exit 4 where memory ran out; any other failure (a device error) keeps its own code.
  if (auto probe = engine->model().new_sequence(a.ctx); !probe.is_ok()) {
    const Status refused = caches_refused_as_budget(
        probe.status().with_context("-c/--ctx-size " + std::to_string(a.ctx) +
                                    ": the sequence's state for that many positions cannot be "
                                    "reserved"),
        "give a smaller -c");
    listener.stop(refused);
    return refused;
  } else if (so.cache_ram_bytes) {
    so.cache_ram_bytes = cache_ram_in_use(*engine, so.cache_ram_bytes, probe->bytes());
  }
  server::Service service(*engine, tokenizer, markers, so);
  // Whatever leaves this scope, no connection still uses `service` or `engine` after it.
  struct StopListening {
    Listener& listener;
    ~StopListening() { listener.stop(Status::runtime("the server stopped")); }
  } stop_listening{listener};
  // Ctrl-C (or SIGTERM): stop accepting, end the request in progress after the layer running
  // (503), exit 0. (During the load either ends the process at once.)
  signals.loaded();
  InterruptRequest interrupt(
      "\nktier: stopping the server (the same signal again, Ctrl-C or SIGTERM, quits at once)\n");
  signals.serving();
  api.set_service(service);
  std::fprintf(stderr, "ktier: serving %s on %s (POST /v1/chat/completions, /v1/completions, "
               "/completion, /tokenize, /detokenize; GET /v1/models, /props, /health%s); Ctrl-C "
               "stops\n",
               a.model.c_str(), url.c_str(), a.metrics ? ", /metrics" : "");
  std::fflush(stderr);
  pollfd fd{interrupt.wake_fd(), POLLIN, 0};
  while (!listener.ended() && !InterruptRequest::requested()) ::poll(&fd, 1, 100);
  // The answer in progress ends after the layer running (a whole prompt chunk would be minutes
  // on a big model), then the connections get kDrainTime.
  const bool listened =
      listener.stop(Status::ok(), [&service] { return service.totals().processing > 0; });
  signals.end_serving();  // before `interrupt` ends
  if (!listened && !InterruptRequest::requested())
    return Status::runtime("the HTTP server on " + url + " stopped accepting connections");
  spdlog::info("server stopped");
  return Status::ok();
}

}  // namespace

void register_serve_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  auto* sub = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (POST /v1/chat/completions, /v1/completions; "
               "llama-server's /completion)");
  add_model_option(sub, a->model);
  sub->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->port, "Port to listen on (0: any free one, printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  sub->add_option("--alias", a->alias, "Model name in responses (default: the folder's name)");
  sub->add_flag("--metrics", a->metrics,
                "Serve GET /metrics (Prometheus text: requests, tokens, times, and per-tier "
                "expert bytes, link bytes and prefetch outcomes since the load)");
  sub->add_option("-c,--ctx-size", a->ctx,
                  "Positions the sequence may use (reserved up front; GPU mode sets the state "
                  "for this many aside): a request's prompt + max_tokens - 1 must fit")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{INT32_MAX}));
  sub->add_option("-n,--n-predict", a->max_tokens,
                  "Tokens to generate when a request gives no max_tokens (capped to the context "
                  "left); -1 (or -2) = until a stop id or the context is full")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-2}, int64_t{INT32_MAX}));
  add_sampling_options(sub, a->sampling, /*for_requests=*/true);
  add_threads_option(sub, a->threads, "Worker threads");
  sub->add_option("--chunk", a->chunk, "Prompt tokens per prefill pass")->capture_default_str();
  add_isa_option(sub, a->isa);
  sub->add_option("--cache-ram", a->cache_ram,
                  "As llama-server's: RAM for the states of earlier conversations (each "
                  "reserves -c positions), so that a request going on from one of them runs "
                  "only its new tokens (same answer); the least recently used dropped past it. "
                  "A size (8G; a bare number is bytes); 0 = off. CPU only. Beyond the --ram "
                  "budget, so off by default")
      ->type_name("SIZE")
      ->capture_default_str();
  add_memory_options(sub, a->memory);
  add_strata_options(sub, a->strata);
  sub->callback([a, &exit_code] { exit_code = finish(serve(*a)); });
}

}  // namespace ktier::cli
