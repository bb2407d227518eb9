// A small command-line parser shared by the tools and the examples (header-only, standard
// library only, so either layer may include it): named options with a value, flags,
// positional arguments, and a usage text printed on --help / -h.
//
//   tpu::cli::Parser p("sim_mlp", "An MLP block on the simulated chip, eager and compiled.");
//   p.value("--tokens", "N", "rows of x (default 256)", [&](const std::string& v) { tokens = p.to_int(v); });
//   p.flag("--json", "print JSON", [&] { json = true; });
//   if (auto rc = p.parse(argc, argv)) return *rc;   // --help: 0, a bad argument: 2
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpu::cli {

class Parser {
 public:
  Parser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

  // --name VALUE
  Parser& value(std::string name, std::string meta, std::string help, std::function<void(const std::string&)> set) {
    opts_.push_back({std::move(name), std::move(meta), std::move(help), std::move(set), {}});
    return *this;
  }
  // --name
  Parser& flag(std::string name, std::string help, std::function<void()> set) {
    opts_.push_back({std::move(name), {}, std::move(help), {}, std::move(set)});
    return *this;
  }
  // Positional arguments are accepted (collected into `positionals()`) when described here.
  Parser& positional(std::string meta, std::string help) {
    pos_help_.push_back({std::move(meta), std::move(help)});
    return *this;
  }
  // Free text after the option list (sub-commands, notes).
  Parser& epilog(std::string text) {
    epilog_ = std::move(text);
    return *this;
  }

  std::string usage() const {
    std::string s = "usage: " + program_;
    for (const auto& o : opts_) s += " [" + o.name + (o.meta.empty() ? "" : " " + o.meta) + "]";
    for (const auto& p : pos_help_) s += " " + p.first;
    s += "\n" + summary_ + "\n\noptions:\n";
    auto line = [&](const std::string& left, const std::string& help) {
      std::string l = "  " + left;
      if (l.size() < 26) l.resize(26, ' ');
      else l += "  ";
      s += l + help + "\n";
    };
    line("-h, --help", "print this help and exit");
    for (const auto& o : opts_) line(o.name + (o.meta.empty() ? "" : " " + o.meta), o.help);
    for (const auto& p : pos_help_) line(p.first, p.second);
    if (!epilog_.empty()) s += "\n" + epilog_ + "\n";
    return s;
  }

  // Parses argv[first..]. nullopt: go on; otherwise the exit code to return (0 after --help,
  // which prints the usage on stdout; 2 after a bad argument, reported on stderr).
  std::optional<int> parse(int argc, char** argv, int first = 1) {
    for (int i = first; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(usage().c_str(), stdout);
        return 0;
      }
      const Opt* o = find(a);
      try {
        if (o && o->set_flag) {
          o->set_flag();
        } else if (o) {
          if (i + 1 >= argc) return bad(a + " needs a value (" + o->meta + ")");
          o->set_value(argv[++i]);
        } else if (a.size() > 1 && a[0] == '-' && !is_number(a)) {
          return bad("unknown option '" + a + "'");
        } else if (!pos_help_.empty()) {
          pos_.push_back(a);
        } else {
          return bad("unexpected argument '" + a + "'");
        }
      } catch (const std::exception& e) {
        return bad(a + ": " + e.what());
      }
    }
    return std::nullopt;
  }

  const std::vector<std::string>& positionals() const { return pos_; }

  // Whole-string conversions; a malformed number is an exception the parser reports.
  static int64_t to_int(const std::string& v) {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument("'" + v + "' is not an integer");
    return x;
  }
  static double to_double(const std::string& v) {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size()) throw std::invalid_argument("'" + v + "' is not a number");
    return x;
  }

 private:
  struct Opt {
    std::string name, meta, help;
    std::function<void(const std::string&)> set_value;
    std::function<void()> set_flag;
  };
  const Opt* find(const std::string& a) const {
    for (const auto& o : opts_)
      if (o.name == a) return &o;
    return nullptr;
  }
  static bool is_number(const std::string& a) { return a.size() > 1 && a[0] == '-' && (a[1] >= '0' && a[1] <= '9'); }
  int bad(const std::string& why) const {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", program_.c_str(), why.c_str(), program_.c_str());
    return 2;
  }

  std::string program_, summary_, epilog_;
  std::vector<Opt> opts_;
  std::vector<std::pair<std::string, std::string>> pos_help_;
  std::vector<std::string> pos_;
};

}  // namespace tpu::cli
