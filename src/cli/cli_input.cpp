#include "cli/cli_input.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "backend/device_choice.h"
#include "common/size.h"
#include "cpu/thread_pool.h"
#include "io/output_file.h"
#include "io/read_file.h"
#include "pack/trunk_pack.h"

namespace ktier::cli {

namespace {

// Appends what one read(2) of `fd` returns (up to 64 KiB) to `out`; 0 at the end of input.
// EINTR is retried. `what` names the input in the error.
Result<size_t> read_some(int fd, std::string& out, const std::string& what) {
  constexpr size_t kStep = 64 << 10;
  const size_t old_size = out.size();
  out.resize(old_size + kStep);
  ssize_t n;
  do {
    n = ::read(fd, out.data() + old_size, kStep);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  out.resize(old_size + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (n < 0) {
    if (err == EISDIR) return Status::usage(what + ": is a directory, not an input file");
    return Status::runtime(what + ": read error: " + io::errno_text(err));
  }
  return static_cast<size_t>(n);
}

Status too_long(const std::string& what) {
  return Status::usage(what + ": more than " + std::to_string(kMaxInputBytes >> 20) +
                       " MiB of text, more than any context holds");
}

Result<std::string> read_all(int fd, const std::string& what) {
  std::string text;
  while (true) {
    KTIER_ASSIGN_OR_RETURN(const size_t n, read_some(fd, text, what));
    if (n == 0) return text;
    if (text.size() > kMaxInputBytes) return too_long(what);
  }
}

}  // namespace

Result<std::string> read_input(const std::string& file) {
  if (file == "-") return read_all(STDIN_FILENO, "standard input");
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    return Status::usage(file + ": is a directory, not an input file");
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;  // before the message's allocations
    const std::string why = file + ": cannot open input file: " + io::errno_text(err);
    // A name that leads nowhere is the command line's fault (exit 2); a file there that cannot
    // be read (permissions, I/O) is exit 1, as for every other file ktier reads.
    return err == ENOENT || err == ENOTDIR || err == ENAMETOOLONG || err == ELOOP
               ? Status::usage(why)
               : Status::runtime(why);
  }
  Result<std::string> text = read_all(fd, file);
  ::close(fd);
  return text;
}

Result<std::string> read_prompt_file(const std::string& file) {
  KTIER_ASSIGN_OR_RETURN(std::string text, read_input(file));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

Result<std::optional<std::string>> StdinLines::next(int wake_fd) {
  size_t scanned = 0;  // bytes of buffer_ already known to hold no newline
  while (true) {
    const size_t newline = buffer_.find('\n', scanned);
    if (newline != std::string::npos || (at_end_ && !buffer_.empty())) {
      const size_t end = newline == std::string::npos ? buffer_.size() : newline;
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, std::min(end + 1, buffer_.size()));
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return std::optional<std::string>(std::move(line));
    }
    if (at_end_) return std::optional<std::string>();
    if (buffer_.size() > kMaxInputBytes) return too_long("standard input (one line)");
    scanned = buffer_.size();
    if (wake_fd >= 0) {
      pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      int ready;
      do {
        ready = ::poll(fds, 2, -1);
      } while (ready < 0 && errno == EINTR);
      if (ready < 0) return Status::runtime("standard input: poll: " + io::errno_text(errno));
      if (fds[1].revents != 0) return std::optional<std::string>();
    }
    KTIER_ASSIGN_OR_RETURN(const size_t n, read_some(STDIN_FILENO, buffer_, "standard input"));
    at_end_ = n == 0;
  }
}

Status check_ids_given(const std::string& s, const std::string& flag) {
  if (s.find_first_not_of(" \t") != std::string::npos) return Status::ok();
  return Status::usage(flag + " is empty: give at least one token id (e.g. " + flag +
                       " 19180,2695)");
}

Result<std::vector<uint32_t>> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<uint32_t> ids;
  if (s.find_first_not_of(" \t") == std::string::npos) return ids;
  size_t pos = 0;
  while (true) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string raw = s.substr(pos, comma - pos);
    const size_t a = raw.find_first_not_of(" \t"), b = raw.find_last_not_of(" \t");
    const std::string item = a == std::string::npos ? "" : raw.substr(a, b - a + 1);
    uint64_t v = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || v > 0xFFFFFFFFull) {
      return Status::usage(flag + ": '" + item + "' is not a token id (expected e.g. " + flag +
                           " 19180,2695)");
    }
    ids.push_back(static_cast<uint32_t>(v));
    if (comma == s.size()) return ids;
    pos = comma + 1;
  }
}

