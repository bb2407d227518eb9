/// @file
/// tpucore's whole public API in one include: the core types (tpucore/core/), ops, the tracing
/// JIT, autograd, nn, optimizers, data and checkpoint I/O, devices and streams, the profiler,
/// process groups, the model family and the tokenizer.
#pragma once

#include "tpucore/autograd.h"
#include "tpucore/compile.h"
#include "tpucore/core/allocator.h"
#include "tpucore/core/log.h"
#include "tpucore/core/parallel.h"
#include "tpucore/data.h"
#include "tpucore/defer.h"
#include "tpucore/devices.h"
#include "tpucore/dist.h"
#include "tpucore/export.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"
#include "tpucore/profiler.h"
#include "tpucore/safetensors.h"
#include "tpucore/streams.h"
#include "tpucore/tokenizer.h"
