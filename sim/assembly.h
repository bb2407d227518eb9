// Text assembly: one instruction per line, `opcode key=value ...`, `;` starts a comment.
//   loop r=r0 n=8
//     dma dst=vmem[r0*4096] src=hbm[65536+r0*4096] shape=[1,16,256] q=0 sem=0
//     wait sem=0 n=1
//     vadd dst=vmem[0]:f32 a=vmem[1024]:f32{256,1} b=#1.5 shape=[4,256]
//   endloop
// Printing then parsing gives back the same program. Parse errors name line:column.
#pragma once
#include <string>
#include <string_view>

#include "sim/program.h"

namespace tpu::sim {

std::string format_instr(const Instr& in);
std::string format_addr(const Addr& a);
std::string to_text(const Program& p);
// Parses and finalizes. Throws SimError("line L:C: why").
Program parse_program(std::string_view text, std::string name = {});

}  // namespace tpu::sim
