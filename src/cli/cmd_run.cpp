// ktier run: decode a prompt and stream the generated text (issue 3 interface).
//
//   ktier run -m DIR (-p TEXT | -f FILE | --ids 1,2,3) [-n N] [--temp T] [--top-k K]
//             [--top-p P] [--min-p P] [--seed S] [--threads N] [--chunk N] [--print-ids]
//             [--special] [--no-parse-special] [--isa auto]
//             [--pack PACKDIR] [--ram SIZE | --preset NAME] [--io auto] [--report-json FILE]
//             [--trace FILE] [--lookahead D] [--policy NAME] [--profile TRACE]
//             [--stop-id ID ...] [-l|--logit-bias ID(+|-)BIAS ...] [--ignore-eos]
//             [--chat [-i|--interactive] [-c|--ctx-size N]]
//             [--prompt-cache FILE [--prompt-cache-all] [--prompt-cache-ro]]
//
// --chat wraps the prompt text as one user message in K3's chat format (tokenizer/chat.h,
// thinking off) and stops where the model closes its response (<|close|>) or the message.
// --interactive (with --chat) goes on as a conversation in the same sequence: after each answer
// it reads the next user message, one line from standard input ("> " on stderr; end of input
// ends it), and runs only the new tokens. -c/--ctx-size bounds the positions a conversation may
// use (GPU mode sets that much state aside); the run report follows every answer.
//
// Text goes to stdout as it is generated (UTF-8 sequences are never split); the run report goes
// to stderr. With --print-ids the generated ids follow the text on one line, comma-separated.
// Ctrl-C stops at the next whole token with all of that (exit 130; a run saving nothing, after
// the layer running); see docs/ARCHITECTURE.md.
// A run stops at the eos_token_id of config.json and generation_config.json, at each --stop-id,
// and with --chat at <|close|>; it is refused (exit 2) where none is named (K3-MODEL D3), unless
// it generates nothing (-n 0) or --ignore-eos (as llama-cli's: the stop ids are never drawn, so
// the answer runs to -n).
// A model folder without tiktoken.model (or with it but without tokenizer_config.json: a warning)
// runs from --ids and prints the generated ids only.
// --prompt-cache (cli/run_prompt_cache.h) starts from a saved state when the prompt begins with
// its ids, and saves the prompt's state (all of its ids but the last; with --prompt-cache-all
// the sequence as the run leaves it) unless --prompt-cache-ro; a conversation resumes the one
// the file holds and is saved after every answer.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "cli/run_prompt_cache.h"
#include "cli/strata_options.h"
#include "common/interrupt.h"
#include "common/json_text.h"
#include "common/progress.h"
#include "format/checkpoint.h"
#include "format/map_guard.h"
#include "io/output_file.h"
#include "io/read_file.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/run_report.h"
#include "strata/trace_recorder.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ktier::cli {
namespace {

// Positions a conversation, or a run with -n -1, may use unless -c says otherwise (llama.cpp's
// long-standing default context); past a long first turn of a conversation, room for one more
// message of kNextMessagePositions positions and its answer.
constexpr int64_t kAutoContextPositions = 4096;
constexpr int64_t kNextMessagePositions = 1024;

struct RunArgs {
  std::string model, prompt, file, ids, isa = "auto", report_json, trace, prompt_cache;
  MemoryArgs memory;
  StrataArgs strata;
  bool has_prompt = false, has_ids = false, print_ids = false, special = false, chat = false,
       interactive = false, prompt_cache_all = false, prompt_cache_ro = false;
  bool names_as_text = false;  // --no-parse-special
  bool ignore_eos = false;      // --ignore-eos: the stop ids get a -Inf bias
  int64_t max_new_tokens = 128, chunk = 256, ctx_size = 0;
  std::vector<int64_t> stop_ids;  // --stop-id, beside the config's eos_token_id
  std::vector<std::string> logit_bias;  // -l/--logit-bias ID(+|-)BIAS, each as given
  runtime::SamplingParams sampling;  // greedy unless --temp
  int threads = 0;
};

int prompts_given(const RunArgs& a) {
  return int(a.has_prompt) + int(!a.file.empty()) + int(!a.ids.empty());
}

// Whether `path` names what standard input reads (/dev/stdin, /dev/fd/0, or the file it is
// redirected from): the same device and inode.
bool is_standard_input(const std::string& path) {
  struct stat in {}, target {};
  return !path.empty() && ::fstat(STDIN_FILENO, &in) == 0 && ::stat(path.c_str(), &target) == 0 &&
         in.st_dev == target.st_dev && in.st_ino == target.st_ino;
}

// The prompt flags: exactly one source (a conversation may read its first message from
// standard input), and the combinations a conversation or --chat cannot take.
Status check_prompt_flags(const RunArgs& a) {
  if (a.has_ids) KTIER_RETURN_IF_ERROR(check_ids_given(a.ids));
  const int given = prompts_given(a);
  if (given > 1 || (given == 0 && !a.interactive))
    return Status::usage("give exactly one of -p TEXT, -f FILE or --ids 1,2,3");
  if (a.interactive && !a.chat)
    return Status::usage("--interactive is a conversation in the chat format: add --chat");
  if (a.interactive && (a.file == "-" || is_standard_input(a.file)))
    return Status::usage("--interactive reads the conversation from standard input: give the "
                         "first message with -p or -f FILE");
  if (a.interactive && a.max_new_tokens == 0)
    return Status::usage("--interactive needs -n >= 1, -1 or -2 (each answer is at least one "
                         "token)");
  // Up to INT32_MAX positions, like -n: 2^31 of K3's ~70 KB of cache per position is far past any
  // machine, and the working-set products (positions x widths x bytes) stay inside int64.
  if (a.ctx_size < 0 || a.ctx_size > INT32_MAX)
    return Status::usage("-c/--ctx-size must be in 0.." + std::to_string(INT32_MAX) +
                         " (0 = auto)");
  if (a.chat && !a.ids.empty())
    return Status::usage("--chat wraps prompt text in the chat format: give -p TEXT or -f FILE");
  return Status::ok();
}

// The run's output files (--report-json, --trace, --prompt-cache): none of them an input of the
// run or another output, each writable (the report's and the trace's folders), checked before
// the (long) load.
Status check_run_outputs(const RunArgs& a) {
  using Output = std::pair<std::string, std::string>;  // flag, path
  const bool write_cache = !a.prompt_cache.empty() && !a.prompt_cache_ro;
  // The prompt cache is checked as an output even when read only: a model or prompt file given
  // there is a mistake, not a damaged cache.
  for (const auto& [flag, out] : {Output{"--report-json", a.report_json}, {"--trace", a.trace},
                                  {"--prompt-cache", a.prompt_cache}})
    KTIER_RETURN_IF_ERROR(check_output_is_not_input(
        flag, out,
        {{"-m", a.model, true}, {"--pack", a.memory.pack, true}, {"--profile", a.strata.profile},
         {"-f", a.file == "-" ? std::string() : a.file},
         // The file standard input reads, when it is read (-f -, or a conversation).
         {"standard input", a.file == "-" || a.interactive ? "/dev/stdin" : std::string()}}));
  KTIER_RETURN_IF_ERROR(check_output_is_not_input("--report-json", a.report_json,
                                                  {{"--trace", a.trace},
                                                   {"--prompt-cache", a.prompt_cache}}));
  KTIER_RETURN_IF_ERROR(check_output_is_not_input("--trace", a.trace,
                                                  {{"--prompt-cache", a.prompt_cache}}));
  // Not check_can_write: the cache is written as a new file renamed over FILE, and a save that
  // fails is only a warning.
  if (write_cache)
    KTIER_RETURN_IF_ERROR(io::check_not_own_stdout("--prompt-cache", a.prompt_cache));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--report-json", a.report_json));
  KTIER_RETURN_IF_ERROR(io::check_not_own_stdout("--trace", a.trace));
  return io::check_can_write("--trace", a.trace);
}

// The model folder's tokenizer, optional for --ids runs (ids are printed instead of text): an
// --ids run goes on without one, or with a half-present one (a missing file: a warning); a
// text prompt needs it; a damaged one is refused either way.
Result<std::optional<tok::Tokenizer>> load_run_tokenizer(const RunArgs& a) {
  KTIER_ASSIGN_OR_RETURN(const bool has_tokenizer,
                         io::path_exists(std::filesystem::path(a.model) / "tiktoken.model"));
  if (!has_tokenizer) {
    if (a.ids.empty())
      return Status::usage(a.model + "/tiktoken.model: not found; text prompts need the "
                           "tokenizer (run from token ids with --ids instead)");
    return std::optional<tok::Tokenizer>();
  }
  Result<tok::Tokenizer> loaded = tok::Tokenizer::load(a.model);
  if (loaded.is_ok()) return std::optional<tok::Tokenizer>(std::move(loaded).value());
  if (loaded.status().code() != ExitCode::kUsage) return loaded.status();
  if (a.ids.empty())
    return Status::usage(loaded.status().message() +
                         "; text prompts need the tokenizer (run from token ids with --ids "
                         "instead)");
  spdlog::warn("{}; running from --ids without the tokenizer (ids are printed, not text)",
               loaded.status().message());
  return std::optional<tok::Tokenizer>();
}

// The prompt as given: its text (-p, -f; a conversation's first message) and its ids (--ids,
// or the text encoded: in the chat format with --chat). None given (a conversation reading its
// first message from standard input): both empty.
struct RunPrompt {
  std::string text;
  std::vector<uint32_t> ids;
};

Result<RunPrompt> read_prompt(const RunArgs& a, const std::optional<tok::Tokenizer>& tokenizer,
                              const std::optional<tok::ChatMarkers>& markers) {
  RunPrompt p;
  if (!a.ids.empty()) {
    KTIER_ASSIGN_OR_RETURN(p.ids, parse_ids(a.ids));
    return p;
  }
  const bool given = prompts_given(a) > 0;
  p.text = a.prompt;
  if (!a.file.empty()) {
    KTIER_ASSIGN_OR_RETURN(p.text, read_prompt_file(a.file));
  }
  // Nothing to continue from (a chat turn is never empty: its markers are tokens).
  if (!a.chat && given && p.text.empty())
    return Status::usage(std::string("the prompt is empty (") +
                         (a.file.empty() ? "-p \"\"" : "-f " + a.file + " has no text") +
                         "): give some text to continue, or --chat to ask an empty message");
  // Special-token names in plain text are their ids, as llama-cli and serve's completions read a
  // prompt; a chat message's stay text (K3-MODEL §8.4).
  if (a.chat && given)
    p.ids = tok::render_user_turn(*tokenizer, *markers, p.text);
  else
    p.ids = tokenizer->encode(p.text, !a.names_as_text);
  return p;
}

// --trace FILE: every token's routing (and lookahead predictions) while the run lives, as the
// model runs it (`--policy static` under the memory dial runs without lookahead).
class RunTrace {
 public:
  static Result<std::unique_ptr<RunTrace>> open(runtime::Engine& engine, const std::string& path) {
    const model::Model& m = engine.model();
    KTIER_ASSIGN_OR_RETURN(std::unique_ptr<strata::TraceRecorder> recorder,
                           strata::TraceRecorder::create(path, engine.checkpoint(),
                                                         m.lookahead_depth(),
                                                         m.lookahead_refresh()));
    std::unique_ptr<RunTrace> t(new RunTrace(engine, path, std::move(recorder)));
    engine.model().set_routing_observer(t->recorder_.get());
    engine.model().add_lookahead_observer(t->recorder_.get());
    // A mapped shard lost mid-run ends the process from its SIGBUS handler, inside a token.
    format::set_exit_note("ktier: warning: trace: " + path + " left unfinished (the run "
                          "stopped inside a token); trace readers refuse it\n");
    return t;
  }
  ~RunTrace() { detach(); }

