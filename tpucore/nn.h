/// @file
/// The nn API: modules, layers, attention and losses (see the headers under tpucore/nn/).
#pragma once

#include "tpucore/autograd.h"
#include "tpucore/nn/attention.h"
#include "tpucore/nn/layers.h"
#include "tpucore/nn/loss.h"
#include "tpucore/nn/module.h"
#include "tpucore/nn/mla.h"
#include "tpucore/nn/moe.h"
#include "tpucore/nn/quantized.h"
#include "tpucore/nn/transformer.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"
