#include "server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

#include "api.h"
#include "tpucore/serve/metrics.h"

namespace tpu::serve_http {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What the engine thread hands to one HTTP request.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> tokens;
  bool done = false;
  serve::FinishReason why = serve::FinishReason::length;
  std::atomic<bool> gone{false};  // the client went away: refuse the next token
  int64_t id = 0;
};

// The text of the generated tokens so far: a trailing stop token dropped, special tokens
// skipped, cut before the first stop string.
struct Text {
  std::string text;
  bool stop_hit = false;
};
Text render(const Tokenizer& tok, std::vector<int64_t> ids, const std::vector<int64_t>& stop_tokens,
            const std::vector<std::string>& stops) {
  // A stop token ends the sequence (the engine generates nothing after it) and is not text.
  if (!ids.empty() && std::find(stop_tokens.begin(), stop_tokens.end(), ids.back()) != stop_tokens.end())
    ids.pop_back();
  Text t;
  try {
    t.text = tok.decode(ids, /*skip_special=*/true);
  } catch (const Error&) {
    // A checkpoint's vocabulary may be padded past the tokenizer's: ids without text are dropped
    // rather than failing the response.
    for (int64_t id : ids) {
      try {
        t.text += tok.decode({id}, true);
      } catch (const Error&) {
      }
    }
  }
  size_t cut = std::string::npos;
  for (const auto& s : stops) cut = std::min(cut, t.text.find(s));
  if (cut != std::string::npos) {
    t.text.resize(cut);
    t.stop_hit = true;
  }
  return t;
}

const char* finish_name(serve::FinishReason r, bool stop_hit) {
  if (stop_hit) return "stop";
  switch (r) {
    case serve::FinishReason::stop: return "stop";
    case serve::FinishReason::length: return "length";
    case serve::FinishReason::cancelled: return "abort";
  }
  return "abort";
}

}  // namespace

namespace {

// httplib 0.11 gives a handler no handle on its connection. A non-streaming request finds its
// socket once among the process's descriptors (the TCP socket whose peer and local addresses
// are the request's) and polls it while it waits for the engine: a peer that closed its side
// (recv with MSG_PEEK returns 0, or a reset) is cancelled and its KV blocks freed. A client
// that half-closes its sending side while still reading counts as gone too. -1 when not found
// (the request is then not polled).
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

}  // namespace

struct ApiServer::Impl {
  std::shared_ptr<models::CausalLM> model;
  Tokenizer tok;
  ServerOptions opts;
  serve::Engine engine;
  ModelInfo info;
  httplib::Server http;
  std::thread loop;
  std::mutex loop_mu;
  std::condition_variable loop_cv;
  std::atomic<bool> stop{false}, draining{false};
  std::atomic<int64_t> next_id{1};
  std::atomic<int> active{0};  // HTTP requests holding an engine request
  int listen_fd = -1;
  std::once_flag shut_once;
  std::mutex live_mu;
  std::map<int64_t, std::weak_ptr<Channel>> live;
  std::mutex err_mu;
  std::map<int, int64_t> http_errors;
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();

  Impl(std::shared_ptr<models::CausalLM> m, Tokenizer t, ServerOptions o)
      : model(std::move(m)), tok(std::move(t)), opts(std::move(o)), engine(model, opts.engine) {
    info.name = opts.model_name;
    info.tokenizer = &tok;
    info.max_model_len = engine.config().max_model_len;
    info.eos = model->config.eos_token_ids;
    info.chat_template = opts.chat_template ? &*opts.chat_template : nullptr;
    routes();
  }

  void fail(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
    std::lock_guard<std::mutex> lk(err_mu);
    http_errors[e.status]++;
  }

  void engine_loop() {
    while (!stop) {
      bool worked = false;
      try {
        worked = engine.step();
      } catch (const std::exception& e) {
        fmt::print(stderr, "tpu-serve: engine step failed: {}\n", e.what());
      }
      if (!worked) {
        std::unique_lock<std::mutex> lk(loop_mu);
        loop_cv.wait_for(lk, std::chrono::milliseconds(20));
      }
    }
  }