  // Ends the recording and returns the run's status, or the trace's error after a run that
  // ended well (or by Ctrl-C). A run stopped inside its forward passes (`turn_cut`) leaves the
  // trace without its footer, so that readers refuse it (exit 3): closed, it would read as whole
  // though its last token's routing is not. A failure between turns (a message refused, stdin)
  // leaves whole tokens: the trace is closed.
  Status finish(const Status& status, bool turn_cut) {
    detach();
    if (turn_cut) {
      spdlog::warn("trace: {} left unfinished (the run stopped inside a token); trace readers "
                   "refuse it", path_);
      return status;
    }
    const Status closed = recorder_->close();
    if (!closed.is_ok()) {  // (a step refused leaves the file without its footer)
      if (status.is_ok() || status.code() == ExitCode::kInterrupted) return closed;
      spdlog::warn("trace: {} left unfinished ({}); trace readers refuse it", path_,
                   closed.message());
      return status;
    }
    spdlog::info("trace: {} routing steps -> {}", recorder_->steps(), path_);
    return status;
  }

 private:
  RunTrace(runtime::Engine& engine, std::string path,
           std::unique_ptr<strata::TraceRecorder> recorder)
      : engine_(engine), path_(std::move(path)), recorder_(std::move(recorder)) {}
  void detach() {
    if (detached_) return;
    detached_ = true;
    format::set_exit_note("");
    engine_.model().set_routing_observer(nullptr);
    engine_.model().remove_lookahead_observer(recorder_.get());
  }

