#include <catch2/catch.hpp>

#include <cmath>

#include "sim/assembly.h"
#include "sim/builder.h"
#include "sim/error.h"
#include "sim/presets.h"
#include "sim/programs.h"
#include "sim/serialize.h"

using namespace tpu::sim;
using B = ProgramBuilder;

namespace {

// A program that uses every instruction format.
Program every_format() {
  B b("all");
  b.sset(1, 7);
  b.sadd(2, 1, -3);
  b.smul(3, 2, 5);
  b.smod(4, 3, 3);
  b.loop(0, 3);
  b.dma(B::vmem_at(B::at(64, {{0, 256}})), B::hbm_at(B::at(1024, {{0, 512}, {1, -4}})),
        {.planes = 2, .rows = 3, .row_bytes = 32, .dst_plane_stride = 128, .src_row_stride = 64}, 1, 2);
  b.wait(2);
  b.end_loop();
  b.signal(3, 2);
  b.wait(3, 2);
  b.mxu_load_weights(1, B::vmem(B::at(0), DType::bf16, 8), 8, 8);
  b.mxu_matmul(1, B::vmem(B::at(4096), DType::f32, 16), B::vmem(B::at(2048, {{0, 16}}), DType::bf16), 4, 8, 8, true);
  b.mxu_load_weights(0, B::vmem(B::at(0), DType::i8), 8, 4, MxuMode::i8);
  b.mxu_matmul(0, B::vmem(B::at(8192), DType::i32), B::vmem(B::at(512), DType::i8), 2, 8, 4, false, MxuMode::i8);
  b.binary(Op::vadd, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32, 0, 1), B::imm(1.5f), 2, 8);
  b.binary(Op::vcmplt, B::vmem(B::at(0), DType::bf16), B::vmem(B::at(64), DType::f32), B::imm(-INFINITY), 2, 8);
  b.ternary(Op::vfma, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32), B::imm(0.1f),
            B::vmem(B::at(256), DType::f32, 1, 0), 2, 8);
  b.ternary(Op::vsel, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32), B::imm(NAN),
            B::vmem(B::at(256), DType::f32), 2, 8);
  b.unary(Op::vexp, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::bf16), 2, 8);
  b.unary(Op::vcast, B::vmem(B::at(0), DType::i8), B::vmem(B::at(64), DType::f32), 2, 8);
  b.fill(B::vmem(B::at(0), DType::f32), -2.25f, 3, 5);
  b.reduce(Op::xsum, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32), 2, 8, 1);
  b.reduce(Op::xmax, B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32), 2, 8, 0);
  b.transpose(B::vmem(B::at(0), DType::f32), B::vmem(B::at(64), DType::f32, 16, 1), 2, 8);
  b.nop();
  b.fence();
  b.halt();
  return b.finish();
}

}  // namespace

TEST_CASE("assembly prints and parses back to the same program", "[sim][asm]") {
  ChipConfig tiny = preset_config("tiny");
  std::vector<Program> progs = {every_format(), make_gemm(tiny, {.m = 16, .n = 32, .k = 16, .block_m = 8}).program,
                                make_stream_copy(tiny, 4096, 512, 3).program};
  for (const auto& p : progs) {
    INFO(p.name);
    std::string text = to_text(p);
    Program back = parse_program(text);
    CHECK(back == p);
    CHECK(to_text(back) == text);
    // JSON round trip too.
    Program j = program_from_json_text(program_to_json_text(p));
    CHECK(j == p);
  }
}

TEST_CASE("assembly accepts hand-written forms", "[sim][asm]") {
  Program p = parse_program(R"(
    ; comment line
    loop r=r0 n=4            ; trailing comment
      dma dst=vmem[ r0 * 64 + 16 ] src=hbm[0x100 + 2*r0 - r0] shape=[64] sem=0
      wait sem=0
    endloop
    vadd dst=vmem[0]:f32 a=vmem[64]:f32{0,1} b=#2 shape=[2,8]
  )");
  REQUIRE(p.code.size() == 5);
  CHECK(p.code[1].dst.addr.offset == 16);
  CHECK(p.code[1].dst.addr.terms[0].scale == 64);
  CHECK(p.code[1].a.addr.offset == 256);
  CHECK(p.code[1].a.addr.terms[0].scale == 1);
  CHECK(p.code[1].dma_shape == std::array<int64_t, 3>{1, 1, 64});
  CHECK(p.code[2].imm == 1);
  CHECK(p.code[0].match == 3);
  CHECK(p.code[4].a.row_stride == 0);
  CHECK(p.code[4].dst.row_stride == 8);
}

TEST_CASE("malformed assembly names line and column", "[sim][asm]") {
  auto err = [](const char* text) {
    try {
      parse_program(text);
    } catch (const SimError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err("nop\nfrobnicate x=1\n"), Catch::StartsWith("line 2:1:") && Catch::Contains("unknown opcode"));
  CHECK_THAT(err("vadd dst=vmem[0]:f32 a=vmem[0]:f33 b=#1 shape=[1,1]"), Catch::StartsWith("line 1:32:"));
  CHECK_THAT(err("wait sem=1 bogus=2"), Catch::Contains("line 1:12") && Catch::Contains("no field 'bogus'"));
  CHECK_THAT(err("wait"), Catch::Contains("needs field 'sem'"));
  CHECK_THAT(err("loop r=r0 n=2\nnop\n"), Catch::Contains("line 1:") && Catch::Contains("without a matching endloop"));
  CHECK_THAT(err("endloop"), Catch::Contains("without a matching loop"));
  CHECK_THAT(err("dma dst=vmem[0] src=hbm[r1*] shape=[4]"), Catch::Contains("line 1:"));
  CHECK_THAT(err("sset r=r1 imm=99999999999999999999999"), Catch::Contains("out of range"));
  CHECK_THAT(err("vexp dst=vmem[0]:i32 a=vmem[0]:f32 shape=[1,1]"), Catch::Contains("f32 or bf16"));
  CHECK_THAT(err("wait sem=1 sem=2"), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(program_from_json_text(R"({"format":"tpusim-program","version":1,"code":[{"op":"wait"}]})"),
                    Catch::Contains("instruction #0") && Catch::Contains("sem"));
  CHECK_THROWS_AS(program_from_json_text("[1,2"), SimError);
}
