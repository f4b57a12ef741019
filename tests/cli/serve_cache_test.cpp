// `ktier serve --cache-ram` over HTTP: an earlier conversation's sequence kept in RAM, what the
// log and /metrics say of it, and where it is not used.
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve_cli_fixture.h"

namespace ktier::test {
namespace {

// --cache-ram keeps an earlier conversation's sequence: the next request of it reuses its
// prompt (usage and /metrics say so); the log says how many fit, or that none does; GPU mode
// (here the emulated device) ignores it with a warning.
TEST_F(ServeCli, CacheRamKeepsAnEarlierSequence) {
  std::vector<std::string> argv = serve_argv(dir_ / "model");
  argv.insert(argv.end(), {"--cache-ram", "64M", "--metrics"});
  ChildProcess server(argv);
  const int port = start(server);
  ASSERT_GT(port, 0) << server.err();
  EXPECT_NE(server.err().find("--cache-ram 64.00 MiB: up to "), std::string::npos)
      << server.err();
  httplib::Client client = client_at(port);
  const auto complete = [&](const std::string& prompt, int max_tokens) -> nlohmann::json {
    const auto r = client.Post("/v1/completions",
                               nlohmann::json{{"prompt", prompt}, {"max_tokens", max_tokens},
                                              {"temperature", 0}}
                                   .dump(),
                               "application/json");
    if (!r || r->status != 200) return {};
    return nlohmann::json::parse(r->body);
  };
  const nlohmann::json a = complete("The lighthouse keeper", 1);
  ASSERT_FALSE(a.is_null());
  ASSERT_FALSE(complete("Seven ships sailed", 1).is_null());
  const nlohmann::json a_next = complete("The lighthouse keeper checked the lamp", 3);
  ASSERT_FALSE(a_next.is_null());
  EXPECT_EQ(a_next["usage"]["prompt_tokens_details"]["cached_tokens"],
            a["usage"]["prompt_tokens"]);
  EXPECT_TRUE(metric_shown(port, "ktier:kept_sequence_hits_total 1"));
  EXPECT_TRUE(server.wait_for(Stream::kErr, " reused from a kept sequence)")) << server.err();
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(std::chrono::seconds(30)), 0) << server.err();

  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--cache-ram", "1K"},
        std::vector<std::string>{"--cache-ram", "64M", "--device", "emulated", "--vram", "1G"}}) {
    argv = serve_argv(dir_ / "model");
    argv.insert(argv.end(), flags.begin(), flags.end());
    ChildProcess other(argv);
    ASSERT_GT(start(other), 0) << other.err();
    EXPECT_NE(other.err().find(flags.size() == 2 ? "--cache-ram 1.00 KiB holds no sequence: each "
                                                   "takes "
                                                 : "--cache-ram ignored: GPU mode keeps one"),
              std::string::npos)
        << other.err();
    other.signal(SIGINT);
    EXPECT_EQ(other.wait(std::chrono::seconds(30)), 0) << other.err();
  }
}

}  // namespace
}  // namespace ktier::test