  runtime::Engine& engine_;
  std::string path_;
  std::unique_ptr<strata::TraceRecorder> recorder_;
  bool detached_ = false;
};

// The positions a run plans for (EngineOptions::Workload::positions): -c, or what the prompt of
// `prompt_ids` and -n take (the last generated token is never fed back: P + n - 1), with
// `history`, the positions of a conversation the prompt cache resumes. -n -1 and a conversation
// (which adds one more message of up to kNextMessagePositions and its answer) take at least
// kAutoContextPositions. Status::usage where -c cannot hold the prompt and -n; a resumed
// conversation past an explicit -c is refused where it is known to be used (after the load:
// RunPromptCache::restore, and the first message's own check, exit 4).
Result<int64_t> run_positions(const RunArgs& a, int64_t prompt_ids, int64_t history) {
  const bool to_context_end = a.max_new_tokens < 0;
  const int64_t planned_answer = to_context_end ? 1 : a.max_new_tokens;  // -n -1: at least one
  const int64_t first_turn =
      std::max<int64_t>(1, prompt_ids + std::max<int64_t>(planned_answer - 1, 0));
  const int64_t ctx =
      a.ctx_size > 0 ? a.ctx_size
      : a.interactive
          ? std::max<int64_t>(history + first_turn + kNextMessagePositions + planned_answer,
                              kAutoContextPositions)
      : to_context_end ? std::max<int64_t>(first_turn, kAutoContextPositions)
                       : first_turn;
  if (ctx < first_turn)
    return Status::usage("-c/--ctx-size " + std::to_string(ctx) + " cannot hold the prompt (" +
                         std::to_string(prompt_ids) + " tokens) and -n " +
                         std::to_string(a.max_new_tokens) + ": it needs " +
                         std::to_string(first_turn) + " positions");
  return ctx;
}

// Warns where the run may reach positions past config.json's max_position_embeddings: a
// conversation its -c (`ctx`), a single run P + n - 2 (the last generated token is never fed
// back), or with -n -1 the last of `ctx`.
void warn_untrained_positions(const RunArgs& a, const format::ModelConfig& cfg, int64_t ctx,
                              int64_t prompt_ids) {
  if (const auto limit = cfg.max_position_embeddings; limit && a.interactive && ctx > *limit)
    spdlog::warn("-c/--ctx-size {} is past max_position_embeddings = {} of config.json: positions "
                 "from {} on were not trained", ctx, *limit, *limit);
  else if (!a.interactive && a.max_new_tokens < 0)
    warn_past_trained_positions(cfg, ctx - 1, "-n -1 with -c/--ctx-size " + std::to_string(ctx));
  else if (!a.interactive)  // -n 0 still runs the prompt, to P - 1
    warn_past_trained_positions(cfg, prompt_ids + std::max<int64_t>(a.max_new_tokens, 1) - 2,
                                "prompt (" + std::to_string(prompt_ids) + " tokens) + -n " +
                                    std::to_string(a.max_new_tokens));
}

// The ids a generation stops at (K3-MODEL D3): config.json's and generation_config.json's
// eos_token_id, each --stop-id (the opt-in extra stops, e.g. K3's [EOS] 163585), and with --chat
// the response's <|close|>; in that order, once each. Read before the load, so that a run with
// none (it would never end its text; with --ignore-eos it runs to -n either way) or a --stop-id
// outside the vocabulary fails at once.
Result<std::vector<int32_t>> run_stop_ids(const RunArgs& a, const format::ModelConfig& cfg,
                                          const std::optional<tok::ChatMarkers>& markers) {
  std::vector<int32_t> ids;
  const auto add = [&](int64_t id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(static_cast<int32_t>(id));
  };
  for (const int64_t id : cfg.eos_token_ids) add(id);
  for (const int64_t id : a.stop_ids) {
    if (id < 0 || id >= cfg.vocab_size)
      return Status::usage("--stop-id " + std::to_string(id) + " is outside the vocabulary (0.." +
                           std::to_string(cfg.vocab_size - 1) + ", config.json's vocab_size)");
    add(id);
  }
  if (markers) add(markers->close);
  if (ids.empty() && a.max_new_tokens != 0 && !a.ignore_eos) {
    const std::filesystem::path gen = std::filesystem::path(a.model) / "generation_config.json";
    KTIER_ASSIGN_OR_RETURN(const bool has_gen, io::path_exists(gen));
    return Status::usage(a.model + (has_gen ? ": config.json and generation_config.json name"
                                            : ": config.json (and no generation_config.json) "
                                              "names") +
                         " no eos_token_id, so the generation would not stop where the text "
                         "ends: pass --stop-id ID (the id that ends a message; repeatable)");
  }
  return ids;
}

// One -l/--logit-bias as llama-cli writes it: ID+BIAS or ID-BIAS (`15043+1.5`, `15043-inf`: never
// drawn), the id in the vocabulary, the bias a finite number or -inf.
Result<std::pair<int32_t, float>> parse_logit_bias_flag(const std::string& text, int64_t vocab) {
  const auto usage = [&](const std::string& why) {
    return Status::usage("--logit-bias '" + text + "': " + why);
  };
  const size_t sign = text.find_first_of("+-");
  if (sign == 0 || sign == std::string::npos || sign + 1 == text.size())
    return usage("expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1.5 or 15043-inf");
  int64_t id = -1;
  const char* id_end = text.data() + sign;
  if (const auto [end, ec] = std::from_chars(text.data(), id_end, id);
      ec != std::errc() || end != id_end)
    return usage("the token id '" + text.substr(0, sign) + "' is not a number");
  if (id >= vocab)
    return usage("token " + std::to_string(id) + " is outside the vocabulary (0.." +
                 std::to_string(vocab - 1) + ", config.json's vocab_size)");
  float magnitude = 0;
  const char* end_of_text = text.data() + text.size();
  if (const auto [end, ec] = std::from_chars(text.data() + sign + 1, end_of_text, magnitude);
      ec != std::errc() || end != end_of_text || std::isnan(magnitude) || magnitude < 0)
    return usage("the bias '" + text.substr(sign + 1) + "' is not a number (or inf)");
  const float bias = text[sign] == '-' ? -magnitude : magnitude;
  if (bias == std::numeric_limits<float>::infinity())
    return usage("+inf would draw the token whatever the logits; -inf is never drawn");
  return std::pair{static_cast<int32_t>(id), bias};
}

// The biases added to the logits before the penalties (llama-cli's --logit-bias and
// --ignore-eos, in that order): each flag's, then -Inf on each stop id with --ignore-eos.
Result<std::vector<std::pair<int32_t, float>>> run_logit_bias(
    const RunArgs& a, int64_t vocab, const std::vector<int32_t>& stop_ids) {
  std::vector<std::pair<int32_t, float>> biases;
  for (const std::string& flag : a.logit_bias) {
    KTIER_ASSIGN_OR_RETURN(const auto bias, parse_logit_bias_flag(flag, vocab));
    biases.push_back(bias);
  }
  if (a.ignore_eos)
    for (const int32_t id : stop_ids)
      biases.emplace_back(id, -std::numeric_limits<float>::infinity());
  if (runtime::bans_every_token(runtime::SamplingParams{.logit_bias = biases}, vocab))
    return Status::usage(std::string(a.ignore_eos ? "--logit-bias and --ignore-eos leave"
                                                  : "--logit-bias leaves") +
                         " no token that can be drawn: each of the " + std::to_string(vocab) +
                         " ids has a -inf bias");
  return biases;
}

Status run(const RunArgs& a) {
  // A reader that goes away (`ktier run ... | head`) is a write error (exit 1, the trace closed
  // at a whole token), not a silent death by SIGPIPE (exit 141, the trace cut).
  ignore_sigpipe();
  KTIER_RETURN_IF_ERROR(check_prompt_flags(a));
  const int given = prompts_given(a);
  // -n -1 or -2 (llama.cpp's "infinity" and "until the context is filled"; without a context
  // shift they are one): until a stop id, or until the positions of -c are used (set per answer).
  const bool to_context_end = a.max_new_tokens < 0;
  // The tokens an answer may take as the positions are planned: with -n -1 at least one.
  const int64_t planned_answer = to_context_end ? 1 : a.max_new_tokens;
  const std::string n_flag = "-n " + std::to_string(a.max_new_tokens);
  runtime::GenerationOptions gen;
  gen.max_new_tokens = to_context_end ? 0 : a.max_new_tokens;
  gen.prefill_chunk = a.chunk;
  gen.sampling = a.sampling;
  KTIER_RETURN_IF_ERROR(runtime::validate(gen.sampling));
  if (gen.sampling.seed == runtime::kRandomSeed) {
    gen.sampling.seed = runtime::resolve_seed(gen.sampling.seed);
    if (gen.sampling.temperature > 0)
      spdlog::info("sampling seed {} (random; -s {} repeats this run)", gen.sampling.seed,
                   gen.sampling.seed);
  }
  if (a.max_new_tokens < -2 || a.max_new_tokens > INT32_MAX)
    return Status::usage("-n must be in 0.." + std::to_string(INT32_MAX) +
                         ", or -1 or -2 (until a stop id or the context is full)");
  if (a.chunk < 1) return Status::usage("--chunk must be >= 1");
  KTIER_ASSIGN_OR_RETURN(const std::optional<cpu::Isa> isa, runtime::parse_isa(a.isa));

  // What can be checked before the (long) load: the folder, and the output files' folders.
  KTIER_RETURN_IF_ERROR(format::Checkpoint::check_directory(a.model));
  KTIER_RETURN_IF_ERROR(check_run_outputs(a));
  const bool write_cache = !a.prompt_cache.empty() && !a.prompt_cache_ro;
  KTIER_ASSIGN_OR_RETURN(std::optional<tok::Tokenizer> tokenizer, load_run_tokenizer(a));

  std::optional<tok::ChatMarkers> markers;
  if (a.chat) {
    KTIER_ASSIGN_OR_RETURN(markers, tok::chat_markers(*tokenizer));
  }
  KTIER_ASSIGN_OR_RETURN(const format::ModelConfig config,
                         format::load_model_config(std::filesystem::path(a.model) /
                                                   "config.json"));
  KTIER_ASSIGN_OR_RETURN(gen.stop_ids, run_stop_ids(a, config, markers));
  KTIER_ASSIGN_OR_RETURN(gen.sampling.logit_bias,
                         run_logit_bias(a, config.vocab_size, gen.stop_ids));
  const auto is_stop = [&](int32_t id) {
    return std::find(gen.stop_ids.begin(), gen.stop_ids.end(), id) != gen.stop_ids.end();
  };
  // Read and encoded before the load: a bad -f fails at once, and GPU mode sets its working
  // set aside for exactly this run.
  KTIER_ASSIGN_OR_RETURN(const RunPrompt given_prompt, read_prompt(a, tokenizer, markers));
  const std::string& text = given_prompt.text;
  const std::vector<uint32_t>& raw = given_prompt.ids;

  // The prompt cache before the load too: a damaged file fails at once, and a conversation it
  // holds is part of the positions planned. Resumed, the first message follows its last answer.
  std::optional<RunPromptCache> cache;
  if (!a.prompt_cache.empty()) {
    KTIER_ASSIGN_OR_RETURN(cache, RunPromptCache::open(a.prompt_cache, a.model, a.prompt_cache_ro));
  }
  KTIER_ASSIGN_OR_RETURN(runtime::EngineOptions eo,
                         model_engine_options(a.model, a.threads, isa, a.memory, a.strata));
  // Another backend's conversation is not used (RunPromptCache::restore), nor planned for; with
  // --device auto a CPU one is planned for too (the run may fall back to the CPU at the load).
  // (cuBLAS prefill asked for may find no cuBLAS: a fused run's conversation too.)
  const std::string saved_backend = cache ? cache->saved_backend() : std::string();
  const bool may_resume =
      a.interactive && cache &&
      (saved_backend == runtime::backend_label(eo.device, eo.cublas_prefill) ||
       saved_backend == runtime::backend_label(eo.device) ||
       (eo.device_auto && saved_backend == runtime::backend_label(backend::DeviceKind::kCpu)));
  std::optional<runtime::PendingTurn> saved_turn =
      may_resume ? cache->conversation() : std::nullopt;
  std::vector<uint32_t> resumed_turn;  // what ends the saved last answer
  if (saved_turn) {
    // Whether its last token stopped it is the saving run's answer (a file of older ktier did
    // not say: this run's stop ids decide).
    if (!saved_turn->stop) saved_turn->stop = is_stop(saved_turn->id);
    resumed_turn = tok::end_assistant_turn(
        *tokenizer, *markers, static_cast<uint32_t>(saved_turn->id), *saved_turn->stop);
  }
  // A conversation the cache may resume adds its positions and the markup closing its last
  // answer (-c auto).
  const int64_t history =
      saved_turn ? cache->conversation_positions() + static_cast<int64_t>(resumed_turn.size())
                 : 0;
  KTIER_ASSIGN_OR_RETURN(const int64_t ctx,
                         run_positions(a, static_cast<int64_t>(raw.size()), history));
  eo.workload.positions = ctx;
  eo.workload.positions_from = kRunPositionsFrom;
  // The whole --chunk, even for a shorter prompt (whose widest forward is the prompt): `plan`,
  // which knows no prompt, places exactly what the run places. A short prompt with a long -n
  // can pass --chunk near its length to budget less.
  eo.workload.chunk = a.chunk;
  spdlog::info("loading {}", a.model);
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, runtime::Engine::open(eo));
  // The backend the engine runs on decides, as RunPromptCache::restore does.
  const std::optional<runtime::PendingTurn> pending =
      cache && cache->saved_by(*engine) ? saved_turn : std::nullopt;
  const format::ModelConfig& cfg = engine->checkpoint().config();
  // A tokenizer and a model that disagree on the vocabulary: ids past the tokenizer have no text
  // (the stream skips them), ids past the model cannot be run (refused where they occur).
  if (tokenizer && static_cast<int64_t>(tokenizer->vocab_size()) != cfg.vocab_size)
    spdlog::warn("the tokenizer has {} ids and config.json's vocab_size is {}: {}",
                 tokenizer->vocab_size(), cfg.vocab_size,
                 static_cast<int64_t>(tokenizer->vocab_size()) < cfg.vocab_size
                     ? "generated ids past the tokenizer print no text (--print-ids lists them)"
                     : "prompt text that encodes to ids past the model is refused");
  // The MLA caches are reserved for the positions planned (GPU mode: its working set holds
  // them), rather than grown by doubling: up to twice the memory, and a copy of every cache in
  // one token (K3 at 128k positions: 7 GB of caches).
  gen.reserve_positions = eo.workload.positions;

