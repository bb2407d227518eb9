// The tpu-serve binary: it loads a checkpoint folder, answers on 127.0.0.1, and on SIGTERM
// refuses new requests (503 while draining, or the listener is gone), cancels a long running
// stream after the drain time (the stream still ends with a finish_reason and [DONE]) and
// exits 0, all within bounded time.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "serve/serve_testing.h"

using namespace tpu;
using namespace tpu::testing::serve;
using nlohmann::json;

TEST_CASE("tpu-serve binary: SIGTERM refuses new requests, cancels long ones after the drain time, exits 0", "[serve][http]") {
  const auto dir = write_model_dir(41);
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(TPU_SERVE_EXE, TPU_SERVE_EXE, "--model", dir.c_str(), "--port", "0", "--served-model-name", "tiny",
          "--drain-seconds", "0.05", "--max-model-len", "2048", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  // A start-up line names the port: "tpu-serve: model 'tiny' (... parameters) on http://127.0.0.1:PORT".
  std::string line;
  char ch;
  for (int lines = 0; lines < 10 && line.find("http://") == std::string::npos; ++lines) {
    line.clear();
    while (line.find('\n') == std::string::npos && read(out[0], &ch, 1) == 1) line += ch;
  }
  const auto colon = line.rfind(':');
  REQUIRE(colon != std::string::npos);
  struct Port {
    int port;
    httplib::Client client() const {
      httplib::Client c("127.0.0.1", port);
      c.set_connection_timeout(5);
      c.set_read_timeout(20);
      return c;
    }
  } srv{std::stoi(line.substr(colon + 1))};
  {
    auto h = srv.client().Get("/health");
    REQUIRE(h);
    CHECK(h->status == 200);
  }
  // A short request, then a long stream (2000 tokens); SIGTERM as soon as the long one is
  // running (on an idle machine the tiny model streams 2000 tokens in well under a second, so
  // the drain time is short and nothing else runs in between).
  {
    auto res = srv.client().Post("/v1/completions", json{{"prompt", "b"}, {"max_tokens", 3}, {"ignore_eos", true}}.dump(),
                                 "application/json");
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(json::parse(res->body)["choices"][0]["finish_reason"] == "length");
  }
  std::atomic<bool> long_started{false};
  std::string long_finish;
  bool long_done = false;
  std::thread long_client([&] {
    httplib::Client c = srv.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "a"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      buf.append(d, n);
      long_started = true;
      return true;
    };
    c.send(req);
    long_done = buf.find("data: [DONE]") != std::string::npos;
    const auto at = buf.rfind("\"finish_reason\":\"");
    if (at != std::string::npos) long_finish = buf.substr(at + 17, buf.find('"', at + 17) - at - 17);
  });
  for (int i = 0; i < 500 && !long_started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(long_started);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(kill(pid, SIGTERM) == 0);
  // The signal is handled on the server's own schedule: on a loaded machine a request sent right
  // after kill() may still be served. Within a bounded wait (at most 100 tries, about 3 s) a new
  // request must be refused: 503 while draining, or no answer once the listener is gone.
  {
    bool refused = false;
    for (int i = 0; i < 100 && !refused; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto res = srv.client().Post("/v1/completions", json{{"prompt", "c"}, {"max_tokens", 3}}.dump(), "application/json");
      refused = !res || res->status == 503;
      if (!refused) CHECK(res->status == 200);
    }
    CHECK(refused);
  }
  int status = -1;
  for (int i = 0; i < 1500; ++i) {  // at most 15 s
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool exited = WIFEXITED(status);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  long_client.join();
  close(out[0]);
  std::filesystem::remove_all(dir);
  CHECK(exited);
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
  CHECK(long_done);
  CHECK(long_finish == "abort");
}

TEST_CASE("tpu-serve binary: device options without their device are errors naming them", "[serve][cli]") {
  // The checks come before the model is read: no checkpoint needed.
  const auto run = [](const std::string& args) {
    FILE* p = popen(fmt::format("env -u TPU_PJRT_PLUGIN {} --model no-such-dir {} 2>&1", TPU_SERVE_EXE, args).c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    const int rc = pclose(p);
    CHECK(WIFEXITED(rc));
    CHECK(WEXITSTATUS(rc) == 1);
    return out;
  };
  CHECK_THAT(run("--chip tiny"), Catch::Contains("--chip tiny needs --device sim:N"));
  CHECK_THAT(run("--pjrt-plugin libpjrt_tpucore_sim.so"), Catch::Contains("--pjrt-plugin needs --device pjrt:N"));
  CHECK_THAT(run("--device sim:0 --no-host-fallback"), Catch::Contains("--no-host-fallback needs --device pjrt:N"));
  CHECK_THAT(run("--device pjrt:0"), Catch::Contains("needs a PJRT plugin: --pjrt-plugin PATH or TPU_PJRT_PLUGIN"));
}
