#pragma once
// The fixture of the `ktier serve` tests over HTTP (serve_test.cpp, serve_cache_test.cpp): the
// tiny model synthesized once, servers started on a free port, clients of them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/child_process.h"
#include "common/run_process.h"
#include "common/test_paths.h"

namespace ktier::test {

namespace fs = std::filesystem;

class ServeCli : public ::testing::Test {
 protected:
  using Stream = ChildProcess::Stream;

  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ktier-serve-" + std::to_string(::getpid()));
    const auto r = run_process(ktier_bin().string() +
                               " synth --preset tiny --seed 0 -q --force -o " +
                               (dir_ / "model").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Starts `ktier serve` on a free port; the port it printed (0 when it did not start).
  static int start(ChildProcess& server) {
    if (!server.started() || !server.wait_for(Stream::kErr, "Ctrl-C stops")) return 0;
    std::smatch m;
    const std::string err = server.err();
    if (!std::regex_search(err, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)"))) return 0;
    return std::stoi(m[1].str());
  }
  // The port a "listening on" line names (0 when there is none yet).
  static int listening_port(const std::string& err) {
    std::smatch m;
    if (!std::regex_search(err, m, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)")))
      return 0;
    return std::stoi(m[1].str());
  }
  // A copy of the model (symlinks) whose first shard is cut to 1,000 bytes: it passes the
  // checks before the load and fails the load (exit 3). The shard's name in `shard`.
  static fs::path broken_model(const std::string& name, std::string* shard = nullptr) {
    const fs::path broken = dir_ / name;
    fs::create_directories(broken);
    bool cut = false;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "model")) {
      const std::string file = e.path().filename().string();
      if (!cut && file.rfind("model-", 0) == 0 && file.find(".safetensors") != file.npos) {
        cut = true;
        if (shard) *shard = file;
        fs::copy_file(e.path(), broken / file);
        fs::resize_file(broken / file, 1000);
      } else {
        fs::create_symlink(e.path(), broken / file);
      }
    }
    EXPECT_TRUE(cut);
    return broken;
  }
  // A TCP connection to 127.0.0.1:`port` (a raw client); -1 when it cannot be made.
  static int connect_to(int port) {
    const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
    if (sock < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return sock;
    ::close(sock);
    return -1;
  }
  // A fixed default seed (serve's own is random for each request): the tests that wait for an
  // answer to run long (a client leaving mid-answer) see it take the same course every run; a
  // drawn seed could stop a prompt at its first token.
  static std::vector<std::string> serve_argv(const fs::path& model) {
    return {ktier_bin().string(), "serve", "-m", model.string(), "--port", "0", "--threads", "2",
            "--alias", "tiny-test", "--seed", "0"};
  }
  // A client of the server on `port`, waiting up to 120 s for an answer (the tiny model's are
  // quick; a loaded CI machine is not).
  static httplib::Client client_at(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120, 0);
    return client;
  }
  // Waits (up to 60 s) until the /metrics of a server started with --metrics on `port` shows
  // `line` (a request generating, one waiting): a loaded machine may take long to start a
  // request. False when it did not.
  static bool metric_shown(int port, const std::string& line) {
    httplib::Client metrics = client_at(port);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto res = metrics.Get("/metrics");
      if (res && res->body.find(line + "\n") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  static inline fs::path dir_;
};

}  // namespace ktier::test
