// The graph nodes of tpu::dist collectives (tpucore/dist/compiled.cpp) need a process group, so
// they have no numeric OpInfo entry: they are tested against naive references across ranks.
// The fused MoE layer node is made by a graph pass (graph/passes/fuse_moe.cpp), tested where
// the pass runs.
#include "opinfo.h"

namespace tpu::testing {
namespace {
const OpInfoRegistrar kDistOps[] = {
    {"dist_all_reduce", "tests/pod/test_compile_dist.cpp, tests/dist/worker_compile.cpp (ranks vs a naive loop)"},
    {"dist_broadcast", "tests/pod/test_compile_dist.cpp (ranks vs a naive loop)"},
    {"dist_all_gather", "tests/pod/test_compile_dist.cpp, tests/dist/worker_compile.cpp (ranks vs a naive loop)"},
    {"dist_reduce_scatter", "tests/pod/test_compile_dist.cpp, tests/dist/worker_compile.cpp (ranks vs a naive loop)"},
    {"dist_all_to_all", "tests/pod/test_all_to_all_sim.cpp, tests/dist/worker_compile.cpp (uneven splits vs a naive exchange)"},
    {"moe_ffn", "tests/core/test_moe_ffn_chip.cpp (the chip program vs a per-token loop), tests/core/test_moe_ops.cpp, "
                "tests/pod/test_moe_compile_sim.cpp (a compiled MoE block for inference vs the eager block, cpu and sim)"},
};
}  // namespace
}  // namespace tpu::testing
