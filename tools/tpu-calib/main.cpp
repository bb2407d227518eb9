// tpu-calib: the calibration report. Runs every shape of the measured TPU v4 data
// (sim/calibration/tpu_v4) through the library path users run - eager tpu::matmul /
// elementwise ops / relu and the same through tpu::compile - on a simulated device in
// timing-only mode, and compares the simulated kernel times with the measured ones: per set
// and overall mean absolute percentage error (MAPE), R^2 of measured against simulated, and the
// worst shapes. Exit status 1 when a threshold given on the command line is missed.
//
//   tpu-calib [--data DIR] [--chip NAME] [--stride N] [--paths eager,compiled] [--worst N]
//             [--max-mape PCT] [--min-r2 R2] [--max-ele-mape PCT] [--csv OUT]
// --csv writes one line per shape and path: set, kernel, path, measured_us, simulated_us.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/launch.h"
#include "device/sim_driver.h"
#include "tools/cli_args.h"
#include "tpucore/compile.h"
#include "tpucore/devices.h"
#include "tpucore/ops.h"
#include "tpucore/streams.h"

namespace {

struct Row {
  std::string set, name;
  std::vector<int64_t> shape;  // matmul: m, n, k; elementwise: tensor shape
  std::string op;              // matmul, relu, add, sub, mul, div, ...
  double measured_us = 0;
};

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool q = false;
  for (char c : line) {
    if (c == '"') q = !q;
    else if (c == ',' && !q) out.push_back(cur), cur.clear();
    else cur += c;
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

std::vector<Row> load(const std::string& dir, const std::string& file, const std::string& set) {
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
  const bool mm = set.rfind("matmul", 0) == 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto f = split_csv(line);
    Row r;
    r.set = set;
    r.name = f[col("kernel_name")];
    if (mm) {
      r.op = "matmul";
      r.shape = {std::stoll(f[col("dim_m")]), std::stoll(f[col("dim_n")]), std::stoll(f[col("dim_k")])};
      r.measured_us = std::stod(f[col("fusion_avg")]);
    } else {
      r.op = r.name.substr(0, r.name.find('_'));
      r.shape = dims_in(r.name);
      r.measured_us = std::stod(f[col("avg_duration_us")]);
    }
    rows.push_back(r);
  }
  return rows;
}

const tpu::Device kDev("sim:0");

tpu::Tensor apply(const std::string& op, const tpu::Tensor& a, const tpu::Tensor& b) {
  if (op == "matmul") return tpu::matmul(a, b);
  if (op == "relu") return tpu::relu(a);
  if (op == "add") return tpu::add(a, b);
  if (op == "sub") return tpu::sub(a, b);
  if (op == "mul") return tpu::mul(a, b);
  if (op == "div") return tpu::div(a, b);
  if (op == "max" || op == "maximum") return tpu::maximum(a, b);
  if (op == "min" || op == "minimum") return tpu::minimum(a, b);
  throw std::runtime_error("unknown op " + op);
}

// Simulated microseconds of one call (all programs it runs), or -1 if any part ran on the host.
double simulate(const Row& r, bool compiled) {
  const tpu::DType bf = tpu::DType::bf16;  // the MXU's input type; the data's float16 has the same bytes
  tpu::Tensor a, b;
  if (r.op == "matmul") {
    a = tpu::empty({r.shape[0], r.shape[2]}, {bf, kDev});
    b = tpu::empty({r.shape[2], r.shape[1]}, {bf, kDev});
  } else {
    a = tpu::empty(r.shape, {bf, kDev});
    b = tpu::empty(r.shape, {bf, kDev});
  }
  std::function<tpu::Tensor()> call;
  if (compiled) {
    auto f = tpu::compile([op = r.op](const tpu::Tensor& x, const tpu::Tensor& y) { return apply(op, x, y); },
                          {.name = "calib_" + r.op});
    (void)f(a, b);  // first call traces and builds
    tpu::synchronize(kDev);
    tpu::codegen::reset_stats();
    (void)f(a, b);
  } else {
    (void)apply(r.op, a, b);  // warm the program cache
    tpu::synchronize(kDev);
    tpu::codegen::reset_stats();
    (void)apply(r.op, a, b);
  }
  tpu::synchronize(kDev);
  const auto s = tpu::codegen::stats();
  if (s.host_fallbacks > 0 || s.runs == 0) return -1;
  return s.cycles / (tpu::device::sim_device(0).config().clock_ghz * 1e3);
}

struct Fit {
  double mape = 0, r2 = 0;
  size_t n = 0;
};

Fit score(const std::vector<double>& meas, const std::vector<double>& sim) {
  Fit f;
  f.n = meas.size();
  if (f.n == 0) return f;
  double mean = 0, ss_tot = 0, ss_res = 0;
  for (size_t i = 0; i < f.n; ++i) f.mape += std::abs(sim[i] - meas[i]) / meas[i], mean += meas[i];
  f.mape *= 100.0 / double(f.n);
  mean /= double(f.n);
  for (size_t i = 0; i < f.n; ++i)
    ss_tot += (meas[i] - mean) * (meas[i] - mean), ss_res += (meas[i] - sim[i]) * (meas[i] - sim[i]);
  f.r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 0;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = TPU_CALIB_DATA_DIR, chip = "v4", paths = "eager,compiled", csv_path;
  int64_t stride = 1, worst = 5;
  double max_mape = -1, min_r2 = -1, max_ele_mape = -1;
  tpu::cli::Parser p("tpu-calib", "Simulated against measured TPU v4 kernel times: MAPE, R^2 and the worst shapes per set.");
  p.value("--data", "DIR", "folder of the measured CSVs (default: the in-tree sim/calibration/tpu_v4)",
          [&](const std::string& v) { dir = v; });
  p.value("--chip", "PRESET", "chip preset (default v4; v4-ideal for the ideal timing model)",
          [&](const std::string& v) { chip = v; });
  p.value("--stride", "K", "use every K-th row only (default 1)",
          [&](const std::string& v) { stride = std::max<int64_t>(1, p.to_int(v)); });
  p.value("--paths", "LIST", "eager,compiled or one of them (default both)", [&](const std::string& v) { paths = v; });
  p.value("--worst", "N", "worst shapes listed per set (default 5)", [&](const std::string& v) { worst = p.to_int(v); });
  p.value("--max-mape", "PCT", "fail when the matmul MAPE is above", [&](const std::string& v) { max_mape = p.to_double(v); });
  p.value("--min-r2", "R2", "fail when the matmul R^2 is below", [&](const std::string& v) { min_r2 = p.to_double(v); });
  p.value("--max-ele-mape", "PCT", "fail when the elementwise/relu MAPE is above",
          [&](const std::string& v) { max_ele_mape = p.to_double(v); });
  p.value("--csv", "FILE", "write every row's measured and simulated time", [&](const std::string& v) { csv_path = v; });
  if (auto rc = p.parse(argc, argv)) return *rc;
  setenv("TPU_SIM_CHIP", chip.c_str(), 1);  // before the first use of a sim device
  std::vector<Row> rows;
  try {
    for (auto [file, set] : {std::pair{"matmul_128.csv", "matmul_128"}, {"matmul_1024.csv", "matmul_1024"},
                             {"matmul_4096.csv", "matmul_4096"}, {"ele.csv", "ele"}, {"relu1.csv", "relu"}}) {
      auto part = load(dir, file, set);
      for (size_t i = 0; i < part.size(); i += size_t(stride)) rows.push_back(part[i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpu-calib: %s\n", e.what());
    return 2;
  }
  std::FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "tpu-calib: cannot write %s\n", csv_path.c_str());
      return 2;
    }
    std::fprintf(csv, "set,kernel,path,measured_us,simulated_us\n");
  }
  tpu::codegen::set_timing_only(true);
  std::printf("calibration report: chip preset %s (%s timing model), measured TPU v4 times from %s (every %ld. row)\n",
              chip.c_str(), tpu::device::sim_device(0).config().timing.model.c_str(), dir.c_str(), long(stride));
  bool ok = true;
  for (const std::string path : {"eager", "compiled"}) {
    if (paths.find(path) == std::string::npos) continue;
    std::vector<double> all_m, all_s, mm_m, mm_s, el_m, el_s;
    struct Err {
      double err;
      const Row* r;
      double sim;
    };
    std::vector<Err> errs;
    std::printf("\n%s path\n%-12s %6s %9s %8s\n", path.c_str(), "set", "shapes", "MAPE %", "R^2");
    for (const std::string set : {"matmul_128", "matmul_1024", "matmul_4096", "ele", "relu"}) {
      std::vector<double> m, s;
      size_t skipped = 0;
      for (const auto& r : rows) {
        if (r.set != set) continue;
        double us = -1;
        try {
          us = simulate(r, path == "compiled");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: %s\n", r.name.c_str(), e.what());
        }
        if (us <= 0) {
          ++skipped;
          continue;
        }
        m.push_back(r.measured_us), s.push_back(us);
        if (csv) std::fprintf(csv, "%s,\"%s\",%s,%.6g,%.6g\n", set.c_str(), r.name.c_str(), path.c_str(), r.measured_us, us);
        errs.push_back({std::abs(us - r.measured_us) / r.measured_us, &r, us});
        (set.rfind("matmul", 0) == 0 ? mm_m : el_m).push_back(r.measured_us);
        (set.rfind("matmul", 0) == 0 ? mm_s : el_s).push_back(us);
      }
      Fit f = score(m, s);
      std::printf("%-12s %6zu %9.2f %8.4f%s\n", set.c_str(), f.n, f.mape, f.r2,
                  skipped ? (" (" + std::to_string(skipped) + " not simulated: host fallback or error)").c_str() : "");
      if (skipped) ok = false;
      all_m.insert(all_m.end(), m.begin(), m.end()), all_s.insert(all_s.end(), s.begin(), s.end());
    }
    Fit mm = score(mm_m, mm_s), el = score(el_m, el_s), all = score(all_m, all_s);
    std::printf("%-12s %6zu %9.2f %8.4f\n%-12s %6zu %9.2f %8.4f\n%-12s %6zu %9.2f %8.4f\n", "matmul", mm.n, mm.mape,
                mm.r2, "ele+relu", el.n, el.mape, el.r2, "all", all.n, all.mape, all.r2);
    std::sort(errs.begin(), errs.end(), [](const Err& x, const Err& y) { return x.err > y.err; });
    std::printf("worst shapes:\n");
    for (size_t i = 0; i < errs.size() && i < size_t(worst); ++i)
      std::printf("  %-28s measured %9.2f us  simulated %9.2f us  (%+.1f%%)\n", errs[i].r->name.c_str(),
                  errs[i].r->measured_us, errs[i].sim, 100 * (errs[i].sim / errs[i].r->measured_us - 1));
    if (max_mape >= 0 && mm.mape > max_mape) ok = false, std::printf("FAIL: %s matmul MAPE above %.2f%%\n", path.c_str(), max_mape);
    if (min_r2 >= 0 && mm.r2 < min_r2) ok = false, std::printf("FAIL: %s matmul R^2 below %.4f\n", path.c_str(), min_r2);
    if (max_ele_mape >= 0 && el.mape > max_ele_mape)
      ok = false, std::printf("FAIL: %s elementwise/relu MAPE above %.2f%%\n", path.c_str(), max_ele_mape);
  }
  if (csv) std::fclose(csv);
  std::printf("\n%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
