// Scoring and re-fitting for tpu-calib: MAPE and R^2 of a set, and a k-fold cross-validation
// that re-fits the calibrated model's constants on k-1 folds of the rows (every set's rows dealt
// round-robin into folds, as the data's own halves were) and predicts the held-out fold from the
// rows' counted work (sim::Stats::work re-priced by sim::calibrated_cycles), so the report
// estimates the error on rows the constants never saw.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sim/config.h"
#include "sim/stats.h"
#include "sim/timing_model.h"

namespace tpu::calib {

struct Fit {
  double mape = 0, r2 = 0, span = 0;  // span: largest / smallest measured time
  size_t n = 0;
};
Fit score(const std::vector<double>& measured, const std::vector<double>& simulated);

// One simulated row as the fit sees it.
struct Sample {
  size_t set = 0;       // index of its set
  size_t fold_key = 0;  // its index within the set
  double measured_us = 0;
  std::vector<sim::CountedWork> works;
  std::optional<sim::XlaMatmulFeed> feed;  // priced through sim::xla_matmul_cycles when set
};

// Microseconds of `s` on `cfg`'s calibrated model.
double priced_us(const sim::ChipConfig& cfg, const Sample& s);

// The constants the fit moves (TimingConfig fields), by name.
const std::vector<std::string>& fitted_constants();

// The fit's objective: the mean over the fitted sets of their MAPE, plus 5x every point a set's
// MAPE exceeds its target and 1000x every unit its R^2 falls below 0.982 where R^2 is a target
// and the set spans more than 10x (so no set is traded away for the others).
struct Objective {
  std::vector<double> max_mape;  // per set, percent
  std::vector<bool> fitted;      // per set
  std::vector<bool> r2_target;   // per set
};

// Minimizes the objective on `train` by coordinate search over the fitted constants that are in
// use (nonzero) in `start`, starting from their values there; then the XLA feed constants
// (convert/restream_elems_per_cycle, if in use) the same way on the MAPE of the samples with a feed
// (matmul_large), which no other set's price depends on.
sim::ChipConfig refit(const sim::ChipConfig& start, const std::vector<const Sample*>& train, const Objective& obj);

// k-fold cross-validation: the held-out prediction of every sample (same order as `samples`),
// and the constants fitted on each fold's complement (in `fold_cfgs`).
std::vector<double> cross_validate(const sim::ChipConfig& start, const std::vector<Sample>& samples, const Objective& obj,
                                   int folds, std::vector<sim::ChipConfig>* fold_cfgs);

}  // namespace tpu::calib
