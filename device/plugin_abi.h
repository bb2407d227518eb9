/** @file
 * tpucore driver plugin ABI: the one public header an out-of-tree driver (a real chip, or the
 * simulator built as a plugin) implements. Plain C, so a plugin can be built with any compiler.
 *
 * A plugin is a shared library exporting one symbol, TPU_PLUGIN_ENTRY_POINT, returning a table
 * of functions (TpuPluginApi). tpucore loads it with dlopen, from TPU_DRIVER_PATH or from
 * tpu::load_driver_plugin(path, device_type), checks abi_version, and wraps it as a Driver.
 *
 * Growing the ABI (as PJRT does): every argument struct and the table start with struct_size,
 * set by the caller to sizeof the struct it was compiled with (the TPU_STRUCT_SIZE of its last
 * field). New fields and functions are only ever appended; a callee reads a field only when
 * struct_size covers it and uses the documented default otherwise. An incompatible change bumps
 * TPU_PLUGIN_ABI_VERSION, and tpucore refuses plugins built for another version.
 *
 * Version history:
 *  1  devices, memory, copies, streams, events, program load/run (no arguments), stats.
 *  2  what tpucore's code generator needs to run its programs on a plugin device:
 *     TpuProgramRunArgs gains `args`/`num_args` (the program's arguments: buffer addresses and
 *     runtime scalars, in scalar registers r0..), TpuProgramStats gains `vector_elements`
 *     and `dma_bytes`, the table gains `device_target` (the chip description the programs are
 *     generated for). The fields were appended (struct-size rule), but the version steps to 2:
 *     a version-1 plugin would silently ignore the arguments and run every generated program
 *     on address 0, so tpucore refuses it with an error asking for a rebuild.
 *
 * Conventions:
 *  - Every function returns TPU_STATUS_OK or an error status; on error, last_error() returns a
 *    message (valid on the calling thread until its next call into the plugin).
 *  - Devices are numbered 0 .. count-1. Device memory is named by 64-bit addresses the plugin
 *    hands out (never 0); the host never dereferences them.
 *  - Streams: stream 0 is each device's default stream; stream_create adds more. Work on one
 *    stream runs in order; work on different streams may overlap. Events are plugin-wide
 *    handles (never 0): recorded on a stream of one device, waited on by a stream of any device
 *    of the same plugin, or by the host.
 *  - Copies: host->device returns once host_src may be reused; device->host returns once
 *    host_dst holds the data (after the earlier work of its stream); device->device is
 *    asynchronous.
 *  - Programs are given in the simulator's assembly text or its JSON form
 *    ({"format":"tpusim-program",...}); a real chip's plugin compiles them for its hardware.
 *  - Functions may be called from several host threads at once.
 */
#ifndef TPUCORE_DEVICE_PLUGIN_ABI_H_
#define TPUCORE_DEVICE_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI version this header describes (TpuPluginApi::abi_version). */
#define TPU_PLUGIN_ABI_VERSION 2
/** Name of the function every plugin exports (a TpuPluginGetApiFn). */
#define TPU_PLUGIN_ENTRY_POINT "tpu_plugin_get_api"
/** The struct_size of `type` up to and including `last_field`. */
#define TPU_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/** Marks the entry point exported from the plugin's shared library. */
#if defined(_WIN32)
#define TPU_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TPU_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/** Result of every plugin function. */
typedef enum TpuStatus {
  TPU_STATUS_OK = 0,
  TPU_STATUS_ERROR = 1,             /**< any other failure */
  TPU_STATUS_INVALID_ARGUMENT = 2,  /**< bad device index, handle, range, program text */
  TPU_STATUS_OUT_OF_MEMORY = 3,     /**< the message names the bytes asked for and free */
  TPU_STATUS_UNIMPLEMENTED = 4
} TpuStatus;

/** device_count: the number of devices. */
typedef struct TpuDeviceCountArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t count; /**< out: number of devices */
} TpuDeviceCountArgs;

/** device_properties: what device `device` is. */
typedef struct TpuDevicePropertiesArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  char name[64];          /**< out, NUL-terminated: the chip's name ("v5e") */
  char description[256];  /**< out, NUL-terminated */
  uint64_t memory_bytes;  /**< out */
  int32_t compute_units;  /**< out: MXUs or cores */
  double clock_ghz;       /**< out, 0 if unknown */
  double peak_flops;      /**< out: bf16 FLOP/s of one device, 0 if unknown */
} TpuDevicePropertiesArgs;

