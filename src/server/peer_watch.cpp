#include "server/peer_watch.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <system_error>

namespace ktier::server {
namespace {

// `addr`'s numeric host and port, as cpp-httplib names a connection's ends; false for a socket
// that is not IPv4 or IPv6.
bool numeric_end(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  if (addr.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
  else if (addr.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  else
    return false;
  char text[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, text, sizeof text, nullptr,
                    0, NI_NUMERICHOST) != 0)
    return false;
  host = text;
  return true;
}

enum class Match { kNo, kConnection, kResetOnLocalEnd };

// Whether descriptor `fd` is the connection with the given ends, or an accepted (not listening)
// socket on the local end whose peer is no longer known: a connection the peer reset.
Match match(int fd, const std::string& local_addr, int local_port,
            const std::string& remote_addr, int remote_port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  std::string host;
  int port = -1;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      !numeric_end(addr, len, host, port) || port != local_port || host != local_addr)
    return Match::kNo;
  len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    return numeric_end(addr, len, host, port) && port == remote_port && host == remote_addr
               ? Match::kConnection
               : Match::kNo;
  if (errno != ENOTCONN) return Match::kNo;
  int listening = 1;
  socklen_t size = sizeof listening;
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening == 0
             ? Match::kResetOnLocalEnd
             : Match::kNo;
}

}  // namespace

PeerWatch PeerWatch::find(const std::string& local_addr, int local_port,
                          const std::string& remote_addr, int remote_port) {
  if (local_port < 0) return PeerWatch();
  bool reset_seen = false;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int fd = -1;
    const auto [ptr, err] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (err != std::errc() || ptr != name.data() + name.size()) continue;
    switch (match(fd, local_addr, local_port, remote_addr, remote_port)) {
      case Match::kConnection: return PeerWatch(fd, false);
      case Match::kResetOnLocalEnd: reset_seen = true; break;
      case Match::kNo: break;
    }
  }
  // Not connected, yet a connection on this end was reset: the request's own (a live one
  // would have matched), reset before it was looked for.
  return reset_seen ? PeerWatch(-1, true) : PeerWatch();
}

bool PeerWatch::gone() const {
  if (gone_at_find_) return true;
  if (fd_ < 0) return false;
  // POLLRDHUP: the peer's FIN, even behind bytes not read yet (a next request it sent before
  // leaving); POLLHUP/POLLERR: a reset. A client that half-closes and still waits for its answer
  // is taken as gone (HTTP clients do not; llama-server's newer cpp-httplib asks the same).
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace ktier::server