Result<std::vector<int32_t>> ids_in_vocab(const std::vector<uint32_t>& raw, int64_t vocab,
                                          IdSource source) {
  std::vector<int32_t> ids;
  for (uint32_t v : raw) {
    if (v >= vocab) {
      const std::string range = " is outside the vocabulary 0.." + std::to_string(vocab - 1);
      if (source == IdSource::kCommandLine)
        return Status::usage("--ids: token id " + std::to_string(v) + range);
      return Status::corrupt("the tokenizer's id " + std::to_string(v) + range +
                             " of config.json (tiktoken.model / tokenizer_config.json and "
                             "config.json's vocab_size disagree)");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

namespace {

// `path` with dangling symlinks followed to the file they would create, then made canonical as
// far as it exists; `ec` set when that fails.
std::filesystem::path resolve_output(const std::string& path, std::error_code& ec) {
  // Absolute first: weakly_canonical leaves a bare relative name of a missing file relative, so
  // "out.json" and "./out.json" would differ.
  const std::filesystem::path p = std::filesystem::absolute(io::follow_dangling_symlinks(path), ec);
  return ec ? p : std::filesystem::weakly_canonical(p, ec);
}

// The names of the files `run`, `eval` and the benches read from a model or pack folder.
bool is_model_or_pack_file_name(const std::string& name) {
  for (const char* own : {"config.json", "generation_config.json", "tiktoken.model",
                          "tokenizer_config.json", pack::kManifestFileName, pack::kPackFileName})
    if (name == own) return true;
  const auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".safetensors") || ends_with(".safetensors.index.json");
}

}  // namespace

Status check_output_is_not_input(const std::string& flag, const std::string& output,
                                 std::initializer_list<InputPath> inputs) {
  if (output.empty()) return Status::ok();
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out = resolve_output(output, ec);
  if (ec) return Status::ok();  // unresolvable: opening it reports the problem
  const fs::file_status out_status = fs::status(out, ec);
  // A device or FIFO (/dev/null for two outputs) holds nothing a write could overwrite.
  if (fs::exists(out_status) && !fs::is_regular_file(out_status) && !fs::is_directory(out_status))
    return Status::ok();
  const bool out_exists = fs::exists(out_status);
  // Another name of the same file (a hard link): the same device and inode.
  const auto same_file = [&](const fs::path& p) {
    std::error_code e;
    return out_exists && fs::equivalent(out, p, e) && !e;
  };
  for (const InputPath& in : inputs) {
    if (in.path.empty()) continue;
    const fs::path p = resolve_output(in.path, ec);
    if (ec) continue;
    const bool same = out == p || same_file(p);
    // An existing file of the folder that ktier reads (inside it by path and named like a model
    // or pack file), or another name of any of its files. A new file there, or one of the user's
    // own (a report beside the model, written again by a rerun), harms nothing.
    bool inside = false;
    if (in.folder && out_exists && !same) {
      inside = std::mismatch(p.begin(), p.end(), out.begin(), out.end()).first == p.end() &&
               is_model_or_pack_file_name(out.filename().string());
      std::error_code e;
      for (fs::directory_iterator it(p, e), end; !inside && !e && it != end; it.increment(e))
        inside = it->path() != out && same_file(it->path());  // not the output's own entry
    }
    if (same || inside)
      return Status::usage(flag + " " + output + (same ? " is also given as " : " is inside ") +
                           in.flag + " " + in.path + ": writing it would overwrite what the " +
                           "command uses; give another path");
  }
  return Status::ok();
}

void warn_past_trained_positions(const format::ModelConfig& config, int64_t last_position,
                                 const std::string& what) {
  const auto limit = config.max_position_embeddings;
  if (!limit || last_position < *limit) return;
  spdlog::warn("{} runs positions up to {}, past max_position_embeddings = {} of config.json: "
               "positions from {} on were not trained",
               what, last_position, *limit, *limit);
}

Status caches_refused_as_budget(const Status& s, const std::string& hint) {
  return s.is_out_of_memory() ? Status::budget(s.message() + "; " + hint) : s;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  return line;
}

void add_memory_options(CLI::App* sub, MemoryArgs& a) {
  sub->add_option("--pack", a.pack,
                  "Trunk pack made by `ktier pack`: layers stream with one read each, checksummed");
  sub->add_option("--ram", a.ram,
                  "Memory budget (e.g. 8G = 8 GiB, 512M, 8GB = 8e9 bytes) for the trunk and the "
                  "expert RAM tier: a prefix of layers is pinned, the rest streams; below the "
                  "minimum the run is refused (exit 4); a plan holding more than 90% of "
                  "MemAvailable is made again to fit (a warning). Without --pack streamed layers "
                  "are read from the shards; GPU mode always has one (default there: --preset "
                  "auto)");
  auto* preset = sub->add_option(
      "--preset", a.preset,
      "Memory budget by name: laptop (8G), desktop (32G), workstation (96G), server (128G), max "
      "(everything), auto (55% of MemTotal, at most 90% of MemAvailable and MemAvailable less "
      "2 GiB, or less half of it below 4 GiB: `ktier doctor` shows it; below a run's minimum, "
      "90% of MemAvailable, with a warning); as with --ram, a plan holding more than 90% of "
      "MemAvailable is made again to fit (a warning)");
  preset->excludes(sub->get_option("--ram"));
  sub->add_option("--io", a.io,
                  "Read engine with --pack/--ram/--preset or in GPU mode: auto, uring or pread")
      ->capture_default_str();
  add_rate_limit_option(sub, a.io_rate_limit_mb_s,
                        "Only with --pack/--ram/--preset or in GPU mode (a memory-mapped "
                        "checkpoint ignores it, with a warning)");
  sub->add_option("--device", a.device,
                  "auto (the GPU when the CUDA module finds one, else the CPU, saying why), cpu, "
                  "cuda (exit 2 when it cannot be used), or emulated (GPU mode's placement on the "
                  "CPU kernels: same output as cpu; needs --vram)")
      ->capture_default_str();
  sub->add_option("--vram", a.vram,
                  "Device memory for everything on the GPU: the sequence's working set (sized for "
                  "the positions planned: run's -c, auto or given (see -c); eval's ids; "
                  "serve's -c), the trunk and the VRAM expert tier (e.g. 40G); default 90% of the "
                  "GPU's free memory; ignored on the CPU");
  sub->add_option("--gpu-prefill", a.gpu_prefill,
                  "GPU matrix products of 8 or more tokens: fused (ktier's kernels: the output "
                  "does not depend on how the prompt is chunked) or cublas (F32/BF16 weights "
                  "through cuBLAS: faster on long prompts, output bytes that change with "
                  "--chunk, within NUMERICS.md's bounds); cublas is ignored (with a warning) on "
                  "the CPU and the emulated device")
      ->check(CLI::IsMember({"fused", "cublas"}))
      ->capture_default_str();
}

void add_model_option(CLI::App* sub, std::string& model) {
  sub->add_option("-m,--model", model, "Model folder (config.json + safetensors)")->required();
}

void add_isa_option(CLI::App* sub, std::string& isa) {
  sub->add_option("--isa", isa, "CPU kernels: auto, scalar, avx2 or avx512 (same output bytes)")
      ->capture_default_str();
}

CLI::Option* add_threads_option(CLI::App* sub, int& threads, const std::string& help, int min) {
  const std::string range = ", " + std::to_string(min) + ".." + std::to_string(cpu::kMaxThreads) +
                            (min == 0 ? " (0 = one per hardware thread)" : "");
  return sub->add_option("-t,--threads", threads, help + range)
      ->check(CLI::Range(min, cpu::kMaxThreads))
      ->capture_default_str();
}

namespace {

// The transform read_numbers_as_written gives an option of CLI11 type `type` (INT, UINT, FLOAT).
CLI::Validator number_as_written(const std::string& type) {
  return CLI::Validator(
      [type](std::string& v) -> std::string {
        if (v.empty()) return {};  // refused by name in main, as for every option
        if (type == "FLOAT") {
          const char* begin = v.c_str();
          char* end = nullptr;
          errno = 0;
          const double x = std::strtod(begin, &end);
          if (end == begin || *end != '\0') return {};  // CLI11 says it is not a number
          // ERANGE with a subnormal result is a value a double holds: only 0 and inf are not.
          if (errno == ERANGE && (x == 0 || std::isinf(x)))
            return "'" + v + "' is " + (x == 0 ? "too small" : "too large") + " for a double" +
                   (x == 0 ? " (give 0 where 0 is meant)" : "");
          return {};
        }
        // As strtoll took them: spaces around the number, a '+'.
        const size_t first = v.find_first_not_of(" \t"), last = v.find_last_not_of(" \t");
        std::string number = first == std::string::npos ? "" : v.substr(first, last - first + 1);
        if (!number.empty() && number[0] == '+') number.erase(0, 1);
        const bool is_signed = type == "INT";
        const size_t sign = is_signed && !number.empty() && number[0] == '-' ? 1 : 0;
        if (number.size() == sign ||
            number.find_first_not_of("0123456789", sign) != std::string::npos)
          return "'" + v + "' is not a whole number in decimal" +
                 std::string(is_signed ? "" : " (0 or more)");
        const char* const begin = number.data();
        const char* const end = begin + number.size();
        // Rewritten in canonical decimal: "010" is ten, as written, not CLI11's octal eight.
        const auto canonical = [&](auto x, const std::string& range) -> std::string {
          const auto [stop, ec] = std::from_chars(begin, end, x);
          if (ec != std::errc() || stop != end)
            return "'" + v + "' is out of range (" + range + ")";
          v = std::to_string(x);
          return {};
        };
        return is_signed ? canonical(int64_t{0}, std::to_string(INT64_MIN) + ".." +
                                                     std::to_string(INT64_MAX))
                         : canonical(uint64_t{0}, "0.." + std::to_string(UINT64_MAX));
      },
      "", "number as written");
}

}  // namespace

void read_numbers_as_written(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_items_expected_min() == 0) continue;  // a flag
    std::string type = opt->get_type_name();
    type = type.substr(0, type.find(':'));  // past ':' are its validators' descriptions
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    try {
      opt->get_validator("whole number");
      continue;  // checked by whole_number already (and -s/--seed's -1)
    } catch (const CLI::OptionNotFound&) {
    }
    opt->transform(number_as_written(type));
  }
  for (CLI::App* sub : app.get_subcommands({})) read_numbers_as_written(*sub);
}

