// ktier perplexity: how well the model predicts a text, as llama.cpp's llama-perplexity measures
// it, so that runs of the same checkpoint on other engines (or on ktier's GPU path, or another
// memory budget) can be compared by one number.
//
//   ktier perplexity -m DIR (-f FILE | -p TEXT | --ids 1,2,3) [-c N] [--chunk N] [--json FILE]
//                    [--threads N] [memory-dial, device and strata options as for run]
//
// The tokens are cut into windows of -c tokens (default 512; a text shorter than one window is
// one window of all its tokens; the tokens after the last whole window are left out), each
// decoded from an empty sequence; in each window the second half is scored: the logits at
// position i (c/2 <= i < c - 1) against token i + 1, the first half being context only.
// No BOS is put before a window (K3-MODEL D10, as for `run`; llama-perplexity adds one where the
// tokenizer does, which matters when comparing figures).
// stdout: one line, "perplexity P +/- E over N tokens (W windows of C)"; the estimate so far is
// logged after each window. Ctrl-C stops after the current window with the estimate so far
// (exit 130). The figure depends only on the logits' bytes, so never on --threads, --chunk,
// --isa or the memory budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "cli/strata_options.h"
#include "common/interrupt.h"
#include "common/json_text.h"
#include "common/progress.h"
#include "io/output_file.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace ktier::cli {
namespace {

struct PerplexityArgs {
  std::string model, prompt, file, ids, json, isa = "auto";
  MemoryArgs memory;
  StrataArgs strata;
  bool has_prompt = false, has_ids = false;
  int64_t ctx = 512, chunk = 256;
  int threads = 0;
};

// A line of its own, as run's: the progress line it interrupts is ended first.
constexpr const char* kStopWindow =
    "\nktier: Ctrl-C: stopping after this window (Ctrl-C again quits at once)\n";

// The ids to score, read and tokenized before the (long) load so that bad input fails at once.
Result<std::vector<uint32_t>> input_ids(const PerplexityArgs& a) {
  const int given = int(a.has_prompt) + int(!a.file.empty()) + int(a.has_ids);
  if (given != 1) return Status::usage("give exactly one of -p TEXT, -f FILE or --ids 1,2,3");
  if (a.has_ids) {
    KTIER_RETURN_IF_ERROR(check_ids_given(a.ids));
    return parse_ids(a.ids);
  }
  KTIER_ASSIGN_OR_RETURN(const bool has_tokenizer,
                         io::path_exists(std::filesystem::path(a.model) / "tiktoken.model"));
  if (!has_tokenizer)
    return Status::usage(a.model + "/tiktoken.model: not found; text needs the tokenizer "
                         "(score token ids with --ids instead)");
  KTIER_ASSIGN_OR_RETURN(const tok::Tokenizer tokenizer, tok::Tokenizer::load(a.model));
  std::string text = a.prompt;
  if (!a.file.empty()) {
    KTIER_ASSIGN_OR_RETURN(text, read_prompt_file(a.file));
  }
  return tokenizer.encode(text, /*special=*/false);
}

Status perplexity(const PerplexityArgs& a) {
  // A window of c tokens scores positions c/2 .. c-2: at least 3 for one prediction.
  if (a.ctx < 3 || a.ctx > INT32_MAX)
    return Status::usage("-c/--ctx-size must be in 3.." + std::to_string(INT32_MAX) +
                         " (a window scores its second half, after the first)");
  if (a.chunk < 1) return Status::usage("--chunk must be >= 1");
  KTIER_ASSIGN_OR_RETURN(const std::optional<cpu::Isa> isa, runtime::parse_isa(a.isa));
  KTIER_RETURN_IF_ERROR(format::Checkpoint::check_directory(a.model));
  KTIER_RETURN_IF_ERROR(check_output_is_not_input(
      "--json", a.json,
      {{"-m", a.model, true}, {"--pack", a.memory.pack, true}, {"--profile", a.strata.profile},
       {"-f", a.file == "-" ? std::string() : a.file},
       {"standard input", a.file == "-" ? "/dev/stdin" : std::string()}}));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--json", a.json));
  KTIER_ASSIGN_OR_RETURN(const std::vector<uint32_t> raw, input_ids(a));
  if (raw.size() < 3)
    return Status::usage(std::string(a.has_ids ? "--ids gives " : "the text is ") +
                         std::to_string(raw.size()) +
                         " token(s): scoring needs at least 3 (half of them context)");
  const int64_t total = static_cast<int64_t>(raw.size());
  const int64_t window = std::min(a.ctx, total), windows = total / window;
  // llama-perplexity refuses such a text; here it is one shorter window, which is said: its
  // figure is not comparable with those of whole -c windows.
  if (window < a.ctx)
    spdlog::warn("the text has {} tokens, fewer than -c {}: one window of {} instead (a "
                 "perplexity over shorter windows is not comparable with one over -c {})",
                 total, a.ctx, window, a.ctx);
  const int64_t first = window / 2;  // the first scored position of a window
  const int64_t chunk = std::min(a.chunk, window);

  KTIER_ASSIGN_OR_RETURN(runtime::EngineOptions eo,
                         model_engine_options(a.model, a.threads, isa, a.memory, a.strata));
  eo.workload.positions = window;
  eo.workload.positions_from = "-c, the window; a shorter text's length";
  eo.workload.chunk = chunk;
  eo.workload.rows = model::LogitRows::kAll;
  spdlog::info("loading {}", a.model);
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, runtime::Engine::open(eo));
  const int64_t V = engine->checkpoint().config().vocab_size;
  KTIER_ASSIGN_OR_RETURN(
      const std::vector<int32_t> ids,
      ids_in_vocab(raw, V, a.has_ids ? IdSource::kCommandLine : IdSource::kTokenizer));
  warn_past_trained_positions(engine->checkpoint().config(), window - 1,
                              "a window of " + std::to_string(window) + " tokens (-c)");
  spdlog::info("{} tokens: {} window(s) of {}, scoring positions {}..{} of each{}", total,
               windows, window, first, window - 2,
               total > windows * window
                   ? " (the last " + std::to_string(total - windows * window) + " left out)"
                   : std::string());

