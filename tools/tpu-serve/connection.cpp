#include "connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace tpu::serve_http {

// httplib 0.11 gives a handler no handle on its connection. A non-streaming request finds its
// socket once among the process's descriptors (the TCP socket whose peer and local addresses
// are the request's) and polls it while it waits for the engine: a peer that closed its side
// (recv with MSG_PEEK returns 0, or a reset) is cancelled and its KV blocks freed. A client
// that half-closes its sending side while still reading counts as gone too. -1 when not found
// (the request is then not polled).
namespace {
std::string address_text(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    *port = ntohs(v6->sin6_port);
  } else {
    *port = -1;
  }
  return buf;
}

}  // namespace

int connection_of(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || fd == dirfd(d)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t lp = sizeof peer, ls = sizeof self;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &lp) != 0) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &ls) != 0) continue;
    int pp = -1, sp = -1;
    const std::string pa = address_text(peer, &pp);
    address_text(self, &sp);
    if (pa == req.remote_addr && pp == req.remote_port && sp == req.local_port) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

bool peer_gone(int sock) {
  if (sock < 0) return false;
  char c;
  const ssize_t n = recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace tpu::serve_http
