/// @file
/// Language models: the decoder-only transformer family of Hugging Face checkpoints (Llama,
/// Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 text), its building blocks (tpucore/nn/transformer.h) and the byte-level BPE
/// tokenizer of tokenizer.json files.
#pragma once

#include "tpucore/models/causal_lm.h"
#include "tpucore/nn/transformer.h"
#include "tpucore/models/generate.h"
#include "tpucore/tokenizer.h"
