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
