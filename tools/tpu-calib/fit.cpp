#include "tools/tpu-calib/fit.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "sim/timing_model.h"

namespace tpu::calib {
namespace {

struct Knob {
  std::string name;
  std::function<double&(sim::ChipConfig&)> ref;
  double lo, hi;
};

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"launch_cycles", [](sim::ChipConfig& c) -> double& { return c.timing.launch_cycles; }, 100, 5000},
      {"mxu_efficiency", [](sim::ChipConfig& c) -> double& { return c.timing.mxu_efficiency; }, 0.05, 1},
      {"hbm_efficiency", [](sim::ChipConfig& c) -> double& { return c.timing.hbm_efficiency; }, 0.05, 1},
      {"wide_hbm_efficiency", [](sim::ChipConfig& c) -> double& { return c.timing.wide_hbm_efficiency; }, 0.05, 1},
      {"reduce_cycles", [](sim::ChipConfig& c) -> double& { return c.timing.reduce_cycles; }, 1, 5000},
      {"dma_cycles", [](sim::ChipConfig& c) -> double& { return c.timing.dma_cycles; }, 0.1, 1000},
      {"weight_load_exposed", [](sim::ChipConfig& c) -> double& { return c.timing.weight_load_exposed; }, 0.01, 1},
  };
  return k;
}

// The XLA feed constants: only the samples with a feed (matmul_large) depend on them.
const std::vector<Knob>& feed_knobs() {
  static const std::vector<Knob> k = {
      {"convert_elems_per_cycle", [](sim::ChipConfig& c) -> double& { return c.timing.convert_elems_per_cycle; }, 1, 1e5},
      {"restream_elems_per_cycle", [](sim::ChipConfig& c) -> double& { return c.timing.restream_elems_per_cycle; }, 1, 1e5},
  };
  return k;
}

double feed_mape(const sim::ChipConfig& cfg, const std::vector<const Sample*>& train) {
  std::vector<double> meas, sim;
  for (const Sample* s : train)
    if (s->feed) meas.push_back(s->measured_us), sim.push_back(priced_us(cfg, *s));
  return score(meas, sim).mape;
}

// Multiplicative coordinate search: each constant tries x (1 +- step) while that helps; the step
// halves when no constant moves (bounded: at most 200 rounds, steps down to 1e-3).
template <class Objective_>
sim::ChipConfig coordinate_search(const sim::ChipConfig& start, const std::vector<Knob>& ks, const Objective_& score_of) {
  sim::ChipConfig best = start;
  double best_obj = score_of(best);
  double step = 0.25;
  for (int round = 0; round < 200 && step > 1e-3; ++round) {
    bool moved = false;
    for (const Knob& k : ks) {
      sim::ChipConfig probe = start;
      if (k.ref(probe) == 0) continue;  // not a constant of this chip's model
      for (double dir : {1.0, -1.0}) {
        sim::ChipConfig c = best;
        double& v = k.ref(c);
        v = std::clamp(v * (1 + dir * step), k.lo, k.hi);
        const double o = score_of(c);
        if (o < best_obj - 1e-9) best = c, best_obj = o, moved = true;
      }
    }
    if (!moved) step /= 2;
  }
  return best;
}

double objective(const sim::ChipConfig& cfg, const std::vector<const Sample*>& train, const Objective& obj) {
  const size_t sets = obj.max_mape.size();
  std::vector<std::vector<double>> meas(sets), sim(sets);
  for (const Sample* s : train) {
    if (!obj.fitted[s->set]) continue;
    meas[s->set].push_back(s->measured_us);
    sim[s->set].push_back(priced_us(cfg, *s));
  }
  double sum = 0, used = 0;
  for (size_t i = 0; i < sets; ++i) {
    if (meas[i].empty()) continue;
    const Fit f = score(meas[i], sim[i]);
    sum += f.mape + 5 * std::max(0.0, f.mape - obj.max_mape[i]);
    if (obj.r2_target[i] && f.span > 10) sum += 1000 * std::max(0.0, 0.982 - f.r2);
    used += 1;
  }
  return used > 0 ? sum / used : 0;
}

}  // namespace

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
  const auto [lo, hi] = std::minmax_element(meas.begin(), meas.end());
  f.span = *lo > 0 ? *hi / *lo : 0;
  return f;
}

double priced_us(const sim::ChipConfig& cfg, const Sample& s) {
  double cycles = 0;
  for (const auto& w : s.works) cycles += sim::calibrated_cycles(cfg, w);
  if (s.feed) cycles = sim::xla_matmul_cycles(cfg, *s.feed, cycles);
  return cycles / (cfg.clock_ghz * 1e3);
}

const std::vector<std::string>& fitted_constants() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& k : knobs()) v.push_back(k.name);
    return v;
  }();
  return names;
}

sim::ChipConfig refit(const sim::ChipConfig& start, const std::vector<const Sample*>& train, const Objective& obj) {
  const sim::ChipConfig main = coordinate_search(start, knobs(), [&](const sim::ChipConfig& c) { return objective(c, train, obj); });
  return coordinate_search(main, feed_knobs(), [&](const sim::ChipConfig& c) { return feed_mape(c, train); });
}

std::vector<double> cross_validate(const sim::ChipConfig& start, const std::vector<Sample>& samples, const Objective& obj,
                                   int folds, std::vector<sim::ChipConfig>* fold_cfgs) {
  std::vector<double> pred(samples.size(), 0);
  for (int f = 0; f < folds; ++f) {
    std::vector<const Sample*> train;
    for (const auto& s : samples)
      if (int(s.fold_key % size_t(folds)) != f) train.push_back(&s);
    const sim::ChipConfig cfg = refit(start, train, obj);
    if (fold_cfgs) fold_cfgs->push_back(cfg);
    for (size_t i = 0; i < samples.size(); ++i)
      if (int(samples[i].fold_key % size_t(folds)) == f) pred[i] = priced_us(cfg, samples[i]);
  }
  return pred;
}

}  // namespace tpu::calib
