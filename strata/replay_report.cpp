// Replay output: table, CSV, JSON and the PNG plot through tools/plot_replay.py.
#include "strata/replay_report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "io/output_file.h"
#include "io/read_file.h"
#include "strata/budget.h"

extern char** environ;

namespace ktier::strata {
namespace {

// A private file without a name: created in the system's temporary folder and unlinked at
// once, reached by the plotting child through /dev/fd/N (inherited: no O_CLOEXEC), so nothing is
// left behind however the process ends. Closed by the destructor; move-only.
class AnonymousFile {
 public:
  static Result<AnonymousFile> create() {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    std::string name = ((ec ? std::filesystem::path("/tmp") : dir) / "ktier-plot-XXXXXX").string();
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
      const int err = errno;  // before the message's allocations
      return Status::runtime("--plot: cannot create a temporary file in " +
                             (ec ? std::string("/tmp") : dir.string()) + ": " +
                             std::strerror(err));
    }
    ::unlink(name.c_str());
    AnonymousFile f;
    f.fd_ = fd;
    return f;
  }
  AnonymousFile() = default;
  AnonymousFile(AnonymousFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  AnonymousFile& operator=(AnonymousFile&&) = delete;
  ~AnonymousFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  // The name this process and its children open it by.
  std::string path() const { return "/dev/fd/" + std::to_string(fd_); }
  // Everything written to it so far (by anyone), from the start.
  Result<std::string> read_all() const {
    return io::read_whole(fd_, "--plot: the drawn image", {uint64_t{1} << 30, &Status::runtime});
  }

 private:
  int fd_ = -1;
};

constexpr const char* kPython = "/usr/bin/python3";
// Exit status tools/plot_replay.py uses when matplotlib cannot be imported.
constexpr int kPlotExitNoMatplotlib = 3;

std::string pad(const std::string& s, size_t width, bool right) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

std::string percent(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f%%", 100.0 * rate);
  return buf;
}

}  // namespace

std::string format_replay_table(const std::vector<ReplayResult>& results, bool with_prefetch) {
  if (results.empty()) return "";
  const size_t memory_tiers = results.front().tiers.size() - 1;
  std::vector<std::string> head = {"policy", "budget", "slots", "hits", "hit rate"};
  if (memory_tiers > 1) {
    for (size_t i = 0; i < memory_tiers; ++i) head.push_back(results.front().tiers[i].name + " %");
  }
  head.push_back("bytes read");
  if (with_prefetch) {
    head.insert(head.end(), {"prefetched", "pf precision", "pf recall"});
  }
  head.push_back("seconds");
  std::vector<std::vector<std::string>> rows = {head};
  for (const ReplayResult& r : results) {
    std::vector<std::string> row = {std::string(policy_name(r.policy)), r.label};
    std::string slots;
    for (size_t i = 0; i < memory_tiers; ++i) {
      slots += (i ? "+" : "") + format_count(r.tiers[i].slots);
    }
    row.push_back(slots);
    row.push_back(format_count(r.hits));
    row.push_back(percent(r.hit_rate));
    if (memory_tiers > 1) {
      for (size_t i = 0; i < memory_tiers; ++i) row.push_back(percent(r.tiers[i].hit_rate_bytes));
    }
    row.push_back(format_bytes(r.bytes_read));
    if (with_prefetch) {
      row.push_back(format_count(r.prefetch.issued));
      row.push_back(percent(r.prefetch.precision));
      row.push_back(percent(r.prefetch.recall));
    }
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.3f", r.seconds);
    row.push_back(secs);
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(head.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t c = 0; c < rows[i].size(); ++c) {
      out += (c ? "  " : "") + pad(rows[i][c], width[c], /*right=*/c >= 2);
    }
    out += '\n';
    if (i == 0) {
      size_t total = 0;
      for (size_t w : width) total += w + 2;
      out += std::string(total - 2, '-') + '\n';
    }
  }
  return out;
}

Status write_replay_csv(const std::filesystem::path& path,
                        const std::vector<ReplayResult>& results) {
  std::ostringstream out;
  const size_t memory_tiers = results.empty() ? 0 : results.front().tiers.size() - 1;
  out << "policy,budget,total_bytes,total_slots,requests,hits,hit_rate,bytes_read";
  for (size_t i = 0; i < memory_tiers; ++i) {
    const std::string& n = results.front().tiers[i].name;
    out << ',' << n << "_bytes," << n << "_slots," << n << "_hits," << n << "_hit_rate_bytes";
  }
  out << ",prefetch_issued,prefetch_useful,prefetch_wasted_bytes,prefetch_precision,"
         "prefetch_recall,seconds\n";
  char buf[64];
  auto num = [&](double v) {
    std::snprintf(buf, sizeof(buf), "%.6f", v);
    return std::string(buf);
  };
  for (const ReplayResult& r : results) {
    uint64_t total_bytes = 0, total_slots = 0;
    for (size_t i = 0; i < memory_tiers; ++i) {
      total_bytes += r.tiers[i].capacity_bytes;
      total_slots += r.tiers[i].slots;
    }
    out << policy_name(r.policy) << ',' << r.label << ',' << total_bytes << ',' << total_slots
        << ',' << r.requests << ',' << r.hits << ',' << num(r.hit_rate) << ',' << r.bytes_read;
    for (size_t i = 0; i < memory_tiers; ++i) {
      const TierResult& t = r.tiers[i];
      out << ',' << t.capacity_bytes << ',' << t.slots << ',' << t.hits << ','
          << num(t.hit_rate_bytes);
    }
    out << ',' << r.prefetch.issued << ',' << r.prefetch.useful << ',' << r.prefetch.bytes_wasted
        << ',' << num(r.prefetch.precision) << ',' << num(r.prefetch.recall) << ','
        << num(r.seconds) << '\n';
  }
  return io::write_output_file(path.string(), out.str());
}

Status write_replay_json(const std::filesystem::path& path, const std::string& trace_name,
                         const TraceSummary& summary, const ReplayParams& params,
                         const std::vector<ReplayResult>& results) {
  using nlohmann::json;
  json root;
  root["trace"] = trace_name;
  root["summary"] = {{"steps", summary.steps},
                     {"requests", summary.requests},
                     {"tokens", summary.tokens},
                     {"distinct_keys", summary.distinct_keys},
                     {"hit_ceiling", summary.hit_ceiling},
                     {"hit_ceiling_rate", summary.hit_ceiling_rate}};
  root["params"] = {{"half_life_tokens", params.temperature.half_life_tokens},
                    {"admit_ratio", params.temperature.admit_ratio},
                    {"window_fraction", params.temperature.window_fraction},
                    {"min_window_slots", params.temperature.min_window_slots},
                    {"adapt_window", params.temperature.adapt_window},
                    {"lookahead_depth", params.lookahead_depth},
                    {"refresh", params.refresh}};
  json list = json::array();
  for (const ReplayResult& r : results) {
    json tiers = json::array();
    for (const TierResult& t : r.tiers) {
      tiers.push_back({{"name", t.name},
                       {"capacity_bytes", t.capacity_bytes},
                       {"slots", t.slots},
                       {"hits", t.hits},
                       {"requests", r.requests},
                       {"bytes_served", t.bytes_served},
                       {"hit_rate_bytes", t.hit_rate_bytes}});
    }
    json links = json::array();
    for (size_t i = 0; i < r.link_bytes.size(); ++i) {
      links.push_back(
          {{"from", r.tiers[i + 1].name},
           {"to", r.tiers[i].name},
           {"bytes", r.link_bytes[i]},
           {"bytes_per_token",
            summary.tokens ? static_cast<double>(r.link_bytes[i]) / summary.tokens : 0}});
    }
    list.push_back({{"policy", std::string(policy_name(r.policy))},
                    {"budget", r.label},
                    {"requests", r.requests},
                    {"hits", r.hits},
                    {"hit_rate", r.hit_rate},
                    {"bytes_requested", r.bytes_requested},
                    {"bytes_read", r.bytes_read},
                    {"tiers", tiers},
                    {"links", links},
                    {"prefetch",
                     {{"issued", r.prefetch.issued},
                      {"useful", r.prefetch.useful},
                      {"wasted", r.prefetch.wasted},
                      {"bytes_issued", r.prefetch.bytes_issued},
                      {"bytes_wasted", r.prefetch.bytes_wasted},
                      {"precision", r.prefetch.precision},
                      {"recall", r.prefetch.recall},
                      {"timeliness", r.prefetch.timeliness}}},
                    {"seconds", r.seconds}});
  }
  root["results"] = list;
  json quality = json::array();
  for (const PredictionQuality& q : summary.prediction) {
    quality.push_back({{"depth", q.depth},
                       {"recall", q.recall},
                       {"precision", q.precision},
                       {"predicted", q.predicted},
                       {"correct", q.correct}});
  }
  root["lookahead"] = quality;
  return io::write_output_file(path.string(), root.dump(2) + '\n');
}

std::filesystem::path find_plot_script() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
#ifdef KTIER_PLOT_SCRIPT
  candidates.emplace_back(KTIER_PLOT_SCRIPT);
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = exe.parent_path();
    for (const fs::path& base : {dir, dir.parent_path(), dir.parent_path() / "share" / "ktier"}) {
      candidates.push_back(base / "tools" / "plot_replay.py");
    }
  }
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p, ec)) return p;
  }
  return {};
}