/** memory_alloc: in bytes, out address. memory_free: in address (stream-ordered: the memory is
 * reused only after the work queued before the free). memory_info: out free/total bytes. */
typedef struct TpuMemoryArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  uint64_t bytes;       /**< memory_alloc: bytes to allocate */
  uint64_t address;     /**< memory_alloc: out; memory_free: in */
  uint64_t free_bytes;  /**< memory_info: out */
  uint64_t total_bytes; /**< memory_info: out */
} TpuMemoryArgs;

/** Direction of a copy. */
typedef enum TpuCopyKind {
  TPU_COPY_HOST_TO_DEVICE = 0,
  TPU_COPY_DEVICE_TO_HOST = 1,
  TPU_COPY_DEVICE_TO_DEVICE = 2
} TpuCopyKind;

/** copy: `bytes` bytes in the direction `kind`, queued on (device, stream) (see the file's
 * conventions for when each kind returns). */
typedef struct TpuCopyArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  int32_t kind; /**< TpuCopyKind */
  uint64_t stream; /**< stream of the device (0: its default stream) */
  uint64_t dst_address; /**< device destination (H2D, D2D) */
  uint64_t src_address; /**< device source (D2H, D2D) */
  void* host_dst;       /**< D2H */
  const void* host_src; /**< H2D */
  uint64_t bytes;       /**< bytes to copy */
} TpuCopyArgs;

/** stream_create: out stream. stream_synchronize: host waits for the stream's work and gets the
 * errors of its earlier asynchronous work. stream_query: out done (1 when all work finished). */
typedef struct TpuStreamArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  uint64_t stream; /**< stream of the device (0: its default stream) */
  int32_t done;    /**< stream_query: out, 1 when all its work finished */
} TpuStreamArgs;

/** event_create: out event. event_record: on (device, stream). event_wait: (device, stream)
 * waits for event (recorded on any device of this plugin; never recorded = no wait).
 * event_synchronize: host waits. event_query: out done. event_time: out time_seconds at which
 * the event was reached (the plugin's clock; simulated time on a simulator), NaN if not yet. */
typedef struct TpuEventArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  uint64_t stream; /**< stream of the device (0: its default stream) */
  uint64_t event;      /**< event handle (never 0) */
  int32_t done;        /**< event_query: out, 1 when reached */
  double time_seconds; /**< event_time: out */
} TpuEventArgs;

/** How program text is written: the simulator's assembly text or its JSON form (AUTO: the
 * plugin tells them apart). */
typedef enum TpuProgramFormat { TPU_PROGRAM_AUTO = 0, TPU_PROGRAM_TEXT = 1, TPU_PROGRAM_JSON = 2 } TpuProgramFormat;

/** program_load: in program text, out program handle. program_unload: in program handle. */
typedef struct TpuProgramLoadArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  int32_t format; /**< TpuProgramFormat */
  const char* program;     /**< program_load: the text (not necessarily NUL-terminated) */
  size_t program_size;     /**< its length in bytes */
  uint64_t program_handle; /**< program_load: out; program_unload: in */
} TpuProgramLoadArgs;

/** Filled by the plugin when a run completes; keep it alive until then. `done` is written last,
 * with release semantics (read it with an acquire load, or after synchronizing the stream). */
typedef struct TpuProgramStats {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t done;               /**< 1 once the run completed (written last) */
  double cycles;              /**< run time in chip cycles */
  double seconds;             /**< run time in seconds */
  uint64_t instructions;      /**< instructions executed */
  double mxu_flops;           /**< MXU FLOPs */
  double mfu;                 /**< MXU FLOPs over the chip's peak for the run's time */
  uint64_t hbm_bytes_read;    /**< HBM bytes read */
  uint64_t hbm_bytes_written; /**< HBM bytes written */
  /* since version 2 */
  double vector_elements;       /**< elements produced by vector/EUP/XLU instructions */
  uint64_t dma_bytes;           /**< bytes moved by the program's DMAs */
} TpuProgramStats;

