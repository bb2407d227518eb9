#include "sim/fields.h"

namespace tpu::sim::detail {

const std::vector<FieldDef>& fields_of(Format f) {
  static const std::vector<FieldDef> none{};
  static const std::vector<FieldDef> sset{{"r", FK::reg, true}, {"imm", FK::imm, true}};
  static const std::vector<FieldDef> sadd{{"r", FK::reg, true}, {"src", FK::reg_a, true}, {"imm", FK::imm, true}};
  static const std::vector<FieldDef> loop{{"r", FK::reg, true}, {"n", FK::n, true}};
  static const std::vector<FieldDef> sem{{"sem", FK::sem, true}, {"n", FK::n, false}};
  static const std::vector<FieldDef> dma{{"dst", FK::dst_addr, true},      {"src", FK::src_addr, true},
                                         {"shape", FK::shape3, true},      {"dst_stride", FK::dst_stride, false},
                                         {"src_stride", FK::src_stride, false}, {"q", FK::q, false},
                                         {"sem", FK::sem, false}};
  static const std::vector<FieldDef> lw{{"mxu", FK::mxu, false}, {"w", FK::a, true}, {"k", FK::rows, true},
                                        {"n", FK::cols, true},   {"mode", FK::mode, false}};
  static const std::vector<FieldDef> mm{{"mxu", FK::mxu, false}, {"out", FK::dst, true}, {"lhs", FK::a, true},
                                        {"m", FK::rows, true},   {"k", FK::k, true},     {"n", FK::cols, true},
                                        {"mode", FK::mode, false}, {"acc", FK::acc, false}};
  static const std::vector<FieldDef> bin{{"dst", FK::dst, true}, {"a", FK::a, true}, {"b", FK::b, true}, {"shape", FK::shape2, true}};
  static const std::vector<FieldDef> ter{{"dst", FK::dst, true}, {"a", FK::a, true}, {"b", FK::b, true},
                                         {"c", FK::c, true},     {"shape", FK::shape2, true}};
  static const std::vector<FieldDef> un{{"dst", FK::dst, true}, {"a", FK::a, true}, {"shape", FK::shape2, true}};
  static const std::vector<FieldDef> fill{{"dst", FK::dst, true}, {"value", FK::value, true}, {"shape", FK::shape2, true}};
  static const std::vector<FieldDef> red{{"dst", FK::dst, true}, {"a", FK::a, true}, {"shape", FK::shape2, true}, {"axis", FK::axis, false}};
  static const std::vector<FieldDef> tr{{"dst", FK::dst, true}, {"a", FK::a, true}, {"shape", FK::shape2, true}};
  static const std::vector<FieldDef> sld{{"r", FK::reg, true}, {"src", FK::src_addr, true}};
  static const std::vector<FieldDef> loopr{{"r", FK::reg, true}, {"n", FK::reg_a, true}};
  switch (f) {
    case Format::none: return none;
    case Format::sset: return sset;
    case Format::sadd: return sadd;
    case Format::loop: return loop;
    case Format::sem: return sem;
    case Format::dma: return dma;
    case Format::mxu_lw: return lw;
    case Format::mxu_mm: return mm;
    case Format::vbinary: return bin;
    case Format::vternary: return ter;
    case Format::vunary: return un;
    case Format::vfill: return fill;
    case Format::xreduce: return red;
    case Format::xtrans: return tr;
    case Format::sld: return sld;
    case Format::loopr: return loopr;
  }
  return none;
}

}  // namespace tpu::sim::detail
