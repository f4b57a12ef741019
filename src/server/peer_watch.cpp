#include "server/peer_watch.h"

#include <netdb.h>
#include <netinet/in.h>
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

// Whether descriptor `fd` is a socket whose ends are the given ones.
bool connects(int fd, const std::string& local_addr, int local_port,
              const std::string& remote_addr, int remote_port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  std::string host;
  int port = -1;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      !numeric_end(addr, len, host, port) || port != local_port || host != local_addr)
    return false;
  len = sizeof addr;
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
         numeric_end(addr, len, host, port) && port == remote_port && host == remote_addr;
}

}  // namespace

PeerWatch PeerWatch::find(const std::string& local_addr, int local_port,
                          const std::string& remote_addr, int remote_port) {
  if (local_port < 0 || remote_port < 0) return PeerWatch();
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int fd = -1;
    const auto [ptr, err] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (err != std::errc() || ptr != name.data() + name.size()) continue;
    if (connects(fd, local_addr, local_port, remote_addr, remote_port)) return PeerWatch(fd);
  }
  return PeerWatch();
}

bool PeerWatch::gone() const {
  if (fd_ < 0) return false;
  char byte = 0;
  const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  // The peer's FIN. A client that half-closes and still waits for its answer is taken as gone
  // (HTTP clients do not; llama-server's newer cpp-httplib asks the same question).
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // a reset: ECONNRESET
}

}  // namespace ktier::server
