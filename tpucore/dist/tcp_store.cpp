// The rendezvous store over TCP. Requests are [cmd u8][key len u32][key][value len u32][value];
// replies are [status u8][value len u32][value]. The server answers one request at a time; a
// wait is the client polling `check` (rendezvous moves a few hundred bytes, so polling costs
// nothing that matters and keeps the server free of blocked requests).
#include "tpucore/dist/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tpucore/core/error.h"

namespace tpu::dist {

namespace {

constexpr char kSet = 1, kGet = 2, kCheck = 3;

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_blob(int fd, const char* p, size_t n) {
  uint32_t len = static_cast<uint32_t>(n);
  return write_all(fd, &len, 4) && (n == 0 || write_all(fd, p, n));
}

bool read_blob(int fd, std::vector<char>& out) {
  uint32_t len = 0;
  if (!read_all(fd, &len, 4) || len > (64u << 20)) return false;
  out.resize(len);
  return len == 0 || read_all(fd, out.data(), len);
}

sockaddr_in resolve(const std::string& host, int port, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    fail("tpu::dist: {}: cannot resolve the master address '{}' ({})", what, host, gai_strerror(rc));
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  if (port <= 0 || port > 65535) fail("tpu::dist: MASTER_PORT {} is not a TCP port (1..65535)", port);
  sockaddr_in addr = resolve(host, port, "store server");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail("tpu::dist: store server: socket() failed: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    ::close(listen_fd_);
    if (e == EADDRINUSE)
      fail("tpu::dist: rank 0 cannot serve the rendezvous store: port {} on {} is in use (another job? "
           "pick a free MASTER_PORT)", port, host);
    fail("tpu::dist: rank 0 cannot serve the rendezvous store on {}:{}: {} (MASTER_ADDR must be an "
         "address of rank 0's machine)", host, port, std::strerror(e));
  }
  ::listen(listen_fd_, 128);
  port_ = port;
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

bool TcpStoreServer::handle(int fd) {
  char cmd = 0;
  std::vector<char> key, value;
  if (!read_all(fd, &cmd, 1) || !read_blob(fd, key) || !read_blob(fd, value)) return false;
  std::string k(key.begin(), key.end());
  char status = 1;
  const std::vector<char>* reply = nullptr;
  if (cmd == kSet) {
    data_[k] = std::move(value);
  } else {
    auto it = data_.find(k);
    status = it != data_.end() ? 1 : 0;
    if (cmd == kGet && it != data_.end()) reply = &it->second;
  }
  return write_all(fd, &status, 1) &&
         write_blob(fd, reply ? reply->data() : nullptr, reply ? reply->size() : 0);
}

void TcpStoreServer::serve() {
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  while (!stop_) {
    int n = ::poll(fds.data(), fds.size(), 100);  // wakes up to see stop_
    if (n <= 0) continue;
    for (size_t i = fds.size(); i-- > 1;) {
      if (fds[i].revents == 0) continue;
      if ((fds[i].revents & POLLIN) == 0 || !handle(fds[i].fd)) {
        ::close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (fds[0].revents & POLLIN) {
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) ::close(fds[i].fd);
}

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : where_(fmt::format("{}:{}", host, port)), timeout_(timeout) {
  if (port <= 0 || port > 65535) fail("tpu::dist: MASTER_PORT {} is not a TCP port (1..65535)", port);
  sockaddr_in addr = resolve(host, port, "store client");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int last = 0;
  for (;;) {  // bounded by the deadline
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail("tpu::dist: store client: socket() failed: {}", std::strerror(errno));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    last = errno;
    ::close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() >= deadline)
      fail("tpu::dist: could not reach the rendezvous store of rank 0 at {} within {} ms ({}); is rank 0 "
           "running, and are MASTER_ADDR / MASTER_PORT right?", where_, timeout.count(), std::strerror(last));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));  // a silent server cannot hang us
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::vector<char>> TcpStoreClient::request(char cmd, const std::string& key, const std::vector<char>& value) {
  std::lock_guard<std::mutex> lock(mu_);
  char status = 0;
  std::vector<char> reply;
  if (!write_all(fd_, &cmd, 1) || !write_blob(fd_, key.data(), key.size()) ||
      !write_blob(fd_, value.data(), value.size()) || !read_all(fd_, &status, 1) || !read_blob(fd_, reply))
    fail("tpu::dist: lost the connection to the rendezvous store at {} (rank 0 exited or died?)", where_);
  if (status == 0) return std::nullopt;  // absent key
  return reply;
}

void TcpStoreClient::set(const std::string& key, const std::vector<char>& data) { request(kSet, key, data); }

bool TcpStoreClient::check(const std::string& key) { return request(kCheck, key, {}).has_value(); }

void TcpStoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& k : keys) {
    while (!check(k)) {  // bounded by the deadline
      if (std::chrono::steady_clock::now() >= deadline)
        fail("tpu::dist: timed out after {} ms waiting for '{}' in the rendezvous store at {}", timeout.count(), k, where_);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

std::vector<char> TcpStoreClient::get(const std::string& key) {
  wait({key}, timeout_);
  auto r = request(kGet, key, {});
  if (!r) fail("tpu::dist: key '{}' vanished from the rendezvous store", key);
  return std::move(*r);
}

}  // namespace tpu::dist
