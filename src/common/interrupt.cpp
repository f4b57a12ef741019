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
// The wake pipe lives as long as the process (made by the first request, drained by the next):
// a handler on another thread that passed the g_active check as a request ended may still
// write its byte, and never into a descriptor closed and reused since.
int g_wake_read = -1;                  // owner thread only
std::atomic<int> g_wake_write{-1};
struct sigaction g_previous;
bool g_installed = false;  // owner thread only

static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<const char*>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);

void on_sigint(int) {
  // The previous disposition first: a second Ctrl-C, even one during this handler, acts as if
  // ktier had installed nothing.
  const int saved_errno = errno;
  ::sigaction(SIGINT, &g_previous, nullptr);
  errno = saved_errno;
  InterruptRequest::request_from_signal_handler();
}

}  // namespace

bool InterruptRequest::request_from_signal_handler() {
  if (!g_active.load()) return false;
  const int saved_errno = errno;
  // One exchange: of two signals handled at once on two threads, one sees the other's.
  if (g_requested.exchange(true)) {
    errno = saved_errno;
    return true;
  }
  if (const char* notice = g_notice.load()) {
    ssize_t ignored = ::write(STDERR_FILENO, notice, std::strlen(notice));
    (void)ignored;
  }
  if (const int fd = g_wake_write.load(); fd >= 0) {
    const char byte = 1;
    ssize_t ignored = ::write(fd, &byte, 1);  // full pipe: already readable
    (void)ignored;
  }
  errno = saved_errno;
  return false;
}

namespace {
// Empties the wake pipe: a byte a handler wrote for an earlier request, or for this one.
void drain_wake_pipe() {
  char drain[64];
  if (g_wake_read >= 0)
    while (::read(g_wake_read, drain, sizeof drain) > 0) {
    }
}
}  // namespace

InterruptRequest::InterruptRequest(const char* notice) {
  KTIER_CHECK(!g_active.exchange(true));
  g_notice.store(notice);
  g_requested.store(false);
  if (g_wake_read < 0) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
      g_wake_read = fds[0];
      g_wake_write.store(fds[1]);
    }
  }
  drain_wake_pipe();
  install();
}

InterruptRequest::~InterruptRequest() {
  if (g_installed) {
    // Still ours unless a Ctrl-C already put the previous one back: either way, the previous.
    ::sigaction(SIGINT, &g_previous, nullptr);
    g_installed = false;
  }
  g_active.store(false);
  g_notice.store(nullptr);
  g_requested.store(false);
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

int InterruptRequest::wake_fd() const { return g_wake_read; }

void InterruptRequest::set_notice(const char* notice) { g_notice.store(notice); }

void InterruptRequest::rearm() {
  g_requested.store(false);
  drain_wake_pipe();
  install();
}

}  // namespace ktier
