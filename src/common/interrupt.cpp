#include "common/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/check.h"

namespace ktier {
namespace {

// Lock-free atomics and write()/sigaction() only: what a signal handler may touch.
std::atomic<bool> g_requested{false};
std::atomic<const char*> g_notice{nullptr};
std::atomic<bool> g_active{false};
int g_wake[2] = {-1, -1};  // set before the handler is installed, closed after it is removed
struct sigaction g_previous;
bool g_installed = false;  // owner thread only

static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<const char*>::is_always_lock_free);

void on_sigint(int) {
  // The previous disposition first: a second Ctrl-C, even one during this handler, acts as if
  // ktier had installed nothing.
  const int saved_errno = errno;
  ::sigaction(SIGINT, &g_previous, nullptr);
  errno = saved_errno;
  InterruptRequest::request_from_signal_handler();
}

}  // namespace

void InterruptRequest::request_from_signal_handler() {
  if (!g_active.load()) return;
  const int saved_errno = errno;
  g_requested.store(true);
  if (const char* notice = g_notice.load()) {
    ssize_t ignored = ::write(STDERR_FILENO, notice, std::strlen(notice));
    (void)ignored;
  }
  if (g_wake[1] >= 0) {
    const char byte = 1;
    ssize_t ignored = ::write(g_wake[1], &byte, 1);  // full pipe: already readable
    (void)ignored;
  }
  errno = saved_errno;
}

InterruptRequest::InterruptRequest(const char* notice) {
  KTIER_CHECK(!g_active.exchange(true));
  g_notice.store(notice);
  g_requested.store(false);
  if (::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) g_wake[0] = g_wake[1] = -1;
  install();
}

InterruptRequest::~InterruptRequest() {
  if (g_installed) {
    // Still ours unless a Ctrl-C already put the previous one back: either way, the previous.
    ::sigaction(SIGINT, &g_previous, nullptr);
    g_installed = false;
  }
  for (int& fd : g_wake) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  g_notice.store(nullptr);
  g_requested.store(false);
  g_active.store(false);
}

void InterruptRequest::install() {
  struct sigaction current;
  if (::sigaction(SIGINT, nullptr, &current) != 0) return;
  // Ignored (a background job of a script, nohup): it stays ignored, as the caller asked.
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: the I/O and compute threads it may land on go on as if nothing happened (a
  // wait that still returns EINTR, poll or io_uring_enter, is retried where it is made).
  sa.sa_flags = SA_RESTART;
  if (!g_installed) g_previous = current;
  g_installed = ::sigaction(SIGINT, &sa, nullptr) == 0 || g_installed;
}

bool InterruptRequest::requested() { return g_requested.load(); }

int InterruptRequest::wake_fd() const { return g_wake[0]; }

void InterruptRequest::set_notice(const char* notice) { g_notice.store(notice); }

void InterruptRequest::rearm() {
  g_requested.store(false);
  char drain[64];
  if (g_wake[0] >= 0)
    while (::read(g_wake[0], drain, sizeof drain) > 0) {
    }
  install();
}

}  // namespace ktier
