#pragma once
// Runs a shell command for CLI tests and captures its exit code, stdout and stderr.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace ktier::test {

struct ProcessResult {
  int exit_code = -1;  // the process's exit status; 128+N when killed by signal N
  std::string out;
  std::string err;
};

// The whole of a file a command wrote (empty when it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Token ids as the CLI reads and prints them (--ids, --print-ids): "1,2,3".
inline std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}
// `n` ids 1 + 7i mod 300, i = 0..n-1: a prompt that wanders over tiny's vocabulary (its first
// 24 already route to every one of tiny's experts), as --ids text.
inline std::string spread_ids(int n) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = 1 + i * 7 % 300;
  return join_ids(ids);
}
inline std::vector<int> split_ids(const std::string& line) {
  std::vector<int> ids;
  std::stringstream in(line);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoi(item));
  return ids;
}

// The last line of a command's output, without its newline.
inline std::string last_line(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

// `command` is passed to /bin/sh. stderr is captured through a temporary file.
inline ProcessResult run_process(const std::string& command) {
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("ktier_test_stderr_" + std::to_string(::getpid()) + ".txt");
  ProcessResult r;
  FILE* pipe = ::popen((command + " 2>" + err_path.string()).c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

}  // namespace ktier::test