/** program_run: queues a run of a loaded program on (device, stream). */
typedef struct TpuProgramRunArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  uint64_t stream; /**< stream of the device (0: its default stream) */
  uint64_t program_handle; /**< from program_load */
  int32_t timing_only;    /**< 1: skip the arithmetic (same timing) */
  TpuProgramStats* stats; /**< optional */
  /** since version 2: the program's arguments, copied before program_run returns. Scalar
   * register i starts as args[i] (a device address the plugin handed out, or a runtime scalar
   * such as a float's bit pattern); registers past num_args start at 0. More arguments than the
   * chip has scalar registers is TPU_STATUS_INVALID_ARGUMENT. */
  const int64_t* args;
  size_t num_args; /**< number of args */
} TpuProgramRunArgs;

/** device_target (version 2): the chip description programs for `device` are generated for, as
 * the simulator's chip-config JSON (sim/config.h: MXUs, VMEM, registers, latencies). The plugin
 * writes at most `capacity` bytes (NUL-terminated) into `buffer` and sets `size` to the full
 * length without the NUL; a call with buffer NULL asks for the size. A plugin whose chip runs a
 * different instruction set leaves the function NULL: tpucore then runs ops on the host. */
typedef struct TpuDeviceTargetArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
  char* buffer;    /**< out (or NULL to ask for the size) */
  size_t capacity; /**< bytes available at buffer */
  size_t size; /**< out */
} TpuDeviceTargetArgs;

/** synchronize: the host waits for all work of device `device`. */
typedef struct TpuSynchronizeArgs {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  int32_t device; /**< device index, 0 .. count-1 */
} TpuSynchronizeArgs;

/** The function table a plugin returns; every entry but device_target is required. */
typedef struct TpuPluginApi {
  size_t struct_size; /**< sizeof this struct as the caller compiled it (see TPU_STRUCT_SIZE) */
  uint32_t abi_version;    /**< TPU_PLUGIN_ABI_VERSION the plugin was built with */
  const char* plugin_name; /**< e.g. "tpusim" */
  /** The message of the calling thread's last error. */
  const char* (*last_error)(void);

  /** Devices: their number and properties. */
  /**@{*/
  TpuStatus (*device_count)(TpuDeviceCountArgs* args);
  TpuStatus (*device_properties)(TpuDevicePropertiesArgs* args);

  /**@}*/
  /** Device memory (see TpuMemoryArgs). */
  /**@{*/
  TpuStatus (*memory_alloc)(TpuMemoryArgs* args);
  TpuStatus (*memory_free)(TpuMemoryArgs* args);
  TpuStatus (*memory_info)(TpuMemoryArgs* args);

  /**@}*/
  /** Copies (see TpuCopyArgs). */
  TpuStatus (*copy)(TpuCopyArgs* args);

  /** Streams (see TpuStreamArgs). */
  /**@{*/
  TpuStatus (*stream_create)(TpuStreamArgs* args);
  TpuStatus (*stream_synchronize)(TpuStreamArgs* args);
  TpuStatus (*stream_query)(TpuStreamArgs* args);

  /**@}*/
  /** Events (see TpuEventArgs). */
  /**@{*/
  TpuStatus (*event_create)(TpuEventArgs* args);
  TpuStatus (*event_destroy)(TpuEventArgs* args);
  TpuStatus (*event_record)(TpuEventArgs* args);
  TpuStatus (*event_wait)(TpuEventArgs* args);
  TpuStatus (*event_synchronize)(TpuEventArgs* args);
  TpuStatus (*event_query)(TpuEventArgs* args);
  TpuStatus (*event_time)(TpuEventArgs* args);

  /**@}*/
  /** Programs: load, unload (TpuProgramLoadArgs) and run (TpuProgramRunArgs). */
  /**@{*/
  TpuStatus (*program_load)(TpuProgramLoadArgs* args);
  TpuStatus (*program_unload)(TpuProgramLoadArgs* args);
  TpuStatus (*program_run)(TpuProgramRunArgs* args);

  /**@}*/
  TpuStatus (*synchronize)(TpuSynchronizeArgs* args); /**< the whole device */

  /** since version 2 (optional: NULL when the chip does not run tpucore's programs) */
  TpuStatus (*device_target)(TpuDeviceTargetArgs* args);
} TpuPluginApi;

/** The entry point every plugin exports under the name TPU_PLUGIN_ENTRY_POINT. */
typedef const TpuPluginApi* (*TpuPluginGetApiFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TPUCORE_DEVICE_PLUGIN_ABI_H_ */
