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
#include "tpucore/kernel.h"
#include "tpucore/models.h"
#include "tpucore/nn.h"
#include "tpucore/moe_ops.h"
#include "tpucore/ops.h"
#include "tpucore/optim.h"
#include "tpucore/profiler.h"
#include "tpucore/quantize.h"
#include "tpucore/safetensors.h"
#include "tpucore/streams.h"
#include "tpucore/tokenizer.h"

/** @mainpage tpucore API reference
 *
 * The reference of the installed public headers (`#include "tpucore/tpucore.h"` brings in all
 * of them). Where to start:
 *  - tpu::Tensor (tpucore/core/tensor.h) and the ops of tpucore/ops.h (eager, on the device of
 *    their inputs: "cpu", "sim:N", "tpu:N", "pjrt:N"; semantics follow PyTorch);
 *  - tpu::compile (tpucore/compile.h), the tracing JIT;
 *  - autograd (tpucore/autograd.h), tpu::nn layers and losses, tpu::optim;
 *  - devices, streams and the simulator (tpucore/devices.h, tpucore/streams.h), the profiler;
 *  - custom kernels over blocks (tpucore/kernel.h; guide: docs/kernels.md);
 *  - tpu::dist process groups (tpucore/dist.h); checkpoints (tpucore/safetensors.h), the
 *    tokenizer and the models;
 *  - new backends: the Driver interface (device/driver.h) and the C plugin ABI
 *    (device/plugin_abi.h).
 * Every failure a caller can cause is a tpu::Error whose message names the op, the argument and
 * the values involved.
 */

/** @namespace tpu
 * Everything of tpucore: tensors, ops, the tracing JIT, devices and streams (the headers under
 * tpucore/ and tpucore/core/).
 */
/** @namespace tpu::autograd
 * Reverse-mode differentiation beyond Tensor::backward: several roots, gradients returned
 * instead of accumulated, hooks (tpucore/autograd.h).
 */
/** @namespace tpu::jit
 * Counters of tpu::compile's compiled functions (tpucore/compile.h).
 */
/** @namespace tpu::nn
 * Modules, layers and losses, as torch.nn (tpucore/nn.h).
 */
/** @namespace tpu::optim
 * Optimizers, learning-rate schedules and gradient clipping (tpucore/optim.h).
 */
/** @namespace tpu::data
 * IDX files, Fashion-MNIST and the DataLoader (tpucore/data.h).
 */
/** @namespace tpu::dist
 * Process groups and collectives, as torch.distributed (tpucore/dist.h).
 */
/** @namespace tpu::profiler
 * Host and chip profiling into a table and a Chrome trace (tpucore/profiler.h).
 */
/** @namespace tpu::kernel
 * Custom kernels over blocks, in the manner of Pallas (tpucore/kernel.h, docs/kernels.md).
 */
/** @namespace tpu::pjrt
 * A client of PJRT plugins (tpucore/runtime/pjrt_client.h).
 */
/** @namespace tpu::device
 * The device layer a backend implements: the Driver interface and stream ids
 * (device/driver.h, device/stream.h).
 */