  const IdSource id_source = a.ids.empty() ? IdSource::kTokenizer : IdSource::kCommandLine;
  KTIER_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt,
                         ids_in_vocab(raw, cfg.vocab_size, id_source));

  warn_untrained_positions(a, cfg, ctx, static_cast<int64_t>(prompt.size()));

  // The prompt cache: where the sequence starts; a single run saves the prompt's state at its
  // last id unless --prompt-cache-all (see the end for that and for a run stopped in its
  // prompt), a conversation after every answer.
  // The sequence's caches are reserved up front (restored, or when the session opens): memory
  // refused for them is a budget the run asked past (exit 4, as serve's -c), not a failure
  // mid-run. (Not inside GenerationSession::open: serve opens one per request, where it is a
  // server error, not the client's.)
  const char* const caches_hint = "give a smaller -c or -n";
  std::optional<model::SequenceState> restored;
  if (cache) {
    Result<std::optional<model::SequenceState>> r =
        cache->restore(*engine, prompt, a.interactive, gen.reserve_positions);
    if (!r.is_ok()) return caches_refused_as_budget(r.status(), caches_hint);
    restored = std::move(*r);
  }
  const int64_t cached = cache ? cache->restored() : 0;
  const bool write_whole_prompt = write_cache && !a.interactive && !a.prompt_cache_all;
  if (write_whole_prompt)
    gen.before_last_prompt_id = [&](const model::SequenceState& state) {
      return cache->save(*engine, state, prompt);
    };

  std::optional<tok::StreamingDecoder> stream;
  if (tokenizer) stream.emplace(*tokenizer);
  std::vector<int32_t> generated;  // this turn's
  bool answer_stopped = false;     // its last token is a stop id (of the run that generated it)
  bool sink_failed = false;  // stdout failed (a reader gone: `| head`): between tokens
  // Ctrl-C stops at a whole token: a single run after its prompt chunk or token, with its text,
  // report and trace (exit 130); a conversation's answer after at least one token (its message
  // is never cut, and the answer closes as usual), the conversation going on. A single run that
  // saves no prompt cache and no trace stops sooner, after the layer running (its sequence is
  // not used again; a K3 prompt chunk on a CPU can take minutes), with the whole tokens' text
  // and report. A second Ctrl-C quits at once (a trace then stays unfinished).
  constexpr const char* kStopRun =
      "\nktier: Ctrl-C: stopping after this token or prompt chunk (Ctrl-C again quits at once)\n";
  constexpr const char* kStopRunSoon =
      "\nktier: Ctrl-C: stopping after this layer (Ctrl-C again quits at once)\n";
  constexpr const char* kStopAnswer =
      "\nktier: Ctrl-C: ending this answer (Ctrl-C again quits at once)\n";
  const bool stop_inside_passes = !a.interactive && !write_cache && a.trace.empty();
  InterruptRequest interrupt(a.interactive        ? kStopAnswer
                             : stop_inside_passes ? kStopRunSoon
                                                  : kStopRun);
  gen.stop_requested = [&] {
    return InterruptRequest::requested() && (!a.interactive || !generated.empty());
  };
  if (stop_inside_passes) gen.abandon_requested = [] { return InterruptRequest::requested(); };
  const auto emit = [&](int32_t id) -> Status {
    generated.push_back(id);
    if (!stream || !tok::shown_as_text(*tokenizer, gen.stop_ids, id, a.special))
      return Status::ok();
    KTIER_ASSIGN_OR_RETURN(const std::string piece, stream->push(static_cast<uint32_t>(id)));
    return write_stdout(piece);
  };
  const auto sink = [&](int32_t id) -> Status {
    Status emitted = emit(id);
    sink_failed = !emitted.is_ok();
    return emitted;
  };
  // A long prompt's prefill says how far it is (a K3 chunk on a CPU can take minutes): a line
  // once it has run 200 ms on a terminal (10 s in a log), none for a short one.
  std::optional<ProgressMeter> prefill_meter;
  gen.prefill_progress = [&](int64_t done, int64_t total) {
    if (!prefill_meter)
      prefill_meter.emplace("prefill", static_cast<uint64_t>(total),
                            spdlog::should_log(spdlog::level::info), std::chrono::seconds(10),
                            ProgressMeter::Unit::kTokens);
    if (done < total) {
      prefill_meter->update(static_cast<uint64_t>(done));
      return;
    }
    prefill_meter->finish_if_shown(static_cast<uint64_t>(total));
    prefill_meter.reset();
  };
  // One answer's report: its counters from the start of its decode (after its prompt) on.
  runtime::RunReport report;
  gen.before_decode = [&] { report.decode_start = runtime::EngineCounters::start_window(*engine); };
  report.cached_prompt_tokens = cached;
  Result<std::unique_ptr<runtime::GenerationSession>> opened =
      restored ? runtime::GenerationSession::open(
                     engine->model(), engine->experts(), gen, std::move(*restored),
                     {cache->restored_ids().begin(), cache->restored_ids().end()})
               : runtime::GenerationSession::open(engine->model(), engine->experts(), gen);
  if (!opened.is_ok()) return caches_refused_as_budget(opened.status(), caches_hint);
  std::unique_ptr<runtime::GenerationSession> session = std::move(*opened);
  std::unique_ptr<RunTrace> trace;
  if (!a.trace.empty()) {
    KTIER_ASSIGN_OR_RETURN(trace, RunTrace::open(*engine, a.trace));
  }
  // One answer: its text (and ids), then its report (the JSON file holds the last answer's).
  // A turn failed inside its forward passes (the trace ends mid-token); not when the sink failed
  // (that is between tokens).
  bool turn_cut = false;
  const auto answer = [&](std::span<const int32_t> ids) -> Status {
    generated.clear();
    if (to_context_end) {  // the positions left after `ids` hold the answer (its last not run)
      const int64_t left = ctx - session->positions() - static_cast<int64_t>(ids.size()) + 1;
      if (left < 1)
        return Status::budget("no position of -c/--ctx-size " + std::to_string(ctx) +
                              " is left for an answer");
      session->set_max_new_tokens(left);
    }
    report.limit_is_context_end = to_context_end;
    Result<runtime::GenerationStats> turn = session->turn(ids, sink);
    turn_cut = !turn.is_ok() && !sink_failed;
    if (prefill_meter) {  // the prefill failed: end its progress line before the error
      prefill_meter->abandon();
      prefill_meter.reset();
    }
    if (!turn.is_ok()) return engine->explain_nonfinite(turn.status());
    report.gen = *turn;
    answer_stopped = !generated.empty() && is_stop(generated.back());
    report.decode_end = runtime::EngineCounters::of(*engine);
    report.peak_rss_bytes = runtime::peak_rss_bytes();
    if (stream) KTIER_RETURN_IF_ERROR(write_stdout(stream->flush() + "\n"));
    if (a.print_ids || !stream) KTIER_RETURN_IF_ERROR(write_stdout(join_ids(generated) + "\n"));
    std::fputs(report.to_table(*engine).c_str(), stderr);
    if (!a.report_json.empty()) {
      nlohmann::json j = report.to_json(*engine);
      j["sampling_seed"] = gen.sampling.seed;  // a drawn one (-s -1) too: -s repeats the run
      KTIER_RETURN_IF_ERROR(io::write_output_file(a.report_json, json_output_text(j)));
    }
    report.cached_prompt_tokens = 0;  // only the first turn starts from the file
    if (!a.interactive || !cache || generated.empty()) return Status::ok();
    // The answer's last token is not run: it is the pending one, which the next turn begins with.
    return cache->save(*engine, session->state(), session->ids(),
                       runtime::PendingTurn{generated.back(), session->sampler_draws(),
                                            answer_stopped});
  };
  // The next turn of a conversation: the assistant's message closed, the user's next one.
  const auto next_turn = [&](const std::string& line) -> Result<std::vector<int32_t>> {
    std::vector<uint32_t> ids;
    if (!generated.empty())
      ids = tok::end_assistant_turn(*tokenizer, *markers, generated.back(), answer_stopped);
    const std::vector<uint32_t> user = tok::render_user_turn(*tokenizer, *markers, line);
    ids.insert(ids.end(), user.begin(), user.end());
    const int64_t needs =
        session->positions() + static_cast<int64_t>(ids.size()) + planned_answer - 1;
    if (needs > ctx)
      return Status::budget("the conversation would need " + std::to_string(needs) +
                            " positions with this message and " +
                            (to_context_end ? "an answer of one token (" + n_flag + ")" : n_flag) +
                            ", past " +
                            (a.ctx_size > 0 ? "-c/--ctx-size " + std::to_string(ctx)
                                            : "the " + std::to_string(ctx) +
                                                  " positions set aside for it (-c/--ctx-size "
                                                  "auto)") +
                            ": start it again with a larger -c");
    return ids_in_vocab(ids, cfg.vocab_size, id_source);
  };
  // A conversation's first message may come from standard input; an empty prompt is refused.
  Status status;
  if (const std::optional<runtime::PendingTurn> last =
          a.interactive && cached > 0 ? pending : std::nullopt) {
    generated.assign(1, last->id);  // a resumed conversation: its last answer closes first
    answer_stopped = *last->stop;
    // Its sampler goes on where the saved one stopped: a seeded conversation samples what it
    // would have without the interruption.
    session->skip_sampler_draws(last->sampler_draws);
    if (given > 0) {
      Result<std::vector<int32_t>> ids = next_turn(text);
      status = ids.is_ok() ? answer(*ids) : ids.status();
    }
  } else if (!a.interactive || given > 0) {
    status = answer(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(cached)));
  }
  StdinLines input;
  while (status.is_ok() && a.interactive) {
    // A Ctrl-C during the answer ended it, or came after the answer's last stop check (its last
    // token, the report): either way it was for the answer. At the prompt, Ctrl-C ends the
    // conversation (no notice: it ends at once).
    if (InterruptRequest::requested()) interrupt.rearm();
    interrupt.set_notice(nullptr);
    std::fputs("> ", stderr);
    std::fflush(stderr);
    Result<std::optional<std::string>> line = input.next(interrupt.wake_fd());
    if (!line.is_ok()) {
      status = line.status();
      break;
    }
    if (!line->has_value()) {  // end of input (or Ctrl-C) ends the conversation
      if (InterruptRequest::requested()) {
        std::fputs("\n", stderr);
        status = Status::interrupted("conversation ended by Ctrl-C");
      }
      break;
    }
    if ((*line)->empty()) continue;
    interrupt.set_notice(kStopAnswer);
    Result<std::vector<int32_t>> ids = next_turn(**line);
    status = ids.is_ok() ? answer(*ids) : ids.status();
  }
  // --prompt-cache-all saves the sequence as the run left it; without it, a run stopped in its
  // prompt saves the part it ran (a later run goes on from there; the state before the last id
  // was saved already unless the run stopped just there).
  const int64_t ran = session->positions();
  if (status.is_ok() && write_cache && !a.interactive && !session->abandoned() &&
      (a.prompt_cache_all || ran < static_cast<int64_t>(prompt.size()))) {
    status = cache->save(*engine, session->state(), session->ids());
  }
  // A single run that saw Ctrl-C, even after its last stop check, ends as interrupted (a script
  // running it stops).
  if (status.is_ok() && !a.interactive && InterruptRequest::requested()) {
    const int64_t run = cached + report.gen.prompt_tokens;
    const int64_t generated_n = report.gen.generated_tokens;
    status = Status::interrupted(
        run < static_cast<int64_t>(prompt.size())
            ? "stopped by Ctrl-C in the prompt, after " + std::to_string(run) + " of its " +
                  std::to_string(prompt.size()) + " tokens"
            : "stopped by Ctrl-C after " + std::to_string(generated_n) + " generated tokens");
  }
  return trace ? trace->finish(status, turn_cut) : status;
}

}  // namespace