CLI::Option* add_seed_option(CLI::App* sub, uint64_t& seed, const std::string& help,
                             bool random_allowed) {
  CLI::Option* o = sub->add_option("-s,--seed", seed, help);
  // llama.cpp's -1 (random) where allowed; the default shows as -1 too.
  o->transform(CLI::Validator(
      // Where -1 is the random seed, its bits (UINT64_MAX) are no seed of their own.
      [random_allowed, whole = whole_number<uint64_t>(random_allowed ? runtime::kRandomSeed - 1
                                                                      : runtime::kRandomSeed)](
          std::string& v) -> std::string {
        if (random_allowed && v == "-1") {
          v = std::to_string(runtime::kRandomSeed);
          return {};
        }
        std::string error = whole(v);
        if (!error.empty() && random_allowed) error += ", or -1 (random)";
        return error;
      },
      "", "whole number"));
  if (random_allowed && seed == runtime::kRandomSeed)
    o->default_str("-1");
  else
    o->capture_default_str();
  return o;
}

void add_sampling_options(CLI::App* sub, runtime::SamplingParams& sampling, bool for_requests) {
  // A request's field of the same meaning, named where the flag is its default.
  const auto help = [&](const std::string& text, const char* field) {
    return for_requests ? "For a request that gives no " + std::string(field) + ": " + text
                        : text;
  };
  sub->add_option("--temp", sampling.temperature,
                  help(for_requests ? "Temperature, OpenAI's default 1; 0 = greedy"
                                    : "Sampling temperature; 0 = greedy",
                       "temperature"))
      ->capture_default_str();
  sub->add_option("--top-k", sampling.top_k,
                  help("Keep the K most likely tokens; 0 = off", "top_k"))
      ->capture_default_str();
  sub->add_option("--top-p", sampling.top_p,
                  help("Nucleus sampling threshold; 1 = off, 0 keeps the most likely token",
                       "top_p"))
      ->capture_default_str();
  sub->add_option("--min-p", sampling.min_p,
                  help("Keep tokens at least this fraction as likely as the likeliest (after "
                       "--top-p); 0 = off",
                       "min_p"))
      ->capture_default_str();
  add_seed_option(sub, sampling.seed,
                  help(for_requests ? "Sampling seed (same seed, same tokens); -1 = a new "
                                      "random one for each request"
                                    : "Sampling seed (same seed, same tokens); -1 = a random "
                                      "one, logged when sampling (--temp > 0) and in "
                                      "--report-json",
                       "seed"),
                  /*random_allowed=*/true);
  sub->add_option("--repeat-penalty", sampling.repeat_penalty,
                  help("Divide the logit of each id among the last --repeat-last-n by this "
                       "(multiply a negative one); 1 = off",
                       "repeat_penalty"))
      ->capture_default_str();
  sub->add_option("--repeat-last-n", sampling.repeat_last_n,
                  help("Ids of the sequence (prompt and answer) the penalties look back at; "
                       "0 = none, -1 = all",
                       "repeat_last_n"))
      ->capture_default_str();
  sub->add_option("--presence-penalty", sampling.presence_penalty,
                  help("Subtract this from the logit of each id among the last --repeat-last-n; "
                       "0 = off",
                       "presence_penalty"))
      ->capture_default_str();
  sub->add_option("--frequency-penalty", sampling.frequency_penalty,
                  help("Subtract this times the id's count among the last --repeat-last-n; "
                       "0 = off",
                       "frequency_penalty"))
      ->capture_default_str();
}

