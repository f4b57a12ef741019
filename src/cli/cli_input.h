#pragma once
// Input helpers shared by the subcommands that take text or token ids.

#include <charconv>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/strata_options.h"
#include "common/status.h"
#include "format/config.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace ktier::cli {

// Prompt text ends here: 256 bytes per position of K3's 1,048,576-position context, far more
// than any tokenizer packs into a token, so a longer input cannot run; reading stops at this
// bound instead of exhausting memory on `-f /dev/zero`.
inline constexpr size_t kMaxInputBytes = size_t{256} << 20;

// What sets a run's positions (EngineOptions::Workload::positions_from), as `run` and `plan`
// for it name it in a budget refusal.
inline constexpr const char* kRunPositionsFrom =
    "-c; by default the prompt and -n, a --chat -i conversation at least 4096";

// The whole content of `file` ("-" = standard input). Status::usage when it cannot be opened, is
// a directory, or holds more than kMaxInputBytes; Status::runtime on a read error (errno named).
Result<std::string> read_input(const std::string& file);
// A prompt file (`run -f`, `perplexity -f`): read_input's text less one final '\n', as
// llama.cpp's -f reads one (an editor's last newline is not part of the prompt).
Result<std::string> read_prompt_file(const std::string& file);

// Lines of standard input for `run --chat -i`, read from descriptor 0 (nothing else in ktier
// reads it). Not thread-safe.
class StdinLines {
 public:
  // The next line without its "\n" or "\r\n"; std::nullopt at the end of input (a last line
  // without "\n" is still returned). Status::usage for a line over kMaxInputBytes,
  // Status::runtime on a read error. With `wake_fd` >= 0: std::nullopt too as soon as that
  // descriptor is readable while a line is awaited (Ctrl-C, InterruptRequest::wake_fd; the
  // caller tells the two apart), the bytes read so far kept for the next call.
  Result<std::optional<std::string>> next(int wake_fd = -1);

 private:
  std::string buffer_;  // bytes read and not yet returned
  bool at_end_ = false;
};

// "19180,2695" -> {19180, 2695}; spaces around items allowed; an empty string is an empty list.
// Status::usage naming the offending item, with `flag` in the message.
Result<std::vector<uint32_t>> parse_ids(const std::string& s, const std::string& flag = "--ids");
// Status::usage when `s`, the value given to `flag`, holds no id at all (blank): where a list is
// required (run, eval, tokenize --decode), an empty one is refused in these words.
Status check_ids_given(const std::string& s, const std::string& flag = "--ids");

// Where ids to run come from: the command line (a bad id is a usage error) or the model's own
// tokenizer (an id past config.json's vocab_size means the model folder disagrees with itself).
enum class IdSource { kCommandLine, kTokenizer };

// The ids as model token ids; an error naming the first id >= vocab: Status::usage for
// command-line ids, Status::corrupt for the tokenizer's.
Result<std::vector<int32_t>> ids_in_vocab(const std::vector<uint32_t>& raw, int64_t vocab,
                                          IdSource source = IdSource::kCommandLine);

// What a command reads: a folder (every file in it) or one file, named for messages.
struct InputPath {
  std::string flag;  // "-m", "--pack", "--profile", "TRACE"
  std::string path;  // empty: not given (skipped)
  bool folder = false;
};
// Refuses (Status::usage naming both) an output path that is one of `inputs` (files the command
// reads, or another of its outputs) or an existing model or pack file inside an input folder
// (config.json, shards, index, tokenizer files, manifest.json, trunk.pack; or another name of
// any file there), so that no
// report, trace or CSV overwrites what the command uses. Paths are compared after resolving
// links and `..` (the output need not exist). Empty paths pass.
Status check_output_is_not_input(const std::string& flag, const std::string& output,
                                 std::initializer_list<InputPath> inputs);

// A flag of llama.cpp's tools that ktier does not have, given in argv (not as the value of -p or
// --prompt): "'-ngl' is llama.cpp's ...; here: ..." for the first one, else empty. CLI11 reads
// llama.cpp's single-dash words as bundles of one-letter flags (-fa as "-f a", -ngl as "-n gl"),
// which would fail naming another option or, worse, run.
// `takes_value(name)`: whether ktier's option `name` ("-f", "--trace") reads the next argument
// as its value, which is then never taken for a flag (a file named "-co"); the scan ends at "--".
std::string llama_cpp_flag_problem(int argc, const char* const* argv,
                                   const std::function<bool(std::string_view)>& takes_value);

// An option that reads a list split at a delimiter (`delimiter_of(name)`, '\0' for the others)
// given an empty value or only delimiters ("--stop-id ,", "--stop-id="): "NAME: empty value
// ..." for the first, else empty. CLI11 reads no item from such a value and takes the next
// argument in its place (`--stop-id , 24` stopped at 24). As llama_cpp_flag_problem's scan: an
// option's value is not looked at (`-p --stop-id=`), and the scan ends at "--".
std::string empty_list_value_problem(int argc, const char* const* argv,
                                     const std::function<bool(std::string_view)>& takes_value,
                                     const std::function<char(std::string_view)>& delimiter_of);

// Writes `s` to standard output and flushes it; Status::runtime naming the errno when the
// reader has gone (EPIPE: SIGPIPE is ignored by the commands that stream) or the write fails.
Status write_stdout(const std::string& s);
// Ignores SIGPIPE for the rest of the process: a reader or client that goes away (`ktier run |
// head`, a closed HTTP connection) is a failed write (EPIPE), not death by signal (exit 141).
void ignore_sigpipe();

