// tpu-run: starts the ranks of a tpu::dist job, as torchrun / mpirun do.
//
//   tpu-run -n 4 ./app args...                 4 ranks on this machine
//   tpu-run -n 8 --hosts a,b ./app args...     ranks 0-3 on host a, 4-7 on host b (ssh)
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// (a free port of this machine unless --master-port). Every line a rank prints is prefixed with
// "[rank] " (stdout to stdout, stderr to stderr). SIGINT / SIGTERM / SIGHUP are forwarded to every
// rank. When a rank exits non-zero or is killed, the others get SIGTERM (then SIGKILL after
// --grace seconds), and tpu-run exits with status 1 after naming the rank and why.
// Ranks on a host that is not this machine (not localhost / 127.x / this host name) are started
// with `ssh -o BatchMode=yes host 'cd $PWD && env RANK=... app args'`: the program must exist
// at the same path there, and MASTER_ADDR (default: the first host) must reach this machine.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  int n = 1;
  std::vector<std::string> hosts;
  std::string master_addr;
  int master_port = 0;
  double grace_s = 3;
  bool prefix = true;
  std::vector<std::string> cmd;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_buf, err_buf;
  bool running = false;
  int status = 0;
};

int g_sig_pipe[2] = {-1, -1};

void on_signal(int sig) {
  char c = static_cast<char>(sig);
  ssize_t r = ::write(g_sig_pipe[1], &c, 1);
  (void)r;
}

constexpr const char* kUsage =
    "usage: tpu-run [-n N] [--hosts h1,h2,...] [--master-addr A] [--master-port P]\n"
    "               [--grace SECONDS] [--no-prefix] [--] program [args...]\n";

// A bad command line: the reason and the usage on stderr, exit status 2.
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "tpu-run: %s\n%s", why, kUsage);
  std::exit(2);
}

