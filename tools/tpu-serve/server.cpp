#include "server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "api.h"
#include "connection.h"
#include "logprobs.h"
#include "timing.h"
#include "tpucore/devices.h"
#include "tpucore/serve/metrics.h"

namespace tpu::serve_http {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What the engine thread hands to one HTTP request: per engine sequence (a choice, or one of
// best_of candidates) its tokens with log-probabilities and its finish state.
struct Seq {
  std::vector<serve::TokenOutput> outs;
  bool done = false;
  serve::FinishReason why = serve::FinishReason::length;
  int64_t id = 0;  // engine request id
  serve::RequestTiming timing;
  std::vector<int64_t> tokens() const {
    std::vector<int64_t> t;
    for (const auto& o : outs) t.push_back(o.token);
    return t;
  }
  double cumulative_logprob() const {
    double s = 0;
    for (const auto& o : outs) s += o.logprob;
    return s;
  }
};
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Seq> seqs;
  std::vector<serve::TokenOutput> prompt_outs;  // echo with logprobs: the prompt's (from sequence 0)
  bool prompt_ready = false;
  int64_t version = 0;            // bumped on every token and finish
  std::atomic<bool> gone{false};  // the client went away: refuse the next token
  bool all_done() const {
    return std::all_of(seqs.begin(), seqs.end(), [](const Seq& q) { return q.done; });
  }
};
ResponseTiming timing_of(const std::vector<Seq>& seqs) {
  std::vector<serve::RequestTiming> t;
  for (const Seq& q : seqs) t.push_back(q.timing);
  return response_timing(t);
}

// The text of token ids, special tokens skipped (also the engine's text for stop strings).
std::string decode_text(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  try {
    return tok.decode(ids, /*skip_special=*/true);
  } catch (const Error&) {
    // A checkpoint's vocabulary may be padded past the tokenizer's: ids without text are dropped
    // rather than failing the response.
    std::string text;
    for (int64_t id : ids) {
      try {
        text += tok.decode({id}, true);
      } catch (const Error&) {
      }
    }
    return text;
  }
}

serve::EngineConfig with_detokenize(serve::EngineConfig c, const Tokenizer* tok) {
  c.detokenize = [tok](const std::vector<int64_t>& ids) { return decode_text(*tok, ids); };
  return c;
}

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
  t.text = decode_text(tok, ids);
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
      : model(std::move(m)), tok(std::move(t)), opts(std::move(o)), engine(model, with_detokenize(opts.engine, &tok)) {
    info.name = opts.model_name;
    info.tokenizer = &tok;
    info.max_model_len = engine.config().max_model_len;
    info.eos = model->config.eos_token_ids;
    info.chat_template = opts.chat_template ? &*opts.chat_template : nullptr;
    info.token_bytes = token_bytes(tok, model->config.vocab_size);
    if (opts.chat_template) info.tool_format = detect_tool_format(opts.chat_template->source());
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

  // Adds the request's sequences (best_of of them; choice i seeded by choice_seed) to the engine.
  std::shared_ptr<Channel> submit(const CompletionRequest& r) {
    if (draining) throw ApiError{503, "the server is shutting down", "unavailable_error", "", ""};
    auto ch = std::make_shared<Channel>();
    ch->seqs.resize(static_cast<size_t>(r.best_of));
    for (size_t i = 0; i < ch->seqs.size(); ++i) {
      serve::RequestCallbacks cb;
      cb.on_output = [ch, i](const serve::TokenOutput& o) {
        std::lock_guard<std::mutex> lk(ch->mu);
        ch->seqs[i].outs.push_back(o);
        ch->version++;
        ch->cv.notify_all();
        return !ch->gone.load();
      };
      cb.on_timing = [ch, i](const serve::RequestTiming& t) {
        std::lock_guard<std::mutex> lk(ch->mu);
        ch->seqs[i].timing = t;
      };
      cb.on_finish = [ch, i](serve::FinishReason why) {
        std::lock_guard<std::mutex> lk(ch->mu);
        ch->seqs[i].done = true;
        ch->seqs[i].why = why;
        ch->version++;
        ch->cv.notify_all();
      };
      serve::SamplingParams p = r.params;
      p.seed = choice_seed(r.params.seed, static_cast<int64_t>(i));
      if (i > 0) p.prompt_logprobs = -1;  // the same for every sequence: asked once
      if (p.prompt_logprobs >= 0)
        cb.on_prompt_logprobs = [ch](const std::vector<serve::TokenOutput>& outs) {
          std::lock_guard<std::mutex> lk(ch->mu);
          ch->prompt_outs = outs;
          ch->prompt_ready = true;
          ch->version++;
          ch->cv.notify_all();
        };
      int64_t id = 0;
      try {
        id = engine.add_request(r.prompt, p, cb);
      } catch (const serve::Overloaded& e) {
        cancel_all(*ch, i);
        throw ApiError{429, e.what(), "rate_limit_error", "", ""};
      } catch (const Error& e) {
        cancel_all(*ch, i);
        throw ApiError{400, e.what(), "invalid_request_error", "prompt", ""};
      }
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->seqs[i].id = id;
    }
    {
      std::lock_guard<std::mutex> lk(live_mu);
      for (const Seq& q : ch->seqs) live[q.id] = ch;
    }
    loop_cv.notify_one();
    return ch;
  }
  // Cancels the channel's first `count` sequences (all by default).
  void cancel_all(Channel& ch, size_t count = SIZE_MAX) {
    ch.gone = true;
    std::vector<int64_t> ids;
    {
      std::lock_guard<std::mutex> lk(ch.mu);
      for (size_t i = 0; i < ch.seqs.size() && i < count; ++i) ids.push_back(ch.seqs[i].id);
    }
    for (int64_t id : ids) engine.cancel(id);
  }
  void release(const std::shared_ptr<Channel>& ch) {
    std::lock_guard<std::mutex> lk(live_mu);
    for (const Seq& q : ch->seqs) live.erase(q.id);
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
  // One choice; outs: the log-probabilities to report with this text (when asked), offset: the
  // completions' text_offset of the first of them.
  // prompt_outs (echo with logprobs): the prompt's part comes first.
  json choice(const CompletionRequest& r, size_t index, const std::string& text, const char* finish, bool chunk,
              bool first, const std::vector<serve::TokenOutput>& outs, size_t& offset,
              const std::vector<serve::TokenOutput>* prompt_outs = nullptr) const {
    json c{{"index", index}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
    json lp = nullptr;
    if (r.logprobs >= 0 && !(chunk && outs.empty() && finish)) {
      if (r.chat) {
        lp = chat_logprobs(tok, outs);
      } else if (prompt_outs) {
        lp = echo_logprobs(tok, r.prompt, *prompt_outs, offset);
        append_logprobs(lp, completion_logprobs(tok, outs, offset));
      } else {
        lp = completion_logprobs(tok, outs, offset);
      }
    }
    c["logprobs"] = lp;
    if (!r.chat) {
      c["text"] = text;
    } else if (chunk) {
      c["delta"] = first ? json{{"role", "assistant"}, {"content", text}} : (finish ? json::object() : json{{"content", text}});
    } else {
      c["message"] = json{{"role", "assistant"}, {"content", text}};
    }
    return c;
  }

  // Waits (bounded per call) for a change; returns a copy of the sequences and whether all are done.
  static bool wait(Channel& ch, int64_t& version, std::vector<Seq>& seqs,
                   std::vector<serve::TokenOutput>* prompt_outs = nullptr, bool* prompt_ready = nullptr) {
    std::unique_lock<std::mutex> lk(ch.mu);
    ch.cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return ch.all_done() || ch.version != version; });
    version = ch.version;
    seqs = ch.seqs;
    if (prompt_outs) *prompt_outs = ch.prompt_outs;
    if (prompt_ready) *prompt_ready = ch.prompt_ready;
    return ch.all_done();
  }

  // The returned sequences: all of them, or with best_of the n with the highest summed logprob.
  static std::vector<size_t> chosen(const CompletionRequest& r, const std::vector<Seq>& seqs) {
    std::vector<size_t> order(seqs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (r.best_of > r.n)
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return seqs[a].cumulative_logprob() > seqs[b].cumulative_logprob();
      });
    order.resize(static_cast<size_t>(r.n));
    return order;
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
      std::vector<Seq> seqs;
      std::vector<serve::TokenOutput> prompt_outs;
      int64_t version = -1;
      bool gone = false;
      const int sock = connection_of(req);
      for (;;) {
        if (wait(*ch, version, seqs, &prompt_outs)) break;
        if (!gone && peer_gone(sock)) {
          cancel_all(*ch);  // the client went away: free its blocks at the next step
          gone = true;
        }
      }
      json j = head(r, id, false);
      j["choices"] = json::array();
      size_t generated = 0;
      for (const Seq& q : seqs) generated += q.outs.size();
      const std::vector<size_t> pick = chosen(r, seqs);
      for (size_t k = 0; k < pick.size(); ++k) {
        const Seq& q = seqs[pick[k]];
        const Text t = render(tok, q.tokens(), r.params.stop_token_ids, r.stop);
        size_t offset = 0;
        j["choices"].push_back(choice(r, k, (r.echo ? r.prompt_text : "") + t.text, finish_name(q.why, t.stop_hit),
                                      false, false, q.outs, offset, r.params.prompt_logprobs >= 0 ? &prompt_outs : nullptr));
        if (r.parse_tools && attach_tool_calls(j["choices"].back()["message"], t.text, r.tool_names, false))
          j["choices"].back()["finish_reason"] = "tool_calls";
      }
      j["usage"] = usage(r, generated);
      for (const auto& [name, value] : timing_headers(timing_of(seqs))) res.set_header(name, value);
      res.set_content(dump(j), "application/json");
      release(ch);
      active--;
      return;
    }
    struct PerChoice {
      size_t emitted = 0, reported = 0, offset = 0;
      bool first = true, finished = false;
    };
    struct StreamState {
      std::shared_ptr<Channel> ch;
      CompletionRequest r;
      std::string id;
      int64_t version = -1;
      std::vector<PerChoice> c;
    };
    auto st = std::make_shared<StreamState>();
    st->ch = ch;
    st->r = std::move(r);
    st->id = id;
    st->c.resize(static_cast<size_t>(st->r.n));
    size_t holdback = 0;
    for (const auto& s : st->r.stop) holdback = std::max(holdback, s.size() - 1);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, holdback](size_t, httplib::DataSink& sink) {
          // The chunks of this call go out together at its end, so the last one before [DONE]
          // can carry the response's timing.
          std::vector<json> out;
          auto send = [&](const json& j) {
            out.push_back(j);
            return true;
          };
          auto flush = [&] {
            for (const json& j : out) {
              const std::string s = "data: " + dump(j) + "\n\n";
              if (!sink.write(s.data(), s.size())) return false;
            }
            out.clear();
            return true;
          };
          auto gone = [&] {
            cancel_all(*st->ch);
            return false;
          };
          std::vector<Seq> seqs;
          std::vector<serve::TokenOutput> prompt_outs;
          bool prompt_ready = false;
          const bool done = wait(*st->ch, st->version, seqs, &prompt_outs, &prompt_ready);
          const CompletionRequest& r = st->r;
          const bool echo_lp = r.params.prompt_logprobs >= 0;
          if (echo_lp && !prompt_ready && !done) return true;  // the prompt's part goes first
          bool sent = false;
          for (size_t i = 0; i < st->c.size(); ++i) {
            PerChoice& pc = st->c[i];
            const Seq& q = seqs[i];
            if (pc.finished) continue;
            const Text t = render(tok, q.tokens(), r.params.stop_token_ids, r.stop);
            if (r.parse_tools) {
              // Tool calls are known only at the end: the choice goes out whole, in two chunks.
              if (!q.done) continue;
              json j = head(r, st->id, true);
              json c = choice(r, i, t.text, nullptr, true, true, q.outs, pc.offset);
              const bool calls = attach_tool_calls(c["delta"], t.text, r.tool_names, true);
              j["choices"] = json::array({c});
              if (!send(j)) return gone();
              j["choices"] = json::array({choice(r, i, "", calls ? "tool_calls" : finish_name(q.why, t.stop_hit), true,
                                                 false, {}, pc.offset)});
              if (!send(j)) return gone();
              sent = pc.finished = true;
              continue;
            }
            // All of it at the end, else whole characters before a held-back tail.
            size_t ready = t.text.size();
            if (!q.done) {
              ready = utf8_complete(t.text);
              ready = ready > holdback ? utf8_complete(t.text.substr(0, ready - holdback)) : 0;
            }
            const bool new_logprobs = r.logprobs >= 0 && q.outs.size() > pc.reported;
            if (ready > pc.emitted || new_logprobs || (pc.first && (r.chat || r.echo))) {
              const std::vector<serve::TokenOutput> outs(q.outs.begin() + static_cast<std::ptrdiff_t>(pc.reported),
                                                         q.outs.end());
              std::string text = ready > pc.emitted ? t.text.substr(pc.emitted, ready - pc.emitted) : "";
              if (pc.first && r.echo) text = r.prompt_text + text;
              json j = head(r, st->id, true);
              j["choices"] = json::array(
                  {choice(r, i, text, nullptr, true, pc.first, outs, pc.offset, echo_lp && pc.first ? &prompt_outs : nullptr)});
              if (!send(j)) return gone();
              sent = true;
              pc.emitted = std::max(pc.emitted, ready);
              pc.reported = q.outs.size();
              pc.first = false;
            }
            if (q.done) {
              json j = head(r, st->id, true);
              j["choices"] = json::array({choice(r, i, "", finish_name(q.why, t.stop_hit), true, false, {}, pc.offset)});
              if (!send(j)) return gone();
              sent = true;
              pc.finished = true;
            }
          }
          if (!sent && !sink.is_writable()) return gone();
          if (!done && !flush()) return gone();
          if (done) {
            if (r.include_usage) {
              size_t generated = 0;
              for (const Seq& q : seqs) generated += q.outs.size();
              json u = head(r, st->id, true);
              u["choices"] = json::array();
              u["usage"] = usage(r, generated);
              if (!send(u)) return gone();
            }
            if (!out.empty()) out.back()["tpucore_timing"] = timing_json(timing_of(seqs));
            if (!flush()) return gone();
            const std::string fin = "data: [DONE]\n\n";
            if (!sink.write(fin.data(), fin.size())) return gone();
            sink.done();
          }
          return true;
        },
        [this, st](bool) {
          bool all_done;
          {
            std::lock_guard<std::mutex> lk(st->ch->mu);
            all_done = st->ch->all_done();
          }
          if (!all_done) cancel_all(*st->ch);  // the client went away before the end
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
    const auto model_object = [this] {
      return json{{"id", opts.model_name}, {"object", "model"}, {"created", created}, {"owned_by", "tpucore"},
                  {"root", opts.model_name}, {"parent", nullptr}, {"max_model_len", info.max_model_len}};
    };
    http.Get("/v1/models", [model_object](const httplib::Request&, httplib::Response& s) {
      s.set_content(dump(json{{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
    });
    // models.retrieve: the served model, or a 404 as OpenAI answers an unknown id.
    http.Get(R"(/v1/models/(.+))", [this, model_object](const httplib::Request& q, httplib::Response& s) {
      const std::string want = q.matches.size() > 1 ? std::string(q.matches[1]) : std::string();
      if (want != opts.model_name)
        return fail(s, ApiError{404, fmt::format("The model '{}' does not exist", want), "invalid_request_error",
                                "model", "model_not_found"});
      s.set_content(dump(model_object()), "application/json");
    });
    // As vLLM: 200 with an empty body while serving; 503 while draining.
    http.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      if (draining) return fail(s, ApiError{503, "the server is shutting down", "unavailable_error", "", ""});
      s.status = 200;
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      std::string extra = "# HELP tpu_serve_http_errors_total Requests answered with an error status.\n"
                          "# TYPE tpu_serve_http_errors_total counter\n";
      {
        std::lock_guard<std::mutex> lk(err_mu);
        for (auto [code, n] : http_errors) extra += fmt::format("tpu_serve_http_errors_total{{code=\"{}\"}} {}\n", code, n);
      }
      extra += device_metrics(model->device(), engine.metrics().generation_tokens);
      s.set_content(serve::prometheus_text(engine.metrics(), extra, opts.model_name), "text/plain; version=0.0.4");
    });
    http.set_error_handler([this](const httplib::Request& q, httplib::Response& s) {
      if (!s.body.empty()) return;
      const std::string msg = s.status == 404 ? fmt::format("no route {} {}", q.method, q.path)
                              : s.status == 413 ? std::string("the request body is too large")
                                                : fmt::format("HTTP error {}", s.status);
      fail(s, ApiError{s.status, msg, s.status == 404 ? "not_found_error" : "invalid_request_error", "", ""});
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& s, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      fail(s, ApiError{500, msg, "internal_error", "", ""});
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
