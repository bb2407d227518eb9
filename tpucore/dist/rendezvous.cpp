#include "tpucore/dist/rendezvous.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>

#include <filesystem>
#include <thread>

#include <fmt/ranges.h>

#include "tpucore/dist/tcp_store.h"
#include "tpucore/core/error.h"

namespace tpu::dist {

namespace {

// Gloo's file store with its key check visible (it is protected there).
class CheckedFileStore final : public ::gloo::rendezvous::FileStore {
 public:
  using FileStore::FileStore;
  bool has(const std::string& key) { return check({key}); }
};

// Keys under a prefix, joined with '.' (file store keys are file names: no '/').
class PrefixedStore final : public ::gloo::rendezvous::Store {
 public:
  PrefixedStore(std::string prefix, ::gloo::rendezvous::Store& s) : prefix_(std::move(prefix)), s_(s) {}
  void set(const std::string& k, const std::vector<char>& d) override { s_.set(prefix_ + k, d); }
  std::vector<char> get(const std::string& k) override { return s_.get(prefix_ + k); }
  void wait(const std::vector<std::string>& keys) override { s_.wait(join(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override { s_.wait(join(keys), t); }
 private:
  std::vector<std::string> join(const std::vector<std::string>& keys) {
    std::vector<std::string> r;
    for (const auto& k : keys) r.push_back(prefix_ + k);
    return r;
  }
  std::string prefix_;
  ::gloo::rendezvous::Store& s_;
};

std::string str(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }
std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

}  // namespace

Rendezvous::Rendezvous(int rank, int world_size, const std::string& spec, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world_size), spec_(spec), timeout_(timeout) {
  if (spec.rfind("tcp://", 0) == 0) {
    std::string hp = spec.substr(6);
    auto colon = hp.rfind(':');
    if (colon == std::string::npos) fail("tpu::dist: init method '{}' needs tcp://host:port", spec);
    std::string host = hp.substr(0, colon);
    int port = 0;
    try {
      port = std::stoi(hp.substr(colon + 1));
    } catch (const std::exception&) {
      fail("tpu::dist: init method '{}': '{}' is not a port number", spec, hp.substr(colon + 1));
    }
    if (rank == 0) server_ = std::make_unique<TcpStoreServer>(host, port);
    store_ = std::make_unique<TcpStoreClient>(host, port, timeout);
    is_tcp_ = true;
  } else if (spec.rfind("file://", 0) == 0) {
    std::string dir = spec.substr(7);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (!std::filesystem::is_directory(dir))
      fail("tpu::dist: init method '{}': cannot use '{}' as the file store's directory", spec, dir);
    store_ = std::make_unique<CheckedFileStore>(dir);
  } else {
    fail("tpu::dist: unknown init method '{}' (expected env://, tcp://host:port or file:///dir)", spec);
  }
}

Rendezvous::Rendezvous(Rendezvous&&) noexcept = default;
Rendezvous::~Rendezvous() = default;

bool Rendezvous::has(const std::string& key) {
  if (is_tcp_) return static_cast<TcpStoreClient&>(*store_).check(key);
  return static_cast<CheckedFileStore&>(*store_).has(key);
}

void Rendezvous::abort_all(const std::string& why) {
  try {
    store_->set("tpu.abort", bytes(why));
  } catch (const std::exception&) {  // the store may be gone already; the reason still reaches us
  }
  throw Error(why);
}

void Rendezvous::arrive() {
  store_->set(fmt::format("tpu.ws.{}", rank_), bytes(std::to_string(world_)));
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::vector<int> missing;
  for (int i = 0; i < world_; ++i) missing.push_back(i);
  while (!missing.empty()) {  // bounded by the deadline
    if (has("tpu.abort")) throw Error(str(store_->get("tpu.abort")) + fmt::format(" (reported to rank {})", rank_));
    std::vector<int> still;
    for (int i : missing) {
      if (!has(fmt::format("tpu.ws.{}", i))) {
        still.push_back(i);
        continue;
      }
      std::string ws = str(store_->get(fmt::format("tpu.ws.{}", i)));
      if (ws != std::to_string(world_))
        abort_all(fmt::format("tpu::dist: wrong world size: rank {} was started with WORLD_SIZE={} but rank {} with {}",
                              rank_, world_, i, ws));
    }
    missing = std::move(still);
    if (missing.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline)
      fail("tpu::dist: rank {}: ranks {} of {} never arrived within {} ms (not started, crashed, or a "
           "different MASTER_ADDR/MASTER_PORT/store?)", rank_, fmt::join(missing, ","), world_, timeout_.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Rendezvous::set_flag(const std::string& key) { store_->set(key, bytes("1")); }

std::shared_ptr<::gloo::Context> Rendezvous::connect(int rank, int size, const std::string& prefix,
                                                     std::shared_ptr<::gloo::transport::Device>& device) {
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout_);
  PrefixedStore store(prefix, *store_);
  try {
    ctx->connectFullMesh(store, device);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("tpu::dist: rank {} of {}: connecting the Gloo full mesh failed: {}", rank, size, e.what());
  }
  return ctx;
}

}  // namespace tpu::dist
