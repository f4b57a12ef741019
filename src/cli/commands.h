#pragma once
// Subcommand registry. Each subcommand lives in its own file (cmd_<name>.cpp), adds its
// options to the CLI11 app and, when invoked, stores its process exit code in `exit_code`.
// Errors are printed once, by finish(), as "ktier: error: <message>".

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace ktier::cli {

// Prints a non-ok status to stderr and returns its exit code (0 for ok).
int finish(const Status& status);

void register_run_command(CLI::App& app, int& exit_code);
void register_eval_command(CLI::App& app, int& exit_code);
void register_perplexity_command(CLI::App& app, int& exit_code);
void register_synth_command(CLI::App& app, int& exit_code);
void register_inspect_command(CLI::App& app, int& exit_code);
void register_tokenize_command(CLI::App& app, int& exit_code);
void register_doctor_command(CLI::App& app, int& exit_code);
void register_trace_command(CLI::App& app, int& exit_code);
void register_bench_command(CLI::App& app, int& exit_code);
// `ktier bench decode`, added under the `bench` subcommand by register_bench_command.
void register_bench_decode_command(CLI::App& bench, int& exit_code);
void register_bench_io_command(CLI::App& bench, int& exit_code);
void register_bench_inflate_command(CLI::App& bench, int& exit_code);
// `ktier bench device` (cmd_bench_device.cpp).
void register_bench_device_command(CLI::App& bench, int& exit_code);
void register_pack_command(CLI::App& app, int& exit_code);
// `ktier plan` (cmd_plan.cpp): the placement of run's memory flags, without loading.
void register_plan_command(CLI::App& app, int& exit_code);
#if KTIER_HAS_SERVER
// `ktier serve` (cmd_serve.cpp), built when the build found cpp-httplib (KTIER_SERVER).
void register_serve_command(CLI::App& app, int& exit_code);
#endif

}  // namespace ktier::cli
