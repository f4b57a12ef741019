#include "format/map_guard.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace ktier::format {
namespace {

// K3 ships 96 shards; a process may hold a few checkpoints (tests): 1024 is plenty.
constexpr int kSlots = 1024;
constexpr size_t kPathBytes = 480;

struct Region {
  std::atomic<uintptr_t> begin{0}, end{0};  // end != 0: the slot is live (published last)
  char path[kPathBytes] = {};
};
Region g_regions[kSlots];
std::mutex g_mu;  // serialises slot allocation (not taken by the handler)
struct sigaction g_previous;  // the SIGBUS action before ours, for faults that are not ours
char g_note[1024] = {};        // set_exit_note's line, valid while g_note_set
std::atomic<bool> g_note_set{false};

void put(const char* s) {
  const size_t n = std::strlen(s);
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(STDERR_FILENO, s + done, n - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

// Decimal text of v into buf (at least 21 bytes); async-signal-safe.
const char* decimal(uint64_t v, char* buf) {
  char* p = buf + 20;
  *p = '\0';
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  return p;
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
  // BUS_ADRERR: a page of a mapping whose file no longer backs it (shrunk) or could not be
  // read. Anything else (kill -BUS, hardware memory errors) is not ours to explain.
  for (int i = 0; info->si_code == BUS_ADRERR && i < kSlots; ++i) {
    const Region& r = g_regions[i];
    const uintptr_t end = r.end.load(std::memory_order_acquire);
    const uintptr_t begin = r.begin.load(std::memory_order_relaxed);
    if (end == 0 || at < begin || at >= end) continue;
    char num[21];
    put("ktier: error: ");
    put(r.path);
    put(": its bytes at offset ");
    put(decimal(at - begin, num));
    put(" can no longer be read (the file was truncated, replaced or became unreadable while "
        "ktier ran)\n");
    if (g_note_set.load(std::memory_order_acquire)) put(g_note);
    ::_exit(1);
  }
  // Not ours: hand the signal to the action installed before us (by default a core dump). A
  // fault repeats when the instruction restarts, reaching that action with its own siginfo; a
  // sent signal does not, so it is raised again.
  ::sigaction(SIGBUS, &g_previous, nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

void install_once() {
  static const bool installed = [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, &g_previous) == 0;
  }();
  (void)installed;
}

}  // namespace

int register_mapping(const void* base, size_t bytes, const std::string& path) {
  if (base == nullptr || bytes == 0) return -1;
  install_once();
  std::lock_guard lock(g_mu);
  for (int i = 0; i < kSlots; ++i) {
    Region& r = g_regions[i];
    if (r.end.load(std::memory_order_relaxed) != 0) continue;
    const size_t n = std::min(path.size(), kPathBytes - 1);
    std::memcpy(r.path, path.data(), n);
    r.path[n] = '\0';
    r.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
    r.end.store(reinterpret_cast<uintptr_t>(base) + bytes, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_mapping(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  std::lock_guard lock(g_mu);
  g_regions[slot].end.store(0, std::memory_order_release);
}

void set_exit_note(const std::string& line) {
  g_note_set.store(false, std::memory_order_release);
  if (line.empty()) return;
  const size_t n = std::min(line.size(), sizeof g_note - 1);
  std::memcpy(g_note, line.data(), n);
  g_note[n] = '\0';
  g_note_set.store(true, std::memory_order_release);
}

}  // namespace ktier::format