  InterruptRequest interrupt(kStopWindow);
  runtime::PerplexityMeter meter;
  int64_t done = 0;
  for (; done < windows && !InterruptRequest::requested(); ++done) {
    const std::span<const int32_t> w(ids.data() + done * window, static_cast<size_t>(window));
    // A window of a large model can take minutes on a CPU: a progress line once it has run
    // 200 ms on a terminal (10 s in a log), ended before the window's estimate is logged.
    ProgressMeter meter_line("window " + std::to_string(done + 1) + "/" + std::to_string(windows),
                             static_cast<uint64_t>(window),
                             spdlog::should_log(spdlog::level::info), std::chrono::seconds(10),
                             ProgressMeter::Unit::kTokens);
    // Scored chunk by chunk: one chunk's logits are held, and the first half's chunks run
    // without lm_head.
    const auto score = [&](int64_t pos, int64_t n, const float* logits) -> Status {
      for (int64_t i = std::max(pos, first); i < pos + n && i + 1 < window; ++i)
        KTIER_RETURN_IF_ERROR(meter.add(logits + (i - pos) * V, V,
                                        w[static_cast<size_t>(i + 1)], i + 1));
      return Status::ok();
    };
    const auto progress = [&](int64_t done, int64_t) {
      meter_line.update(static_cast<uint64_t>(done));
    };
    if (Status s = runtime::evaluate_chunks(engine->model(), w, chunk, first, score, progress);
        !s.is_ok()) {
      meter_line.abandon();
      return engine->explain_nonfinite(s);
    }
    meter_line.finish_if_shown(static_cast<uint64_t>(window));
    spdlog::info("[{}/{}] perplexity {:.4f} +/- {:.4f}", done + 1, windows, meter.perplexity(),
                 meter.perplexity_error());
  }
  if (done == 0) return Status::interrupted("stopped by Ctrl-C before the first window ended");
  char line[160];
  std::snprintf(line, sizeof line,
                "perplexity %.6f +/- %.6f over %lld token%s (%lld window%s of %lld)\n",
                meter.perplexity(), meter.perplexity_error(), static_cast<long long>(meter.count()),
                meter.count() == 1 ? "" : "s", static_cast<long long>(done), done == 1 ? "" : "s",
                static_cast<long long>(window));
  KTIER_RETURN_IF_ERROR(write_stdout(line));
  if (!a.json.empty()) {
    const nlohmann::json j{{"perplexity", meter.perplexity()},
                           {"perplexity_error", meter.perplexity_error()},
                           {"mean_nll", meter.mean_nll()},
                           {"tokens_scored", meter.count()},
                           {"windows", done},
                           {"window_tokens", window},
                           {"text_tokens", total}};
    KTIER_RETURN_IF_ERROR(io::write_output_file(a.json, json_output_text(j)));
  }
  // Ctrl-C in the last window too ends as interrupted, as `run` does: a script running it stops.
  if (done < windows || InterruptRequest::requested())
    return Status::interrupted("stopped by Ctrl-C after " + std::to_string(done) + " of " +
                               std::to_string(windows) + " windows");
  return Status::ok();
}

}  // namespace

void register_perplexity_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<PerplexityArgs>();
  auto* sub = app.add_subcommand(
      "perplexity", "Perplexity of a text (as llama-perplexity): windows of -c tokens, the "
                    "second half of each scored");
  add_model_option(sub, a->model);
  auto* p = sub->add_option("-p,--prompt", a->prompt, "Text to score");
  sub->add_option("-f,--file", a->file,
                  "Read the text from a file ('-' = standard input), less one final newline "
                  "(as llama.cpp's -f)");
  auto* ids = sub->add_option("--ids", a->ids,
                              "Token ids to score, comma-separated (no tokenizer needed)");
  sub->add_option("-c,--ctx-size", a->ctx,
                  "Tokens per window, each decoded from an empty sequence; its second half is "
                  "scored")
      ->capture_default_str();
  sub->add_option("--chunk", a->chunk,
                  "Tokens per forward pass (the logits of one pass are held: chunk x vocabulary "
                  "floats)")
      ->capture_default_str();
  sub->add_option("--json", a->json,
                  "Also write perplexity, perplexity_error, mean_nll (nats), tokens_scored, "
                  "windows, window_tokens, text_tokens to FILE");
  add_threads_option(sub, a->threads, "Worker threads");
  add_isa_option(sub, a->isa);
  add_memory_options(sub, a->memory);
  add_strata_options(sub, a->strata);
  sub->callback([a, p, ids, &exit_code] {
    a->has_prompt = p->count() > 0;
    a->has_ids = ids->count() > 0;
    exit_code = finish(perplexity(*a));
  });
}

}  // namespace ktier::cli