// --help: the usage and what each option does on stdout, exit status 0.
[[noreturn]] void help() {
  std::fputs(kUsage, stdout);
  std::fputs("Starts the ranks of a tpu::dist job (as torchrun / mpirun do) and prefixes each line they print\n"
             "with \"[rank] \".\n\n"
             "options:\n"
             "  -h, --help                print this help and exit\n"
             "  -n, --nproc N             number of ranks, 1..4096 (default 1)\n"
             "  --hosts h1,h2,...         spread the ranks over these hosts in blocks (ssh for a host that\n"
             "                            is not this machine; default 127.0.0.1)\n"
             "  --master-addr A           MASTER_ADDR given to the ranks (default: the first host)\n"
             "  --master-port P           MASTER_PORT given to the ranks (default: a free port)\n"
             "  --grace SECONDS           after a rank fails, wait this long before SIGKILL of the others\n"
             "                            (default 3)\n"
             "  --no-prefix               print the ranks' lines without the \"[rank] \" prefix\n"
             "  program [args...]         the program every rank runs\n",
             stdout);
  std::exit(0);
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const char* name) -> std::string {
    if (i + 1 >= argc) usage((std::string(name) + " needs a value").c_str());
    return argv[++i];
  };
  auto number = [&](const char* name, const std::string& v) {
    char* end = nullptr;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') usage((std::string(name) + " '" + v + "' is not a number").c_str());
    return static_cast<int>(x);
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if (a == "-n" || a == "--nproc") o.n = number("-n", value("-n"));
    else if (a == "--hosts") {
      std::string h = value("--hosts");
      for (size_t p = 0; p <= h.size();) {
        size_t q = h.find(',', p);
        if (q == std::string::npos) q = h.size();
        if (q > p) o.hosts.push_back(h.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--master-addr") o.master_addr = value("--master-addr");
    else if (a == "--master-port") o.master_port = number("--master-port", value("--master-port"));
    else if (a == "--grace") o.grace_s = std::atof(value("--grace").c_str());
    else if (a == "--no-prefix") o.prefix = false;
    else if (a == "-h" || a == "--help") help();
    else if (!a.empty() && a[0] == '-') usage(("unknown option " + a).c_str());
    else break;
  }
  for (; i < argc; ++i) o.cmd.push_back(argv[i]);
  if (o.cmd.empty()) usage("no program to run");
  if (o.n < 1 || o.n > 4096) usage("-n must be between 1 and 4096");
  if (o.hosts.empty()) o.hosts.push_back("127.0.0.1");
  if (static_cast<int>(o.hosts.size()) > o.n) usage("more hosts than ranks");
  if (o.master_port < 0 || o.master_port > 65535) usage("--master-port must be 0..65535");
  return o;
}

bool is_local(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 && host == name;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 29500;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

void flush_lines(Rank& r, std::string& buf, FILE* to, bool prefix, bool final) {
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    if (prefix) std::fprintf(to, "[%d] ", r.rank);
    std::fwrite(buf.data() + start, 1, nl - start + 1, to);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (final && !buf.empty()) {
    if (prefix) std::fprintf(to, "[%d] ", r.rank);
    std::fprintf(to, "%s\n", buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

void spawn(Rank& r, const Options& o, const std::string& host, int local_rank, int local_size,
           const std::string& master_addr, int port) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    std::perror("tpu-run: pipe");
    std::exit(1);
  }
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(r.rank)}, {"WORLD_SIZE", std::to_string(o.n)},
      {"LOCAL_RANK", std::to_string(local_rank)}, {"LOCAL_WORLD_SIZE", std::to_string(local_size)},
      {"MASTER_ADDR", master_addr}, {"MASTER_PORT", std::to_string(port)}};
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("tpu-run: fork");
    std::exit(1);
  }
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    std::vector<std::string> argv_s;
    if (is_local(host)) {
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      argv_s = o.cmd;
    } else {
      char cwd[4096] = {};
      std::string remote = "cd ";
      remote += shell_quote(::getcwd(cwd, sizeof(cwd)) ? cwd : ".");
      remote += " && env";
      for (auto& [k, v] : env) remote.append(" ").append(k).append("=").append(shell_quote(v));
      for (auto& a : o.cmd) remote.append(" ").append(shell_quote(a));
      argv_s = {"ssh", "-o", "BatchMode=yes", host, remote};
    }
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "tpu-run: cannot start '%s': %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.out = out[0];
  r.err = err[0];
  r.running = true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (::pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  int port = o.master_port ? o.master_port : free_port();
  std::string master = !o.master_addr.empty() ? o.master_addr : (is_local(o.hosts[0]) && o.hosts.size() == 1 ? "127.0.0.1" : o.hosts[0]);
  std::vector<Rank> ranks(static_cast<size_t>(o.n));
  int nh = static_cast<int>(o.hosts.size());
  for (int h = 0; h < nh; ++h) {  // host h runs a contiguous block of ranks
    int lo = o.n * h / nh, hi = o.n * (h + 1) / nh;
    for (int r = lo; r < hi; ++r) {
      ranks[static_cast<size_t>(r)].rank = r;
      spawn(ranks[static_cast<size_t>(r)], o, o.hosts[static_cast<size_t>(h)], r - lo, hi - lo, master, port);
    }
  }

  int failed_rank = -1, forwarded = 0;
  std::string why;
  bool terminating = false;
  auto kill_deadline = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& r : ranks)
      if (r.running) ::kill(r.pid, sig);
  };
  for (;;) {
    std::vector<pollfd> fds{{g_sig_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, bool>> who{{nullptr, false}};
    for (auto& r : ranks) {
      if (r.out >= 0) fds.push_back({r.out, POLLIN, 0}), who.push_back({&r, true});
      if (r.err >= 0) fds.push_back({r.err, POLLIN, 0}), who.push_back({&r, false});
    }
    bool any_running = false;
    for (auto& r : ranks) any_running = any_running || r.running;
    if (!any_running && fds.size() == 1) break;
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      char sigs[64];
      ssize_t k = ::read(g_sig_pipe[0], sigs, sizeof(sigs));
      for (ssize_t j = 0; j < k; ++j) {
        int sig = sigs[j];
        if (sig == SIGCHLD) continue;
        forwarded = sig;
        stop_all(sig);  // forward to every rank
        if (!terminating) {
          terminating = true;
          kill_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(o.grace_s * 1000));
        }
      }
    }
    for (size_t f = 1; f < fds.size(); ++f) {
      if (fds[f].revents == 0) continue;
      Rank& r = *who[f].first;
      int& fd = who[f].second ? r.out : r.err;
      std::string& buf = who[f].second ? r.out_buf : r.err_buf;
      char tmp[65536];
      ssize_t k = ::read(fd, tmp, sizeof(tmp));
      if (k > 0) {
        buf.append(tmp, static_cast<size_t>(k));
        flush_lines(r, buf, who[f].second ? stdout : stderr, o.prefix, false);
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        flush_lines(r, buf, who[f].second ? stdout : stderr, o.prefix, true);
        ::close(fd);
        fd = -1;
      }
    }
    for (auto& r : ranks) {  // reap
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failed_rank < 0 && !terminating) {
        failed_rank = r.rank;
        why = describe_status(status);
        terminating = true;
        stop_all(SIGTERM);
        kill_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(o.grace_s * 1000));
      }
    }
    if (terminating && std::chrono::steady_clock::now() >= kill_deadline) {
      stop_all(SIGKILL);
      kill_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  if (failed_rank >= 0) {
    std::fprintf(stderr, "tpu-run: rank %d %s; stopped the other ranks\n", failed_rank, why.c_str());
    return 1;
  }
  if (forwarded) {
    std::fprintf(stderr, "tpu-run: stopped by signal %s (forwarded to every rank)\n", strsignal(forwarded));
    return 128 + forwarded;
  }
  for (auto& r : ranks)
    if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) {
      std::fprintf(stderr, "tpu-run: rank %d %s\n", r.rank, describe_status(r.status).c_str());
      return 1;
    }
  return 0;
}
