// Gradient checks: for every differentiable op of the registry, the gradients that backward()
// computes (in f32, through the op's derivative formula) are compared with central finite
// differences of the op's independent double-precision reference from the OpInfo table, on
// every f32 sample of the table (random shapes, broadcasting, transposed/sliced/expanded views,
// 0-d and empty tensors). The loss is sum(w * op(inputs)) with random weights w.
#include <algorithm>
#include <map>
#include <set>

#include "ops/registry.h"
#include "opinfo.h"
#include "tpucore/autograd.h"
#include "tpucore/kernel.h"

namespace tpu::testing {
namespace {

double weighted(const Ref& out, const std::vector<double>& w) {
  double s = 0;
  for (size_t i = 0; i < out.v.size(); ++i) s += w[i] * out.v[i];
  return s;
}
bool all_finite(const Ref& r) {
  return std::all_of(r.v.begin(), r.v.end(), [](double v) { return std::isfinite(v); });
}
bool has_duplicates(const Ref& r) {
  std::set<double> s(r.v.begin(), r.v.end());
  return s.size() != r.v.size();
}
// Ops whose derivative is ambiguous where values tie (the samples with ties are skipped).
bool tie_sensitive(const std::string& op) {
  static const std::set<std::string> s{"amax", "amin", "max_dim", "min_dim", "maximum", "minimum"};
  return s.count(op) > 0;
}

struct Result {
  int64_t checked = 0, skipped_kinks = 0;
};

// Central difference of sum(w * ref(inputs)) with respect to element e of input k, with step h.
double numeric(const OpInfo& info, std::vector<Ref> refs, size_t k, int64_t e, double h, const std::vector<double>& w) {
  const double x0 = refs[k].v[static_cast<size_t>(e)];
  refs[k].v[static_cast<size_t>(e)] = x0 + h;
  const double lp = weighted(info.reference(refs, DType::f32), w);
  refs[k].v[static_cast<size_t>(e)] = x0 - h;
  const double lm = weighted(info.reference(refs, DType::f32), w);
  return (lp - lm) / (2 * h);
}

void gradcheck_sample(const OpInfo& info, const OpSample& s, Generator& g, Result& res) {
  std::vector<Tensor> ins;
  std::vector<Ref> refs;
  std::vector<size_t> diff;  // the inputs differentiated against
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Tensor& t = s.inputs[i];
    refs.push_back(t.defined() ? ref_of(t) : Ref());
    if (!t.defined()) {
      ins.push_back(t);
      continue;
    }
    Tensor leaf = t.detach();
    if (leaf.dtype() == DType::f32 && leaf.numel() > 0) {
      leaf.requires_grad_();
      diff.push_back(i);
    }
    ins.push_back(leaf);
  }
  if (diff.empty()) return;
  // fmod jumps where x / y crosses an integer; a 0-d x broadcast over many y meets a jump
  // within the finite-difference step too often for the kink detector.
  if (info.op == "fmod" && s.inputs[0].dim() == 0) return;
  for (size_t k : diff) {
    if (!all_finite(refs[k])) return;
    if (tie_sensitive(info.op) && has_duplicates(refs[k])) return;
  }
  Tensor out = info.run(ins);
  if (!out.requires_grad() || out.numel() == 0) return;
  const Ref out_ref = ref_of(out);
  if (!all_finite(out_ref)) return;
  // A cast to a 16-bit float rounds: its reference is piecewise constant, while the gradient
  // passes straight through (as PyTorch); only f32 -> f32 paths are checked numerically.
  if (info.op == "to_dtype" && out.dtype() != DType::f32) return;
  std::vector<double> w(static_cast<size_t>(out.numel()));
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    wf[i] = static_cast<float>(0.5 + g.next_double());  // positive weights in [0.5, 1.5)
    w[i] = wf[i];
  }
  out.backward(from_vector(wf, out.shape()));
  for (size_t k : diff) {
    const Tensor gk = ins[k].grad();
    if (!gk.defined()) continue;  // the run passed this input as a Scalar, not as a tensor
    INFO("op " << info.op << " sample '" << s.desc << "' input " << k << " " << ins[k].shape().str());
    const Ref ga = gk.defined() ? ref_of(gk) : Ref(ins[k].shape());
    REQUIRE(ga.shape == ins[k].shape());
    // At most 16 elements per input, spread over it.
    const int64_t n = ins[k].numel();
    const int64_t stride = std::max<int64_t>(1, n / 16);
    for (int64_t e = 0; e < n; e += stride) {
      // The references round their results to f32, so the steps stay large enough for that
      // rounding not to matter, and Richardson extrapolation of two steps removes the h^2 error.
      const double n1 = numeric(info, refs, k, e, 1e-2, w);
      const double n2 = numeric(info, refs, k, e, 5e-3, w);
      if (!std::isfinite(n1) || !std::isfinite(n2) || std::fabs(n1 - n2) > 1e-2 * (1 + std::fabs(n2))) {
        ++res.skipped_kinks;  // not smooth within the step (a kink, a tie or a pole nearby)
        continue;
      }
      const double num = (4 * n2 - n1) / 3;
      const double a = ga.v[static_cast<size_t>(e)];
      INFO("element " << e << ": analytic " << a << " numeric " << num);
      CHECK(std::fabs(a - num) <= 3e-3 * (1 + std::fabs(num)));
      ++res.checked;
    }
  }
}

