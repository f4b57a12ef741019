// ktier eval: one teacher-forced forward over token ids (issue 3 interface).
//
//   ktier eval -m DIR --ids 1,2,3,... [--argmax] [--logits-out FILE] [--chunk N] [--threads N]
//
// --argmax prints the argmax of every position's logits (lowest index on ties), comma-separated
// on one line. --logits-out writes every logit as little-endian f32, position-major
// ([T, V]). The output bytes do not depend on --chunk, --threads or --isa.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "cli/cli_input.h"
#include "cli/commands.h"
#include "cli/strata_options.h"
#include "common/progress.h"
#include "cpu/kernels.h"
#include "io/output_file.h"
#include "runtime/engine.h"
#include "runtime/generator.h"

namespace ktier::cli {
namespace {

struct EvalArgs {
  std::string model, ids, logits_out, isa = "auto";
  MemoryArgs memory;
  StrataArgs strata;
  bool argmax = false;
  int64_t chunk = 0;
  int threads = 0;
};

Status write_logits(const std::string& path, const std::vector<float>& logits) {
  static_assert(std::endian::native == std::endian::little, "logits files are little-endian");
  return io::write_output_file(path, std::string_view(reinterpret_cast<const char*>(logits.data()),
                                                  logits.size() * sizeof(float)));
}

Status eval(const EvalArgs& a) {
  if (!a.argmax && a.logits_out.empty())
    return Status::usage("nothing to do: give --argmax and/or --logits-out FILE");
  if (a.chunk < 0) return Status::usage("--chunk must be >= 0 (0 = all ids in one pass)");
  KTIER_RETURN_IF_ERROR(check_ids_given(a.ids));
  KTIER_ASSIGN_OR_RETURN(const std::vector<uint32_t> raw, parse_ids(a.ids));
  KTIER_RETURN_IF_ERROR(check_output_is_not_input(
      "--logits-out", a.logits_out,
      {{"-m", a.model, true}, {"--pack", a.memory.pack, true}, {"--profile", a.strata.profile}}));
  KTIER_RETURN_IF_ERROR(io::check_can_write("--logits-out", a.logits_out));
  KTIER_ASSIGN_OR_RETURN(const std::optional<cpu::Isa> isa, runtime::parse_isa(a.isa));
  KTIER_ASSIGN_OR_RETURN(runtime::EngineOptions eo,
                         model_engine_options(a.model, a.threads, isa, a.memory, a.strata));
  eo.workload.positions = static_cast<int64_t>(raw.size());
  eo.workload.positions_from = "the ids given";
  eo.workload.chunk = a.chunk > 0 ? a.chunk : eo.workload.positions;
  eo.workload.rows = model::LogitRows::kAll;
  KTIER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine, runtime::Engine::open(eo));
  const int64_t V = engine->checkpoint().config().vocab_size;
  KTIER_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, ids_in_vocab(raw, V));
  const int64_t T = static_cast<int64_t>(ids.size());
  warn_past_trained_positions(engine->checkpoint().config(), T - 1,
                              "the input (" + std::to_string(T) + " tokens)");
  std::vector<float> logits(static_cast<size_t>(T * V));
  // A long input says how far it is, layer by layer within each chunk (one chunk of a K3 input
  // on a CPU takes minutes): a line once it has run 200 ms on a terminal (10 s in a log).
  ProgressMeter meter("eval", static_cast<uint64_t>(T), spdlog::should_log(spdlog::level::info),
                      std::chrono::seconds(10), ProgressMeter::Unit::kTokens);
  const Status evaluated = runtime::evaluate_chunks(
      engine->model(), ids, a.chunk > 0 ? a.chunk : T, 0,
      [&](int64_t first, int64_t n, const float* rows) {
        // Checked as each chunk ends: the routing explain_nonfinite looks at is its pass's.
        // Logits from non-finite weights or activations are not an answer: nothing is written.
        for (int64_t r = 0; r < n; ++r)
          KTIER_RETURN_IF_ERROR(runtime::check_logits(rows + r * V, V, first + r + 1));
        std::copy(rows, rows + n * V, logits.data() + first * V);
        return Status::ok();
      },
      [&](int64_t done, int64_t) { meter.update(static_cast<uint64_t>(done)); });
  if (!evaluated.is_ok()) meter.abandon();
  KTIER_RETURN_IF_ERROR(engine->explain_nonfinite(evaluated));
  meter.finish_if_shown(static_cast<uint64_t>(T));
  if (!a.logits_out.empty()) KTIER_RETURN_IF_ERROR(write_logits(a.logits_out, logits));
  if (a.argmax) {
    std::vector<int32_t> best;
    for (int64_t t = 0; t < T; ++t)
      best.push_back(static_cast<int32_t>(cpu::argmax(logits.data() + t * V, V, engine->exec())));
    KTIER_RETURN_IF_ERROR(write_stdout(join_ids(best) + "\n"));
  }
  return Status::ok();
}

}  // namespace

void register_eval_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<EvalArgs>();
  auto* sub = app.add_subcommand("eval", "Teacher-forced forward over token ids: argmax, logits");
  add_model_option(sub, a->model);
  sub->add_option("--ids", a->ids, "Comma-separated token ids")->required();
  sub->add_flag("--argmax", a->argmax, "Print the argmax of every position on one line");
  sub->add_option("--logits-out", a->logits_out,
                  "Write all logits to FILE as little-endian f32, position-major [T, V]");
  sub->add_option("--chunk", a->chunk, "Ids per forward pass; 0 = all at once")
      ->capture_default_str();
  add_threads_option(sub, a->threads, "Worker threads");
  add_isa_option(sub, a->isa);
  add_memory_options(sub, a->memory);
  add_strata_options(sub, a->strata);
  sub->callback([a, &exit_code] { exit_code = finish(eval(*a)); });
}

}  // namespace ktier::cli