void register_run_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<RunArgs>();
  auto* sub = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  add_model_option(sub, a->model);
  auto* p = sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  sub->add_option("-f,--file", a->file,
                  "Read the prompt from a file ('-' = standard input), less one final newline "
                  "(as llama.cpp's -f)");
  auto* ids = sub->add_option("--ids", a->ids,
                              "Prompt as comma-separated token ids (no tokenizer needed)");
  sub->add_option("-n,--n-predict", a->max_new_tokens,
                  "Tokens to generate at most; -1 (or -2) = until a stop id or the context (-c) "
                  "is full")
      ->capture_default_str();
  add_sampling_options(sub, a->sampling, /*for_requests=*/false);
  add_threads_option(sub, a->threads, "Worker threads");
  sub->add_option("--chunk", a->chunk, "Prompt tokens per prefill pass")->capture_default_str();
  sub->add_flag("--print-ids", a->print_ids, "After the text, print the generated ids on one line");
  sub->add_option("--stop-id", a->stop_ids,
                  "Also stop after this token id (repeatable, or ids separated by commas); "
                  "config.json's and "
                  "generation_config.json's eos_token_id always stop, and --chat's <|close|>. "
                  "A run with none of them is refused unless -n 0. In a --chat -i conversation "
                  "the id is left out of the answer that stopped at it")
      ->type_name("ID")
      ->delimiter(',')
      ->allow_extra_args(false);
  sub->add_option("-l,--logit-bias", a->logit_bias,
                  "Add BIAS to the token's logit before sampling and the penalties, as "
                  "llama-cli's: TOKEN_ID+BIAS or TOKEN_ID-BIAS (15043+1.5; 15043-inf: never "
                  "drawn); repeatable")
      ->type_name("ID(+|-)BIAS")
      ->allow_extra_args(false);
  sub->add_flag("--ignore-eos", a->ignore_eos,
                "Never draw a stop id (config.json's and generation_config.json's "
                "eos_token_id, each --stop-id, --chat's <|close|>: a -inf --logit-bias), so "
                "that the answer runs to -n, e.g. for fixed-length speed runs; -n -1 runs to "
                "the end of the context");
  sub->add_flag("--special", a->special,
                "Print special tokens in the output (hidden by default), except the stop id "
                "that ends it (--print-ids lists every id)");
  sub->add_flag("--no-parse-special", a->names_as_text,
                "Read added-token names (<|end_of_msg|>...) in -p/-f text as text (for untrusted "
                "text); by default they are their ids, as llama-cli and serve's completions read "
                "a prompt (--chat keeps a message's names text either way)")
      ->excludes("--ids");
  sub->add_flag("--chat", a->chat,
                "Wrap the prompt text as one user message in Kimi K3's chat format (thinking "
                "off; typed marker strings stay text) and stop where the model closes its "
                "response")
      ->excludes("--ids");
  sub->add_flag("-i,--interactive", a->interactive,
                "With --chat: a conversation. After each answer, read the next message as one "
                "line from standard input (\"> \" on stderr; end of input or Ctrl-C there ends it; "
                "Ctrl-C during an answer ends the answer) and run only its tokens in the same "
                "sequence; the first message may come from there too");
  sub->add_option("-c,--ctx-size", a->ctx_size,
                  "Positions a run may use (0 = auto: the prompt + -n - 1, the prompt with -n 0, "
                  "with -n -1 4096 or "
                  "the prompt if longer; for --interactive 4096, or the first turn + 1024 + -n if "
                  "more (a first message given with -p or -f: one read from standard input comes "
                  "after the load, within the 4096), a conversation resumed from --prompt-cache "
                  "counted in; GPU mode sets the state for this many aside). Too small for the "
                  "prompt + -n - 1 (with -n -1 the prompt): exit 2; a conversation's message past "
                  "it: exit 4")
      ->capture_default_str();
  add_isa_option(sub, a->isa);
  add_memory_options(sub, a->memory);
  add_strata_options(sub, a->strata);
  sub->add_option("--report-json", a->report_json, "Also write the run report to FILE as JSON");
  sub->add_option("--trace", a->trace,
                  "Record every token's routing and lookahead predictions (strata trace, see "
                  "`ktier trace info/replay`)");
  auto* cache =
      sub->add_option("--prompt-cache", a->prompt_cache,
                      "As llama.cpp's: start from the state saved in FILE when the prompt begins "
                      "with its ids (the same output, without their prefill), and save the "
                      "prompt's state there (all its ids but the last). A state is never cut "
                      "back: a prompt that does not begin with the saved ids runs whole. With "
                      "-i: the conversation FILE holds goes on, and is saved after every answer "
                      "(answers as if it never stopped: a sampler with the same flags goes on "
                      "where the saved one was). "
                      "A file of another checkpoint: exit 2; damaged: exit 3");
  sub->add_flag("--prompt-cache-all", a->prompt_cache_all,
                "With --prompt-cache: save the generated tokens' state too, so that a prompt "
                "that goes on from this run's output reuses all of it (a conversation always "
                "saves all of it)")
      ->needs(cache);
  sub->add_flag("--prompt-cache-ro", a->prompt_cache_ro,
                "With --prompt-cache: start from the file, never write it")
      ->needs(cache)
      ->excludes("--prompt-cache-all");
  sub->callback([a, p, ids, &exit_code] {
    a->has_prompt = p->count() > 0;
    a->has_ids = ids->count() > 0;
    exit_code = finish(run(*a));
  });
}

}  // namespace ktier::cli
