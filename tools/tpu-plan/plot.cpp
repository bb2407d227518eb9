// --plot: MFU and tokens/s per chip against slice size as a small SVG line chart.
#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "tools/tpu-plan/plan.h"

namespace tpu::plan {

void write_scaling_svg(const std::string& path, const std::string& title, const std::vector<Plan>& plans) {
  if (plans.empty()) throw PlanError("--plot: no plan to draw");
  const double W = 640, H = 400, L = 70, R = 70, T = 40, B = 50;
  const double x0 = std::log2(double(plans.front().chips)), x1 = std::max(x0 + 1, std::log2(double(plans.back().chips)));
  double tmax = 0;
  for (const Plan& p : plans) tmax = std::max(tmax, p.tokens_per_s_per_chip);
  tmax = tmax > 0 ? tmax * 1.1 : 1;
  auto px = [&](const Plan& p) { return L + (std::log2(double(p.chips)) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double frac) { return H - B - frac * (H - T - B); };
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
                              "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                              W, H);
  s += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n", W / 2, title);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", L, H - B, W - R);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", L, T, H - B);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", W - R, T, H - B);
  for (int i = 0; i <= 5; ++i) {
    const double f = i / 5.0;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#1f77b4\">{:.0f}%</text>\n", L - 6, py(f) + 4, 100 * f);
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#d62728\">{:.0f}</text>\n", W - R + 6, py(f) + 4, f * tmax);
  }
  for (const Plan& p : plans)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(p), H - B + 16, p.chips);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">chips in the slice</text>\n", W / 2, H - 12);
  auto line = [&](const char* colour, auto y, const char* label, double ly) {
    std::string pts;
    for (const Plan& p : plans) pts += fmt::format("{:.1f},{:.1f} ", px(p), y(p));
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, colour);
    for (const Plan& p : plans) s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(p), y(p), colour);
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", L + 10, ly, colour, label);
  };
  line("#1f77b4", [&](const Plan& p) { return py(std::min(1.0, p.mfu)); }, "MFU (left axis)", T + 14);
  line("#d62728", [&](const Plan& p) { return py(p.tokens_per_s_per_chip / tmax); }, "tokens/s per chip (right axis)", T + 30);
  s += "</svg>\n";
  std::ofstream f(path);
  if (!f) throw PlanError(fmt::format("--plot: cannot write '{}'", path));
  f << s;
}

}  // namespace tpu::plan