void add_rate_limit_option(CLI::App* sub, double& mb_s, const std::string& scope) {
  sub->add_option("--io-rate-limit", mb_s,
                  "Cap the read rate of the streamed trunk and experts at this many MB/s (1 MB = 1e6 "
                  "bytes; e.g. 3000 emulates a 3 GB/s disk); 0 = no cap. " + scope);
}

Result<uint64_t> rate_limit_bytes_per_s(double mb_s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", mb_s);
  if (!(mb_s >= 0) || !std::isfinite(mb_s))
    return Status::usage(std::string("--io-rate-limit: ") + text + " is not a rate in MB/s");
  if (mb_s > 1e9)
    return Status::usage(std::string("--io-rate-limit: ") + text +
                         " MB/s is above 1e9 MB/s (1 PB/s), past any disk (0 = no cap)");
  // 0 is "no cap": a positive rate below a byte per second must not silently become it.
  if (mb_s > 0 && mb_s * 1e6 < 1)
    return Status::usage(std::string("--io-rate-limit: ") + text +
                         " MB/s is below 1 byte per second (0 = no cap)");
  return static_cast<uint64_t>(mb_s * 1e6);
}

Status apply_memory_options(const MemoryArgs& a, runtime::EngineOptions& eo) {
  if (!a.pack.empty()) eo.pack_dir = a.pack;
  if (!a.ram.empty()) {
    KTIER_ASSIGN_OR_RETURN(const uint64_t bytes, parse_size(a.ram, "--ram"));
    eo.ram_budget = bytes;
  }
  if (a.preset == "auto") {
    eo.auto_budget = true;  // the dial reads MemAvailable (and may raise it: plan_engine)
  } else if (!a.preset.empty()) {
    KTIER_ASSIGN_OR_RETURN(const uint64_t bytes, runtime::preset_budget_bytes(a.preset));
    eo.ram_budget = bytes;
  }
  KTIER_ASSIGN_OR_RETURN(eo.io.backend, io::parse_io_backend(a.io));
  KTIER_ASSIGN_OR_RETURN(eo.io.rate_limit_bytes_per_s, rate_limit_bytes_per_s(a.io_rate_limit_mb_s));
  if (!a.vram.empty()) {
    KTIER_ASSIGN_OR_RETURN(const uint64_t bytes, parse_size(a.vram, "--vram"));
    eo.vram_budget = bytes;
  }
  KTIER_ASSIGN_OR_RETURN(const backend::DeviceRequest request,
                         backend::parse_device_request(a.device));
  // --device cpu never loads the CUDA module (nor the CUDA runtime inside it).
  const bool probe = request == backend::DeviceRequest::kAuto ||
                     request == backend::DeviceRequest::kCuda;
  const Result<backend::CudaModuleProbe> module =
      probe ? backend::probe_cuda_module()
            : Result<backend::CudaModuleProbe>(Status::runtime("not probed"));
  KTIER_ASSIGN_OR_RETURN(const backend::DeviceChoice choice,
                         backend::choose_device(request, module));
  eo.device = choice.kind;
  eo.emulate_device = choice.emulated;
  eo.device_auto = request == backend::DeviceRequest::kAuto;
  if (request != backend::DeviceRequest::kCpu) spdlog::info("device: {}", choice.reason);
  if (eo.device == backend::DeviceKind::kCpu && !eo.emulate_device && eo.vram_budget)
    spdlog::warn("--vram {} ignored: decoding on the CPU", a.vram);
  eo.cublas_prefill = a.gpu_prefill == "cublas";
  if (eo.cublas_prefill && eo.device != backend::DeviceKind::kCuda)
    spdlog::warn("--gpu-prefill cublas ignored: decoding on the {}",
                 eo.emulate_device ? "emulated device (the CPU kernels)" : "CPU");
  return Status::ok();
}

