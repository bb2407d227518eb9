// The 32-bit integer vector ops (vand, vor, vxor, vshl, vshrl, vshra) against scalar C++ on
// edge values, their verifier rules, text / JSON round trips and their cost.
#include <catch2/catch.hpp>

#include <climits>
#include <string>

#include "sim/assembly.h"
#include "sim/builder.h"
#include "sim/error.h"
#include "sim/serialize.h"
#include "sim_test_util.h"

using namespace tpu::sim;
using namespace simtest;
using B = ProgramBuilder;

namespace {

const std::vector<int32_t> kEdge{0,        1,       -1,      2,          -2,         7,         -8,
                                 15,       16,      0x7f,    0x80,       -128,       0x0f0f0f0f, int32_t(0xf0f0f0f0),
                                 INT_MAX,  INT_MIN, INT_MIN + 1, 0x40000000, 0x12345678, int32_t(0x87654321),
                                 31,       32,      -31,     1 << 23,    -(1 << 23), 0x55555555, int32_t(0xaaaaaaaa),
                                 12345,    -12345,  0x0000ffff, int32_t(0xffff0000), 3};

// Scalar references, written on unsigned arithmetic.
int32_t ref(Op op, int32_t x, int32_t y) {
  const uint32_t ux = uint32_t(x), uy = uint32_t(y);
  const unsigned n = uy % 32u;
  switch (op) {
    case Op::vand: return int32_t(ux & uy);
    case Op::vor: return int32_t(ux | uy);
    case Op::vxor: return int32_t(ux ^ uy);
    case Op::vshl: return int32_t(uint32_t(uint64_t(ux) << n));
    case Op::vshrl: return int32_t(ux >> n);
    case Op::vshra: {
      // floor(x / 2^n), computed in 64 bits
      const int64_t d = int64_t(1) << n;
      const int64_t v = int64_t(x);
      return int32_t(v >= 0 ? v / d : -((-v + d - 1) / d));
    }
    default: return 0;
  }
}

std::string run_error(B& b) {
  Chip chip = tiny();
  try {
    chip.run(b.finish());
  } catch (const SimError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("integer vector ops match scalar C++ on edge values", "[sim][vpu][int]") {
  Chip chip = tiny();
  const int64_t N = int64_t(kEdge.size());
  // a = every edge value, b = every edge value (all pairs: a row per b value).
  std::vector<int32_t> a, bv, counts;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < N; ++c) a.push_back(kEdge[size_t(c)]), bv.push_back(kEdge[size_t(r)]);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < N; ++c) counts.push_back(int32_t((r * 7 + c) % 32));  // 0 .. 31
  const uint64_t A = 0, Bb = 8192, S = 16384, O = 24576;
  put(chip, Space::vmem, A, a);
  put(chip, Space::vmem, Bb, bv);
  put(chip, Space::vmem, S, counts);
  auto mem = [](uint64_t at) { return B::vmem(B::at(int64_t(at)), DType::i32); };
  const std::vector<Op> ops{Op::vand, Op::vor, Op::vxor, Op::vshl, Op::vshrl, Op::vshra};
  B b;
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool shift = ops[i] == Op::vshl || ops[i] == Op::vshrl || ops[i] == Op::vshra;
    b.binary(ops[i], mem(O + i * 8192), mem(A), mem(shift ? S : Bb), N, N);
  }
  // Immediates: counts 0 and 31, and a mask.
  const uint64_t I = O + 6 * 8192;
  b.binary(Op::vshra, mem(I), mem(A), B::imm(31), 1, N);
  b.binary(Op::vshrl, mem(I + 512), mem(A), B::imm(31), 1, N);
  b.binary(Op::vshl, mem(I + 1024), mem(A), B::imm(31), 1, N);
  b.binary(Op::vshra, mem(I + 1536), mem(A), B::imm(0), 1, N);
  b.binary(Op::vand, mem(I + 2048), mem(A), B::imm(float(0x0f000000)), 1, N);
  b.binary(Op::vor, mem(I + 2560), B::imm(-2147483648.f), mem(A), 1, N);
  // i32 -> f32 and back (vcast) on the shifted values: exact below 2^24, nearest even above.
  b.unary(Op::vcast, B::vmem(B::at(int64_t(I + 3072)), DType::f32), mem(A), 1, N);
  chip.run(b.finish());
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool shift = ops[i] == Op::vshl || ops[i] == Op::vshrl || ops[i] == Op::vshra;
    const auto got = get<int32_t>(chip, Space::vmem, O + i * 8192, size_t(N * N));
    for (size_t j = 0; j < got.size(); ++j) {
      INFO(op_info(ops[i]).name << " " << a[j] << ", " << (shift ? counts[j] : bv[j]));
      CHECK(got[j] == ref(ops[i], a[j], shift ? counts[j] : bv[j]));
    }
  }
  auto row = [&](uint64_t at) { return get<int32_t>(chip, Space::vmem, at, size_t(N)); };
  const auto sra31 = row(I), srl31 = row(I + 512), shl31 = row(I + 1024), sra0 = row(I + 1536), msk = row(I + 2048),
             orr = row(I + 2560);
  const auto cv = get<float>(chip, Space::vmem, I + 3072, size_t(N));
  for (size_t j = 0; j < size_t(N); ++j) {
    const int32_t x = kEdge[j];
    CHECK(sra31[j] == (x < 0 ? -1 : 0));
    CHECK(srl31[j] == int32_t(uint32_t(x) >> 31));
    CHECK(shl31[j] == ((x & 1) ? INT_MIN : 0));
    CHECK(sra0[j] == x);
    CHECK(msk[j] == (x & 0x0f000000));
    CHECK(orr[j] == int32_t(uint32_t(x) | 0x80000000u));
    CHECK(double(cv[j]) == double(float(x)));
  }
}

