#pragma once
// Whether the client of a request being answered has gone away (`ktier serve`). cpp-httplib 0.11
// (Debian 12's) tells a handler neither its socket nor whether the peer closed it; a streamed
// answer notices at its next failed write, a whole one not at all, and a client that timed out
// would hold the one generating request for the rest of its answer. The request does carry both
// ends' addresses, and a TCP connection is named by them: PeerWatch finds that socket among the
// process's descriptors and asks it, without reading, whether the peer has closed its side.

#include <string>

namespace ktier::server {

class PeerWatch {
 public:
  // Watches nothing: gone() is always false.
  PeerWatch() = default;
  // Finds this process's TCP socket from local_addr:local_port to remote_addr:remote_port
  // (addresses as numeric strings, as getnameinfo(NI_NUMERICHOST) writes them: cpp-httplib's
  // Request::local_addr/remote_addr). A reset connection no longer knows its peer: when none
  // matches but an accepted socket on the local end has no peer, the request's client reset
  // its connection, and the watch is gone() from the start. None found otherwise (another kind
  // of socket): a watch of nothing. The socket must stay open while the watch is used: a
  // connection does until its response, streamed content included, is written (cpp-httplib
  // 0.11 closes it afterwards, on the thread that ran the handler and the content provider).
  static PeerWatch find(const std::string& local_addr, int local_port,
                        const std::string& remote_addr, int remote_port);

  bool watching() const { return fd_ >= 0 || gone_at_find_; }
  // True once the peer closed its side of the connection (even with bytes it sent before not
  // read yet) or reset it. Does not block or consume anything. Thread-safe (one poll).
  bool gone() const;

 private:
  PeerWatch(int fd, bool gone_at_find) : fd_(fd), gone_at_find_(gone_at_find) {}
  int fd_ = -1;  // not owned
  bool gone_at_find_ = false;
};

}  // namespace ktier::server
