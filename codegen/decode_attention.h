// Decode attention: one new query per sequence against the KV cache (lq == 1), the shape of
// every decode step of a language model. Run as the flash AttentionKernel unchanged, each query
// head would stream its key/value head from HBM on its own, so with grouped KV heads (Llama 3,
// Mistral, Qwen: several query heads per KV head) the cache would be read `group` times per
// step. fold_decode_heads rewrites such a spec so that the `group` query heads sharing a KV head
// become `group` query rows of one head: the kernel then reads every cached key and value once
// per step, with the group's queries side by side on the MXUs. The output layout is unchanged
// ([heads, 1, Dv] contiguous is [heads / group, group, Dv]).
#pragma once

#include "codegen/attention_kernel.h"

namespace tpu::codegen {

// True (and `s` rewritten, named "decode_attention") when s is a non-causal single-query
// attention with group > 1 whose query heads of each group lie at one stride apart and whose
// mask, if any, is the same for every query head of a group. False leaves `s` as it was.
bool fold_decode_heads(AttentionSpec& s);

}  // namespace tpu::codegen
