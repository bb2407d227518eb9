// Target-independent planning of a fused elementwise program (vec_math.h) for the Highway
// executor (vec_program_hwy-inl.h): which multiply and add steps fold into the unary step
// that reads them, and whether what is left is one pass over memory.
#pragma once

#include "ops/cpu/vec_math.h"

namespace tpu::ops::cpu {

// A unary step with the multiply and add that feed it folded in: F(x * a + b) (a, b: -1 when
// left out, x: -1 when the step reads its own input).
struct VecPrologue {
  int16_t x, a, b;
};

// uses[k]: the number of steps reading operand k (nops entries).
void count_vec_uses(const VecStep* steps, int nsteps, int nops, int* uses);

// Folds `mul` and `add` steps into the unary step that reads them, when their results have no
// other reader and are not region outputs: F(x * a + b), F(x + b) and F(x * a) run as one pass
// (bias and activation, the most common fused region). Fills pro[0..nsteps) and marks folded
// steps in skip[0..nsteps) (both set by the caller to {-1, -1, -1} and false).
void fold_vec_prologues(const VecStep* steps, int nsteps, const VecOperand* ops, const int* uses, int nops,
                        VecPrologue* pro, bool* skip);

// The one step left after folding when it reads memory inputs only (no scalar: those live in
// block slots) and writes a region output, else -1.
int single_pass_step(const VecStep* steps, int nsteps, const VecOperand* ops, const VecPrologue* pro, const bool* skip);

}  // namespace tpu::ops::cpu