TEST_CASE("integer vector ops: verifier rules, text and JSON forms, cost of an f32 op", "[sim][vpu][int]") {
  auto I = [](int64_t at) { return B::vmem(B::at(at), DType::i32); };
  auto F = [](int64_t at) { return B::vmem(B::at(at), DType::f32); };
  {
    B b;
    b.binary(Op::vand, I(0), F(512), I(1024), 2, 8);
    CHECK(run_error(b).find("integer vector ops work on i32 operands") != std::string::npos);
  }
  {
    B b;
    b.binary(Op::vadd, F(0), I(512), F(1024), 2, 8);
    CHECK(run_error(b).find("f32 or bf16") != std::string::npos);
  }
  {
    B b;
    b.binary(Op::vshl, I(0), I(512), B::imm(32), 2, 8);
    CHECK(run_error(b).find("shift count 32 is outside 0..31") != std::string::npos);
  }
  {
    B b;
    b.binary(Op::vshrl, I(0), I(512), B::imm(-1), 2, 8);
    CHECK(run_error(b).find("outside 0..31") != std::string::npos);
  }
  {
    B b;
    b.binary(Op::vor, I(0), I(512), B::imm(0.5f), 2, 8);
    CHECK(run_error(b).find("not a 32-bit integer") != std::string::npos);
  }
  {
    B b;
    b.binary(Op::vxor, I(0), I(512), B::imm(2147483648.f), 2, 8);
    CHECK(run_error(b).find("not a 32-bit integer") != std::string::npos);
  }
  B b;
  b.binary(Op::vand, I(0), I(512), B::imm(float(0x0f000000)), 16, 64);
  b.binary(Op::vor, I(0), I(512), I(1024), 16, 64);
  b.binary(Op::vxor, I(0), I(512), I(1024), 16, 64);
  b.binary(Op::vshl, I(0), I(512), B::imm(4), 16, 64);
  b.binary(Op::vshrl, I(0), I(512), B::imm(28), 16, 64);
  b.binary(Op::vshra, I(0), I(512), B::imm(31), 16, 64);
  const Program p = b.finish();
  const std::string text = to_text(p);
  CHECK(text.find("vshra") != std::string::npos);
  CHECK(to_text(parse_program(text)) == text);
  CHECK(to_text(program_from_json_text(program_to_json_text(p))) == text);
  // Each costs what vadd on the same shape costs: vregs x vpu.cycles_per_vreg.
  B fb;
  for (int i = 0; i < 6; ++i) fb.binary(Op::vadd, F(0), F(512), F(1024), 16, 64);
  Chip c1 = tiny(), c2 = tiny();
  auto vpu_busy = [](const Stats& s) {
    for (const UnitStats& u : s.units)
      if (u.name == "vpu") return u.busy_cycles;
    return -1.0;
  };
  const Stats si = c1.run(p).stats, sf = c2.run(fb.finish()).stats;
  const ChipConfig cfg = preset_config("tiny");
  CHECK(vpu_busy(si) == 6.0 * (16 / cfg.vpu.sublanes) * (64 / cfg.vpu.lanes) * cfg.vpu.cycles_per_vreg);
  CHECK(vpu_busy(si) == vpu_busy(sf));
  CHECK(si.cycles == sf.cycles);
}
