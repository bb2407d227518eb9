// tpu-ops: the operator compatibility matrix, generated from the op registry.
//
//   tpu-ops matrix     markdown table: op x cpu / sim eager / sim compiled / gradient
//   tpu-ops list       one line per op: name, arity, flags, doc
//
// Columns (what the registry and codegen declare, per op):
//   cpu           the reference kernel (every op has one)
//   sim eager     "chip" when codegen has a lowering rule (the op runs as a chip program; a
//                 rule may still decline a dtype or layout, which then falls back, counted),
//                 "view" for view ops (no data movement), "host" for the counted host fallback
//   sim compiled  "fused" when the op joins fused vector regions, "kernel" when compiled graphs
//                 run its own chip program, "view", or "host"
//   gradient      "yes" (backward formula), "n/a" (not differentiable), "no"
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/lowering.h"
#include "ops/registry.h"
#include "tools/cli_args.h"

using namespace tpu;

namespace {

std::string sim_eager(const ops::OpDef& op) {
  if (op.has(ops::kView)) return "view";
  const codegen::Lowering* l = codegen::lowering_of(op);
  return l && (l->elementwise || l->eager) ? "chip" : "host";
}

std::string sim_compiled(const ops::OpDef& op) {
  if (op.has(ops::kView)) return "view";
  const codegen::Lowering* l = codegen::lowering_of(op);
  if (l && l->elementwise) return "fused";
  if (l && l->eager) return "kernel";
  return "host";
}

std::string gradient(const ops::OpDef& op) {
  if (op.has(ops::kNonDifferentiable)) return "n/a";
  return op.backward.fn ? "yes" : "no";
}

// The registry's ops by name: registration order follows static initialization, which differs
// between builds, and the docs' table must not.
std::vector<const ops::OpDef*> ops_by_name() {
  auto v = ops::all_ops();
  std::sort(v.begin(), v.end(), [](const ops::OpDef* a, const ops::OpDef* b) { return a->name < b->name; });
  return v;
}

int matrix() {
  const auto ops = ops_by_name();
  int chip = 0, grad = 0, diff = 0;
  std::printf("| op | cpu | sim eager | sim compiled | gradient |\n|---|---|---|---|---|\n");
  for (const ops::OpDef* op : ops) {
    const std::string e = sim_eager(*op), c = sim_compiled(*op), g = gradient(*op);
    chip += e != "host";
    if (g != "n/a") {
      ++diff;
      grad += g == "yes";
    }
    std::printf("| `%s` | yes | %s | %s | %s |\n", op->name.c_str(), e.c_str(), c.c_str(), g.c_str());
  }
  std::printf("\n%zu ops; %d run on the chip (or as views) on sim; %d of %d differentiable ops have a gradient.\n",
              ops.size(), chip, grad, diff);
  return 0;
}

int list() {
  for (const ops::OpDef* op : ops_by_name())
    std::printf("%-20s %3d  %s\n", op->name.c_str(), op->num_inputs, op->doc.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tpu::cli::Parser p("tpu-ops", "Prints what the registered ops support.");
  p.positional("[matrix|list]",
               "matrix: the operator compatibility matrix (markdown, the default); list: every registered op with "
               "its arity and description");
  if (auto rc = p.parse(argc, argv)) return *rc;
  const std::string cmd = p.positionals().empty() ? "matrix" : p.positionals()[0];
  if (p.positionals().size() <= 1 && cmd == "matrix") return matrix();
  if (p.positionals().size() <= 1 && cmd == "list") return list();
  std::fprintf(stderr, "%s", p.usage().c_str());
  return 2;
}