Status plot_replay(const std::vector<ReplayResult>& results, const std::filesystem::path& png,
                   const std::string& title, double ceiling_rate) {
  if (::access(kPython, X_OK) != 0) {
    return Status::runtime(std::string("--plot needs ") + kPython +
                           " with matplotlib (install python3-matplotlib), which is missing");
  }
  const std::filesystem::path script = find_plot_script();
  if (script.empty()) {
    return Status::runtime(
        "--plot: tools/plot_replay.py was not found next to the ktier binary "
        "or in its source tree");
  }
  KTIER_ASSIGN_OR_RETURN(const AnonymousFile csv, AnonymousFile::create());
  KTIER_ASSIGN_OR_RETURN(const AnonymousFile image, AnonymousFile::create());
  KTIER_RETURN_IF_ERROR(write_replay_csv(csv.path(), results));
  char ceiling[32];
  std::snprintf(ceiling, sizeof(ceiling), "%.6f", ceiling_rate);
  std::vector<std::string> args = {kPython,      script.string(), csv.path(),
                                   image.path(), "--title",       title};
  if (ceiling_rate >= 0) args.insert(args.end(), {"--ceiling", ceiling});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return Status::runtime(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  pid_t pid = 0;
  const int spawn_error = posix_spawn(&pid, kPython, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  std::string output;
  if (spawn_error == 0) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) output.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(pipe_fds[0]);
  if (spawn_error != 0) {
    return Status::runtime(std::string("--plot: cannot run ") + kPython + ": " +
                           std::strerror(spawn_error));
  }
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    KTIER_ASSIGN_OR_RETURN(const std::string bytes, image.read_all());
    return io::write_output_file(png.string(), bytes);
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kPlotExitNoMatplotlib) {
    return Status::runtime("--plot needs matplotlib for " + std::string(kPython) +
                           " (install python3-matplotlib or `" + kPython +
                           " -m pip install matplotlib`): " + output);
  }
  return Status::runtime("--plot: " + script.string() + " failed: " + output);
}

}  // namespace ktier::strata