// One warning line when positions up to `last_position` (0-based) go past config.json's
// max_position_embeddings (untrained positions: the output is not what the model was trained
// for). `what` names what runs them ("prompt (9 tokens) + -n 4", "a window of -c 8192").
void warn_past_trained_positions(const format::ModelConfig& config, int64_t last_position,
                                 const std::string& what);

// A sequence's caches are reserved up front (run's session, serve's -c probe): memory refused
// for them (is_out_of_memory()) is a budget the command asked past, exit 4 with `hint` ("give a
// smaller -c") appended; any other failure (a device error) keeps its code.
Status caches_refused_as_budget(const Status& s, const std::string& hint);

// "1,2,3" (no spaces) for an id list.
std::string join_ids(const std::vector<int32_t>& ids);

// The memory-dial and device options of run, eval, perplexity, serve and plan: --pack, --ram,
// --preset, --io, --io-rate-limit, --device, --vram, --gpu-prefill.
struct MemoryArgs {
  std::string pack, ram, preset, io = "auto", device = "auto", vram, gpu_prefill = "fused";
  double io_rate_limit_mb_s = 0;  // MB/s (1e6 bytes); 0 = unlimited
};
// Adds --io-rate-limit MB/s to `sub` (also used by `bench decode`); `scope` ends its help,
// saying when the command honours it.
void add_rate_limit_option(CLI::App* sub, double& mb_s, const std::string& scope);
// The cap in bytes per second for IoOptions::rate_limit_bytes_per_s; Status::usage when negative
// or not finite.
Result<uint64_t> rate_limit_bytes_per_s(double mb_s);
void add_memory_options(CLI::App* sub, MemoryArgs& a);

// Adds "-m,--model DIR" (required) to `sub`: the model folder of run, eval, perplexity, serve
// and plan.
void add_model_option(CLI::App* sub, std::string& model);
// Adds "--isa NAME" (auto, scalar, avx2, avx512; checked by runtime::parse_isa) to `sub`.
void add_isa_option(CLI::App* sub, std::string& isa);

// Adds "-t,--threads N" to `sub` with help `help` (e.g. "Worker threads"), taking
// min..cpu::kMaxThreads (CLI11 refuses other values: exit 2); with min 0, 0 means one per
// hardware thread.
CLI::Option* add_threads_option(CLI::App* sub, int& threads, const std::string& help, int min = 0);
// A CLI11 transform for options bound to an unsigned type T: decimal digits only, at most `max`
// (default: T's largest), rewritten in canonical decimal. CLI11 alone converts with strtoull
// base 0, which wraps "-1" (and " -1") to the largest value, saturates "99999999999999999999"
// to it without a word, and reads "010" as octal 8. Use with ->transform(), not ->check() (a
// check gets a copy of the text).
template <typename T>
CLI::Validator whole_number(T max = std::numeric_limits<T>::max()) {
  return CLI::Validator(
      [max](std::string& v) -> std::string {
        T value{};
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos ||
            ec != std::errc() || end != v.data() + v.size() || value > max)
          return "'" + v + "' is not a whole number 0.." + std::to_string(max);
        v = std::to_string(value);
        return {};
      },
      "", "whole number");
}

// Gives every option of `app` and its subcommands bound to an integer or floating type (CLI11's
// INT, UINT, FLOAT) that has no whole_number transform of its own a transform that reads the
// number as written. CLI11 alone converts integers with strto(u)ll in base 0 ("010" as octal
// 8, "0x10" as 16), saturates past int64 without a word and wraps "-1" to an unsigned type's
// largest; floats with strtold, which reads 1e-5000 as 0 (for --io-rate-limit "no cap", for
// --temp greedy). After it: integers are decimal digits (spaces around and a '+' allowed, as
// strtoll took them; leading zeros kept out of octal), within the 64-bit type (narrower
// targets and the commands check the rest); a float that a double reads as 0 or infinity is
// refused. Call once every command is registered.
void read_numbers_as_written(CLI::App& app);

// Largest value of the MiB-sized bench options (1 TiB): past it, `<< 20` would wrap.
inline constexpr uint64_t kMaxBenchMib = uint64_t{1} << 20;

// Adds "-s,--seed S" to `sub` (llama.cpp's names; checked with whole_number<uint64_t>).
// `random_allowed`: "-1" is read as runtime::kRandomSeed (llama.cpp's random seed).
CLI::Option* add_seed_option(CLI::App* sub, uint64_t& seed, const std::string& help,
                             bool random_allowed = false);
// Adds llama.cpp's sampling flags bound to `sampling` (whose values are the defaults shown):
// --temp, --top-k, --top-p, --min-p, --seed, --repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty. `for_requests`: each is what a `ktier serve` request
// that gives none uses (said in its help). Ranges are checked by runtime::validate.
void add_sampling_options(CLI::App* sub, runtime::SamplingParams& sampling, bool for_requests);
// Fills the engine options from them and decides the device (loading the CUDA module unless
// --device cpu; the reason for the choice is logged once). Status::usage for a bad size, --io or
// --device value, or --device cuda where CUDA cannot be used.
Status apply_memory_options(const MemoryArgs& a, runtime::EngineOptions& eo);

// The engine options run, eval and perplexity build alike: the model folder, threads, the
// kernels' ISA (nullopt: auto), then apply_memory_options and apply_strata_options (their
// errors). The workload is the caller's to set.
Result<runtime::EngineOptions> model_engine_options(const std::string& model, int threads,
                                                    std::optional<cpu::Isa> isa,
                                                    const MemoryArgs& memory,
                                                    const StrataArgs& strata);

}  // namespace ktier::cli
