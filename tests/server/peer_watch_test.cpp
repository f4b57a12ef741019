// PeerWatch (server/peer_watch.h) on real loopback TCP connections: it finds the accepted
// socket by its two ends and tells a peer that closed or reset from one that is still there.
#include "server/peer_watch.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace ktier::server {
namespace {

// One loopback connection: the client's socket and the one the listener accepted.
struct Connection {
  int client = -1, accepted = -1;
  std::string addr = "127.0.0.1";
  int client_port = -1, accepted_port = -1;
  ~Connection() {
    if (client >= 0) ::close(client);
    if (accepted >= 0) ::close(accepted);
  }
};

int port_of(int sock) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  return ::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? ntohs(a.sin_port)
                                                                        : -1;
}

// A socket listening on 127.0.0.1 at a port the system picks (port_of gives it).
void listen_loopback(int& listener) {
  listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
}

void connect_pair(Connection& c) {
  int listener = -1;
  ASSERT_NO_FATAL_FAILURE(listen_loopback(listener));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port_of(listener)));
  c.client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(c.client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  c.accepted = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  ASSERT_GE(c.accepted, 0);
  c.client_port = port_of(c.client);
  c.accepted_port = port_of(c.accepted);
}

// Whether `done()` holds within 5 s: on loopback a FIN or RST is handled in softirq, which a busy
// machine may leave to ksoftirqd, so the other end may see it a little later.
template <class F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The server's view: its own end is local, the client's remote.
PeerWatch watch_of(const Connection& c) {
  return PeerWatch::find(c.addr, c.accepted_port, c.addr, c.client_port);
}

TEST(PeerWatch, SeesAClosedPeerAndNotAnOpenOne) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(connect_pair(c));
  const PeerWatch watch = watch_of(c);
  ASSERT_TRUE(watch.watching());
  EXPECT_FALSE(watch.gone());
  ::close(c.client);
  c.client = -1;
  EXPECT_TRUE(eventually([&] { return watch.gone(); }));
  EXPECT_TRUE(watch.gone());  // nothing was consumed
}

// A byte the peer sent (a next request) is no sign of leaving; its close behind that byte is,
// and the byte stays unread.
TEST(PeerWatch, SeesACloseBehindAPendingByteAndLeavesTheByte) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(connect_pair(c));
  const PeerWatch watch = watch_of(c);
  ASSERT_TRUE(watch.watching());
  ASSERT_EQ(::send(c.client, "G", 1, 0), 1);
  EXPECT_FALSE(watch.gone());
  ::shutdown(c.client, SHUT_WR);
  EXPECT_TRUE(eventually([&] { return watch.gone(); }));
  char byte = 0;
  ASSERT_EQ(::recv(c.accepted, &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'G');
}

// A connection reset before the watch looks for it has no peer address any more: the request's
// client is gone. The listening socket on the same end is no such connection.
TEST(PeerWatch, AConnectionResetBeforeItIsFoundIsGone) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(connect_pair(c));
  const linger reset{1, 0};
  ASSERT_EQ(::setsockopt(c.client, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
  ::close(c.client);  // an RST
  c.client = -1;
  ASSERT_TRUE(eventually([&] {  // the accepted socket has lost its peer
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    return ::getpeername(c.accepted, reinterpret_cast<sockaddr*>(&peer), &len) != 0 &&
           errno == ENOTCONN;
  }));
  const PeerWatch watch = watch_of(c);
  EXPECT_TRUE(watch.watching());
  EXPECT_TRUE(watch.gone());
  ::close(c.accepted);
  c.accepted = -1;
  // A listener on an end, with no connection to it: nothing to watch.
  int listener = -1;
  ASSERT_NO_FATAL_FAILURE(listen_loopback(listener));
  const PeerWatch none = PeerWatch::find(c.addr, port_of(listener), c.addr, c.client_port);
  ::close(listener);
  EXPECT_FALSE(none.watching());
  EXPECT_FALSE(none.gone());
}

TEST(PeerWatch, OtherEndsFindNothing) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(connect_pair(c));
  // The client's view names the client's socket, another one than the server's.
  const PeerWatch client_side = PeerWatch::find(c.addr, c.client_port, c.addr, c.accepted_port);
  EXPECT_TRUE(client_side.watching());
  for (const PeerWatch& none :
       {PeerWatch::find(c.addr, c.accepted_port, c.addr, c.client_port + 1),
        PeerWatch::find("::1", c.accepted_port, c.addr, c.client_port),
        PeerWatch::find(c.addr, -1, c.addr, -1), PeerWatch()}) {
    EXPECT_FALSE(none.watching());
    EXPECT_FALSE(none.gone());
  }
}

}  // namespace
}  // namespace ktier::server
