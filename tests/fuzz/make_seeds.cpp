// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from files the
// library itself writes: small programs from the simulator's generators (assembly and JSON), the
// chip presets' JSON, a traced and optimized graph's JSON, safetensors of every dtype. IDX has no
// writer in the library, so its seeds are built here byte by byte (plain and gzip). Run by
// scripts/fuzz.sh --seeds; the output is committed, so the fuzzers never depend on this tool.
//   make_seeds OUT_DIR
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/passes/passes.h"
#include "graph/printer.h"
#include "graph/tracer.h"
#include "sim/assembly.h"
#include "sim/config.h"
#include "sim/presets.h"
#include "sim/programs.h"
#include "sim/serialize.h"
#include "tpucore/ops.h"
#include "tpucore/safetensors.h"

namespace fs = std::filesystem;

namespace {

fs::path g_out;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream(g_out / target / name, std::ios::binary) << bytes;
}
void put(const std::string& target, const std::string& name, const std::vector<uint8_t>& b) {
  put(target, name, std::string(b.begin(), b.end()));
}

void sim_seeds() {
  using namespace tpu::sim;
  const ChipConfig tiny = preset_config("tiny");
  GemmSpec spec;
  spec.m = tiny.mxu.rows;
  spec.n = tiny.mxu.cols;
  spec.k = tiny.mxu.rows;
  const Program gemm = make_gemm(tiny, spec).program;
  const Program copy = make_stream_copy(tiny, 4096, 1024, 2).program;
  // Every instruction format once: the example of sim/assembly.h plus the other formats.
  const Program mix = parse_program(
      "sset r=r1 imm=3\nsadd r=r2 src=r1 imm=-1\nloop r=r0 n=2\n"
      "dma dst=vmem[r0*64] src=hbm[128+r0*64] shape=[1,2,16] q=0 sem=0\nwait sem=0 n=1\n"
      "vadd dst=vmem[0]:f32 a=vmem[256]:f32{16,1} b=#1.5 shape=[2,16]\nendloop\n"
      "vfill dst=vmem[512]:bf16 value=-inf shape=[1,8]\nvexp dst=vmem[0]:f32 a=vmem[0]:f32 shape=[2,16]\n"
      "xsum dst=vmem[64]:f32 a=vmem[0]:f32 shape=[2,16] axis=1\n"
      "vfma dst=vmem[0]:f32 a=vmem[0]:f32 b=vmem[0]:f32 c=#2 shape=[2,16]\n",
      "mix");
  for (const auto& [name, p] : {std::pair{"gemm", &gemm}, std::pair{"copy", &copy}, std::pair{"mix", &mix}}) {
    put("assembly", name, to_text(*p));
    put("program_json", name, program_to_json_text(*p));
  }
  for (const std::string& n : {std::string("tiny"), std::string("v5e")})
    put("chip_config", n, config_to_json(preset_config(n)).dump());
}

void graph_seeds() {
  using namespace tpu;
  Tensor x = randn({2, 4}), w = randn({4, 4}), b = randn({4});
  graph::Tracer tr;
  {
    graph::TraceScope scope(&tr);
    Tensor h = gelu(matmul(x, w) + b) * 0.5;
    Tensor y = softmax(h, -1).sum({-1}, true).to(DType::bf16);
    std::vector<Tensor> outs{y, h};
    tr.set_outputs(outs);
  }
  put("graph_json", "traced", graph::to_json(tr.graph()));
  graph::optimize(tr.graph(), graph::PassOptions{.verify = true});
  put("graph_json", "optimized", graph::to_json(tr.graph()));
}

void safetensors_seeds() {
  using namespace tpu;
  TensorList all;
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::u8, DType::boolean})
    all.emplace_back(std::string(dtype_name(t)), arange(6).reshape({2, 3}).to(t));
  put("safetensors", "all_dtypes", serialize_safetensors(all, {{"format", "pt"}}));
  put("safetensors", "one", serialize_safetensors({{"w", from_vector(std::vector<float>{1.5f, -2.f})}}));
  put("safetensors", "empty", serialize_safetensors({}));
}

// IDX: 00 00 type ndims, big-endian u32 dims, big-endian data.
std::vector<uint8_t> idx(uint8_t type, std::vector<uint32_t> dims, size_t elem_size) {
  std::vector<uint8_t> b{0, 0, type, uint8_t(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    n *= d;
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(d >> s));
  }
  for (size_t i = 0; i < n * elem_size; ++i) b.push_back(uint8_t(i * 37 + 1));
  return b;
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& in) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::vector<uint8_t> out(deflateBound(&z, in.size()) + 32);
  z.next_in = const_cast<uint8_t*>(in.data());
  z.avail_in = uInt(in.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void idx_seeds() {
  put("idx", "u8", idx(0x08, {2, 3, 3}, 1));
  put("idx", "i8", idx(0x09, {4}, 1));
  put("idx", "i16", idx(0x0B, {3}, 2));
  put("idx", "i32", idx(0x0C, {2, 2}, 4));
  put("idx", "f32", idx(0x0D, {3}, 4));
  put("idx", "f64", idx(0x0E, {2}, 8));
  put("idx", "u8.gz", gzip(idx(0x08, {5, 4}, 1)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  sim_seeds();
  graph_seeds();
  safetensors_seeds();
  idx_seeds();
  return 0;
}