std::string llama_cpp_flag_problem(int argc, const char* const* argv,
                                   const std::function<bool(std::string_view)>& takes_value) {
  static const std::pair<const char*, const char*> kFlags[] = {
      {"-ngl", "ktier places the trunk and experts by --vram (GPU mode starts by itself)"},
      {"--n-gpu-layers", "ktier places the trunk and experts by --vram (GPU mode starts by itself)"},
      {"-cnv", "--chat -i"},
      {"--conversation", "--chat -i"},
      {"-fa", "none: the attention kernels are fixed"},
      {"--flash-attn", "none: the attention kernels are fixed"},
      {"-sp", "--special"},
      {"-np", "none: serve answers one request at a time"},
      {"--parallel", "none: serve answers one request at a time"},
      {"-ctk", "none: the cache is f32 (docs/NUMERICS.md)"},
      {"-ctv", "none: the cache is f32 (docs/NUMERICS.md)"},
      {"-sys", "none: --chat sends one user message"},
      {"--system-prompt", "none: --chat sends one user message"},
      {"-tb", "-t"},
      {"-ub", "--chunk"},
      {"-ot", "--vram and --ram (strata places experts by use)"},
      {"--override-tensor", "--vram and --ram (strata places experts by use)"},
      {"-hf", "-m DIR (a local folder)"},
      {"-co", "none"},
      {"--temperature", "--temp"},
      // One dash and several letters: CLI11 would read these as bundles of one-letter flags
      // (-no-cnv as -n "o-cnv") and blame another flag.
      {"-no-cnv", "none: run without -i makes one generation"},
      {"--no-conversation", "none: run without -i makes one generation"},
      {"-st", "--chat (one message; --chat -i for a conversation)"},
      {"--single-turn", "--chat (one message; --chat -i for a conversation)"},
      {"-if", "--chat -i"},
      {"--interactive-first", "--chat -i"},
      {"-mli", "none: -i reads one message per line"},
      {"--multiline-input", "none: -i reads one message per line"},
      {"-cmoe", "--ram and --vram (strata places experts by use)"},
      {"--cpu-moe", "--ram and --vram (strata places experts by use)"},
      {"-ncmoe", "--ram and --vram (strata places experts by use)"},
      {"--n-cpu-moe", "--ram and --vram (strata places experts by use)"},
      {"-nkvo", "--vram (GPU mode places the cache by it)"},
      {"--no-kv-offload", "--vram (GPU mode places the cache by it)"},
      {"-dev", "--device auto|cpu|cuda"},
      {"-mg", "none: GPU mode uses device 0"},
      {"-sm", "none: GPU mode uses one device"},
      {"-ts", "none: GPU mode uses one device"},
      {"-md", "none: no speculative decoding"},
      {"-ps", "none: no speculative decoding"},
      {"-cb", "none: serve answers one request at a time"},
      {"-nr", "none"},
      {"-dt", "none"}};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is not options
    const std::string_view prev = i > 1 ? argv[i - 1] : "";
    if (prev.size() > 1 && prev[0] == '-' && takes_value(prev)) continue;  // e.g. -f -co
    for (const auto& [flag, here] : kFlags) {
      const std::string_view f = flag;
      const bool with_value = arg.size() > f.size() && arg.substr(0, f.size()) == f &&
                              arg[f.size()] == '=';
      if (arg != f && !with_value) continue;
      return "'" + std::string(arg) + "' is llama.cpp's flag; ktier's equivalent: " + here +
             " (ktier COMMAND --help lists the flags)";
    }
  }
  return "";
}

