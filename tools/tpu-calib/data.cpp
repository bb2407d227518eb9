#include "tools/tpu-calib/data.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tpu::calib {
namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool q = false;
  for (char c : line) {
    if (c == '"') q = !q;
    else if (c == ',' && !q) out.push_back(cur), cur.clear();
    else if (c != '\r') cur += c;
  }
  out.push_back(cur);
  return out;
}

std::vector<int64_t> dims_in(const std::string& s) {  // "relu_(32, 8, 32)" -> {32, 8, 32}
  std::vector<int64_t> d;
  auto open = s.find('(');
  if (open == std::string::npos) return d;
  std::stringstream ss(s.substr(open + 1));
  int64_t v;
  char sep;
  while (ss >> v) {
    d.push_back(v);
    if (!(ss >> sep) || sep == ')') break;
  }
  return d;
}

// "leaky_relu_(8, 8)" -> "leaky_relu"; "div_(1024, 1024)" -> "div"
std::string op_of(const std::string& name) {
  auto p = name.find("_(");
  return p == std::string::npos ? name.substr(0, name.find('_')) : name.substr(0, p);
}

}  // namespace

const std::vector<SetSpec>& set_specs() {
  static const std::vector<SetSpec> s = {
      {"matmul_128.csv", "matmul_128", Kind::matmul, 10, false, true},
      {"matmul_1024.csv", "matmul_1024", Kind::matmul, 11, false, true},
      {"matmul_4096.csv", "matmul_4096", Kind::matmul, 10, false, true},
      {"matmul_large.csv", "matmul_large", Kind::matmul, 15, true, false},
      {"ele.csv", "ele", Kind::binary, 10, false, true},
      {"add_2d_1.csv", "add_2d", Kind::binary, 10, true, true},
      {"relu1.csv", "relu", Kind::unary, 10, false, true},
      {"act1.csv", "act1", Kind::unary, 10, true, true},
      {"act2.csv", "act2", Kind::unary, 10, true, true},
      {"layer_norm3_calls.csv", "norm", Kind::norm, 10, true, true}};
  return s;
}

std::vector<Row> load_set(const std::string& dir, const SetSpec& spec) {
  const std::string file = spec.file;
  std::ifstream in(dir + "/" + file);
  if (!in) throw std::runtime_error("cannot open " + dir + "/" + file);
  std::string line;
  std::getline(in, line);
  auto head = split_csv(line);
  auto col = [&](const std::string& n) {
    auto it = std::find(head.begin(), head.end(), n);
    if (it == head.end()) throw std::runtime_error(file + ": no column " + n);
    return size_t(it - head.begin());
  };
  std::vector<Row> rows;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    auto f = split_csv(line);
    if (f.size() != head.size())
      throw std::runtime_error(file + ":" + std::to_string(line_no) + ": " + std::to_string(f.size()) + " fields, header has " +
                               std::to_string(head.size()));
    Row r;
    r.set = spec.set;
    r.kind = spec.kind;
    r.name = f[col("kernel_name")];
    try {
      switch (spec.kind) {
        case Kind::matmul:
          r.op = "matmul";
          r.shape = {std::stoll(f[col("dim_m")]), std::stoll(f[col("dim_n")]), std::stoll(f[col("dim_k")])};
          r.measured_us = std::stod(f[col("fusion_avg")]);
          if (std::find(head.begin(), head.end(), "prefetched") != head.end()) {
            r.prefetched = f[col("prefetched")];
            r.a_layout = f[col("a_layout")], r.b_layout = f[col("b_layout")], r.out_layout = f[col("out_layout")];
            if (r.prefetched != "A" && r.prefetched != "B")
              throw std::runtime_error(file + ":" + std::to_string(line_no) + ": prefetched must be A or B, not '" + r.prefetched + "'");
            for (const std::string* l : {&r.a_layout, &r.b_layout, &r.out_layout})
              if (*l != "{1,0}" && *l != "{0,1}")
                throw std::runtime_error(file + ":" + std::to_string(line_no) + ": layout must be {1,0} or {0,1}, not '" + *l + "'");
          }
          break;
        case Kind::norm:
          r.op = f[col("op")];
          r.shape = {std::stoll(f[col("dim_0")]), std::stoll(f[col("dim_1")]), std::stoll(f[col("dim_2")])};
          r.measured_us = std::stod(f[col("call_us")]);
          r.kernels = std::stoi(f[col("fusions")]);
          break;
        default:
          r.op = op_of(r.name);
          r.shape = dims_in(r.name);
          r.measured_us = std::stod(f[col("avg_duration_us")]);
      }
    } catch (const std::logic_error&) {
      throw std::runtime_error(file + ":" + std::to_string(line_no) + ": not a number in '" + line + "'");
    }
    if (r.shape.empty() || r.measured_us <= 0)
      throw std::runtime_error(file + ":" + std::to_string(line_no) + ": no shape or time in '" + line + "'");
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace tpu::calib
