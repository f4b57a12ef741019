#pragma once
// Sets SIGINT's disposition for the life of a test object and puts the previous one back after.
// A test that raises SIGINT sets it first: run from a script's background job (nohup, `&`) the
// process inherits SIGINT ignored, which InterruptRequest rightly leaves ignored.

#include <signal.h>

namespace ktier::test {

struct SigintDisposition {
  explicit SigintDisposition(void (*handler)(int)) {
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &saved);
  }
  ~SigintDisposition() { ::sigaction(SIGINT, &saved, nullptr); }
  SigintDisposition(const SigintDisposition&) = delete;
  SigintDisposition& operator=(const SigintDisposition&) = delete;
  struct sigaction saved {};
};

}  // namespace ktier::test