std::string empty_list_value_problem(int argc, const char* const* argv,
                                     const std::function<bool(std::string_view)>& takes_value,
                                     const std::function<char(std::string_view)>& delimiter_of) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string_view prev = i > 1 ? argv[i - 1] : "";
    if (prev.size() > 1 && prev[0] == '-' && takes_value(prev)) continue;  // e.g. -p --stop-id=
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    const char delimiter = delimiter_of(name);
    if (delimiter == '\0') continue;
    if (eq == std::string_view::npos && i + 1 >= argc) continue;  // CLI11 says it lacks one
    const std::string_view value = eq == std::string_view::npos ? argv[i + 1] : arg.substr(eq + 1);
    if (value.find_first_not_of(delimiter) == std::string_view::npos)
      return std::string(name) + ": empty value (give one, or leave the option out)";
  }
  return "";
}

void ignore_sigpipe() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

Status write_stdout(const std::string& s) {
  if (s.empty()) return Status::ok();
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    return Status::runtime("error writing standard output: " + io::errno_text(errno));
  return Status::ok();
}

Result<runtime::EngineOptions> model_engine_options(const std::string& model, int threads,
                                                    std::optional<cpu::Isa> isa,
                                                    const MemoryArgs& memory,
                                                    const StrataArgs& strata) {
  runtime::EngineOptions eo;
  eo.model_dir = model;
  eo.threads = threads;
  eo.isa = isa;
  KTIER_RETURN_IF_ERROR(apply_memory_options(memory, eo));
  KTIER_RETURN_IF_ERROR(apply_strata_options(strata, eo));
  return eo;
}

}  // namespace ktier::cli