  std::shared_ptr<Channel> submit(const CompletionRequest& r) {
    if (draining) throw ApiError{503, "the server is shutting down", "unavailable_error", ""};
    auto ch = std::make_shared<Channel>();
    serve::RequestCallbacks cb;
    cb.on_token = [ch](int64_t t) {
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->tokens.push_back(t);
      ch->cv.notify_all();
      return !ch->gone.load();
    };
    cb.on_finish = [ch](serve::FinishReason why) {
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->done = true;
      ch->why = why;
      ch->cv.notify_all();
    };
    try {
      ch->id = engine.add_request(r.prompt, r.params, cb);
    } catch (const serve::Overloaded& e) {
      throw ApiError{429, e.what(), "rate_limit_error", ""};
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", "prompt"};
    }
    {
      std::lock_guard<std::mutex> lk(live_mu);
      live[ch->id] = ch;
    }
    loop_cv.notify_one();
    return ch;
  }
  void release(const std::shared_ptr<Channel>& ch) {
    std::lock_guard<std::mutex> lk(live_mu);
    live.erase(ch->id);
  }

  json usage(const CompletionRequest& r, size_t generated) const {
    const auto p = static_cast<int64_t>(r.prompt.size()), g = static_cast<int64_t>(generated);
    return json{{"prompt_tokens", p}, {"completion_tokens", g}, {"total_tokens", p + g}};
  }
  json head(const CompletionRequest& r, const std::string& id, bool chunk) const {
    return json{{"id", id},
                {"object", r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                {"created", created},
                {"model", opts.model_name}};
  }
  json choice(const CompletionRequest& r, const std::string& text, const char* finish, bool chunk, bool first) const {
    json c{{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
    if (!r.chat) {
      c["text"] = text;
      c["logprobs"] = nullptr;
    } else if (chunk) {
      c["delta"] = first ? json{{"role", "assistant"}, {"content", text}} : (finish ? json::object() : json{{"content", text}});
    } else {
      c["message"] = json{{"role", "assistant"}, {"content", text}};
    }
    return c;
  }

  // Waits (bounded per call) for a change; returns a copy of the tokens and the finish state.
  static bool wait(Channel& ch, size_t seen, std::vector<int64_t>& tokens, serve::FinishReason& why) {
    std::unique_lock<std::mutex> lk(ch.mu);
    ch.cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return ch.done || ch.tokens.size() != seen; });
    tokens = ch.tokens;
    why = ch.why;
    return ch.done;
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    CompletionRequest r;
    std::shared_ptr<Channel> ch;
    try {
      r = parse_request(req.body, chat, info);
      ch = submit(r);
    } catch (const ApiError& e) {
      return fail(res, e);
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    active++;
    if (!r.stream) {
      std::vector<int64_t> tokens;
      serve::FinishReason why{};
      bool cancelled_for_stop = false, gone = false;
      const int sock = connection_of(req);
      for (;;) {
        const bool done = wait(*ch, tokens.size(), tokens, why);
        if (done) break;
        if (!gone && peer_gone(sock)) {
          engine.cancel(ch->id);  // the client went away: free its blocks at the next step
          gone = true;
        }
        if (!r.stop.empty() && !cancelled_for_stop && render(tok, tokens, r.params.stop_token_ids, r.stop).stop_hit) {
          engine.cancel(ch->id);  // a stop string: no need to generate further
          cancelled_for_stop = true;
        }
      }
      const Text t = render(tok, tokens, r.params.stop_token_ids, r.stop);
      json j = head(r, id, false);
      j["choices"] = json::array({choice(r, t.text, finish_name(why, t.stop_hit), false, false)});
      j["usage"] = usage(r, tokens.size());
      res.set_content(dump(j), "application/json");
      release(ch);
      active--;
      return;
    }
    struct StreamState {
      std::shared_ptr<Channel> ch;
      CompletionRequest r;
      std::string id;
      size_t emitted = 0;
      bool first = true, cancelled_for_stop = false;
      std::vector<int64_t> tokens;
    };
    auto st = std::make_shared<StreamState>();
    st->ch = ch;
    st->r = std::move(r);
    st->id = id;
    size_t holdback = 0;
    for (const auto& s : st->r.stop) holdback = std::max(holdback, s.size() - 1);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, holdback](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string s = "data: " + dump(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          auto gone = [&] {
            st->ch->gone = true;
            engine.cancel(st->ch->id);
            return false;
          };
          serve::FinishReason why{};
          const bool done = wait(*st->ch, st->tokens.size(), st->tokens, why);
          const Text t = render(tok, st->tokens, st->r.params.stop_token_ids, st->r.stop);
          if (t.stop_hit && !st->cancelled_for_stop) {
            engine.cancel(st->ch->id);
            st->cancelled_for_stop = true;
          }
          size_t ready = t.text.size();  // all of it at the end, else whole characters before a held-back tail
          if (!done) {
            ready = utf8_complete(t.text);
            ready = ready > holdback ? ready - holdback : 0;
          }
          if (ready > st->emitted || (st->first && st->r.chat)) {
            json j = head(st->r, st->id, true);
            j["choices"] = json::array(
                {choice(st->r, t.text.substr(st->emitted, ready - st->emitted), nullptr, true, st->first)});
            if (!send(j)) return gone();
            st->emitted = std::max(st->emitted, ready);
            st->first = false;
          } else if (!sink.is_writable()) {
            return gone();
          }
          if (done) {
            json j = head(st->r, st->id, true);
            j["choices"] = json::array({choice(st->r, "", finish_name(why, t.stop_hit), true, false)});
            if (!send(j)) return gone();
            if (st->r.include_usage) {
              json u = head(st->r, st->id, true);
              u["choices"] = json::array();
              u["usage"] = usage(st->r, st->tokens.size());
              if (!send(u)) return gone();
            }
            const std::string fin = "data: [DONE]\n\n";
            if (!sink.write(fin.data(), fin.size())) return gone();
            sink.done();
          }
          return true;
        },
        [this, st](bool) {
          if (!st->ch->done) {  // the client went away before the end
            st->ch->gone = true;
            engine.cancel(st->ch->id);
          }
          release(st->ch);
          active--;
        });
  }

  void routes() {
    // The library listens with a backlog of 5 (a compile-time setting of the Debian build):
    // remember the listening socket so bind() can raise it, or bursts of connects get dropped.
    http.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd = static_cast<int>(sock);
    });
    http.new_task_queue = [n = opts.threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    http.set_payload_max_length(size_t{4} << 20);
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { completion(q, s, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& s) { completion(q, s, true); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
      json m{{"id", opts.model_name}, {"object", "model"}, {"created", created}, {"owned_by", "tpucore"},
             {"max_model_len", info.max_model_len}};
      s.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      s.status = draining ? 503 : 200;
      s.set_content(dump(json{{"status", draining ? "draining" : "ok"}}), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      std::string extra = "# HELP tpu_serve_http_errors_total Requests answered with an error status.\n"
                          "# TYPE tpu_serve_http_errors_total counter\n";
      {
        std::lock_guard<std::mutex> lk(err_mu);
        for (auto [code, n] : http_errors) extra += fmt::format("tpu_serve_http_errors_total{{code=\"{}\"}} {}\n", code, n);
      }
      s.set_content(serve::prometheus_text(engine.metrics(), extra), "text/plain; version=0.0.4");
    });
    http.set_error_handler([this](const httplib::Request& q, httplib::Response& s) {
      if (!s.body.empty()) return;
      const std::string msg = s.status == 404 ? fmt::format("no route {} {}", q.method, q.path)
                              : s.status == 413 ? std::string("the request body is too large")
                                                : fmt::format("HTTP error {}", s.status);
      fail(s, ApiError{s.status, msg, s.status == 404 ? "not_found_error" : "invalid_request_error", ""});
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& s, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      fail(s, ApiError{500, msg, "internal_error", ""});
    });
  }

  void shutdown() {
    std::call_once(shut_once, [this] {
      draining = true;
      const auto bounded_wait = [](double seconds, const auto& pred) {
        const auto end = Clock::now() + std::chrono::duration<double>(seconds);
        while (!pred() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      };
      bounded_wait(opts.drain_seconds, [&] { return !engine.has_work(); });
      {
        std::lock_guard<std::mutex> lk(live_mu);
        for (auto& [id, w] : live) engine.cancel(id);
      }
      bounded_wait(10, [&] { return !engine.has_work() && active == 0; });
      http.stop();
    });
  }
};

ApiServer::ApiServer(std::shared_ptr<models::CausalLM> model, Tokenizer tokenizer, ServerOptions opts)
    : impl_(std::make_unique<Impl>(std::move(model), std::move(tokenizer), std::move(opts))) {}

ApiServer::~ApiServer() {
  if (impl_->http.is_running()) shutdown();
  impl_->stop = true;
  impl_->loop_cv.notify_all();
  if (impl_->loop.joinable()) impl_->loop.join();
}

int ApiServer::bind(const std::string& host, int port) {
  const int p = port == 0 ? impl_->http.bind_to_any_port(host) : (impl_->http.bind_to_port(host, port) ? port : -1);
  TPU_CHECK(p > 0, "tpu-serve: cannot listen on {}:{}", host, port);
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  return p;
}

void ApiServer::serve() {
  if (!impl_->loop.joinable()) impl_->loop = std::thread([this] { impl_->engine_loop(); });
  impl_->http.listen_after_bind();
  impl_->stop = true;
  impl_->loop_cv.notify_all();
  impl_->loop.join();
}

void ApiServer::shutdown() { impl_->shutdown(); }

serve::Engine& ApiServer::engine() { return impl_->engine; }

}  // namespace tpu::serve_http