bool differentiable(const std::string& name) {
  const ops::OpDef* d = ops::find_op(name);
  return d && !d->has(ops::kNonDifferentiable);
}

}  // namespace

TEST_CASE("autograd: every registered op is non-differentiable or has a derivative formula", "[autograd]") {
  std::vector<std::string> missing;
  for (const ops::OpDef* d : ops::all_ops())
    if (!d->has(ops::kNonDifferentiable) && !d->backward.fn && !kernel::is_kernel_op(d->name)) missing.push_back(d->name);
  INFO("ops without a backward formula or kNonDifferentiable: " << fmt::format("{}", fmt::join(missing, ", ")));
  CHECK(missing.empty());
}

TEST_CASE("autograd: gradients of every differentiable op match finite differences of its reference",
          "[autograd][gradcheck]") {
  std::map<std::string, Result> by_op;
  for (const OpInfo& info : opinfo_table()) {
    if (!differentiable(info.op)) continue;
    if (std::find(info.dtypes.begin(), info.dtypes.end(), DType::f32) == info.dtypes.end()) continue;
    DYNAMIC_SECTION(info.op) {
      Generator g(99);
      Result& r = by_op[info.op];
      for (const OpSample& s : info.samples(DType::f32, g)) {
        try {
          gradcheck_sample(info, s, g, r);
        } catch (const std::exception& e) {
          FAIL("op " << info.op << " sample '" << s.desc << "': threw " << e.what());
        }
      }
      INFO("op " << info.op << ": " << r.checked << " gradient elements checked, " << r.skipped_kinks
                 << " skipped near kinks");
      // to_dtype's f32 samples all cast to other dtypes (its straight-through gradient is
      // checked in test_autograd.cpp).
      if (info.op != "to_dtype") CHECK(r.checked > 0);
    }
  }
}

TEST_CASE("autograd: every differentiable op is covered by the gradient check", "[autograd][gradcheck]") {
  std::set<std::string> covered;
  for (const OpInfo& i : opinfo_table())
    if (std::find(i.dtypes.begin(), i.dtypes.end(), DType::f32) != i.dtypes.end()) covered.insert(i.op);
  std::vector<std::string> missing;
  for (const ops::OpDef* d : ops::all_ops())
    if (!d->has(ops::kNonDifferentiable) && !covered.count(d->name) && !kernel::is_kernel_op(d->name))
      missing.push_back(d->name);
  INFO("differentiable ops without f32 OpInfo samples: " << fmt::format("{}", fmt::join(missing, ", ")));
  CHECK(missing.empty());
}

}  // namespace tpu::testing
