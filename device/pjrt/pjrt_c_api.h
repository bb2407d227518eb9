/* The part of the PJRT C API (OpenXLA's plugin interface, the one libtpu exports) that tpucore's
 * PJRT client and its simulator-backed plugin use, declared here in our own words from the
 * published interface. It follows PJRT C API version 0.33 (major 0, minor 33): the function
 * table PJRT_Api lists every slot of that version in its order, so a plugin of version 0.33 or
 * later (the table only grows at its end) can be called through it; slots we never call are
 * plain pointers (PJRT_Unused). Argument structs are declared only for the calls we make, each
 * with every field up to the last one we touch, in the published order.
 *
 * Conventions of PJRT: every argument struct starts with struct_size (the caller's sizeof) and
 * priv (NULL); functions return NULL or a PJRT_Error* the caller frees with PJRT_Error_Destroy;
 * objects are opaque pointers owned as documented on each call.
 *
 * Not verified against a real plugin: no PJRT plugin other than libpjrt_tpucore_sim.so (built
 * from this header) has been loaded by these tests, so a layout mistake here would only show up
 * with a real libtpu / CPU plugin (see device/README.md, "PJRT").
 */
#ifndef TPUCORE_DEVICE_PJRT_PJRT_C_API_H_
#define TPUCORE_DEVICE_PJRT_PJRT_C_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPU_PJRT_API_MAJOR 0
#define TPU_PJRT_API_MINOR 33
#define TPU_PJRT_ENTRY_POINT "GetPjrtApi"

typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;

typedef struct PJRT_Api_Version {
  size_t struct_size;
  void* priv;
  int major_version;
  int minor_version;
} PJRT_Api_Version;

typedef enum {
  PJRT_Error_Code_CANCELLED = 1,
  PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3,
  PJRT_Error_Code_NOT_FOUND = 5,
  PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9,
  PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13
} PJRT_Error_Code;

typedef struct { size_t struct_size; void* priv; PJRT_Error* error; } PJRT_Error_Destroy_Args;
typedef struct {
  size_t struct_size; void* priv;
  const PJRT_Error* error;
  const char* message;  /* out, lives as long as the error */
  size_t message_size;  /* out */
} PJRT_Error_Message_Args;
typedef struct { size_t struct_size; void* priv; const PJRT_Error* error; PJRT_Error_Code code; } PJRT_Error_GetCode_Args;

typedef struct { size_t struct_size; void* priv; } PJRT_Plugin_Initialize_Args;

typedef struct { size_t struct_size; void* priv; PJRT_Event* event; } PJRT_Event_Destroy_Args;
typedef struct { size_t struct_size; void* priv; PJRT_Event* event; } PJRT_Event_Await_Args;

typedef struct {
  size_t struct_size; void* priv;
  void* create_options;  /* PJRT_NamedValue array; we pass none */
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;  /* out */
} PJRT_Client_Create_Args;
typedef struct { size_t struct_size; void* priv; PJRT_Client* client; } PJRT_Client_Destroy_Args;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_Client* client;
  const char* platform_name;  /* out, owned by the client */
  size_t platform_name_size;  /* out */
} PJRT_Client_PlatformName_Args;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_Client* client;
  PJRT_Device** addressable_devices;  /* out, owned by the client */
  size_t num_addressable_devices;     /* out */
} PJRT_Client_AddressableDevices_Args;

typedef struct {
  size_t struct_size; void* priv;
  char* code;  /* the module text ("mlir": MLIR text or bytecode) */
  size_t code_size;
  const char* format;
  size_t format_size;
} PJRT_Program;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_Client* client;
  PJRT_Program* program;
  const char* compile_options;  /* a serialized CompileOptionsProto; may be empty */
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;  /* out */
} PJRT_Client_Compile_Args;

/* Element types, in the published numbering. */
typedef enum {
  PJRT_Buffer_Type_INVALID = 0,
  PJRT_Buffer_Type_PRED = 1,
  PJRT_Buffer_Type_S8 = 2,
  PJRT_Buffer_Type_S16 = 3,
  PJRT_Buffer_Type_S32 = 4,
  PJRT_Buffer_Type_S64 = 5,
  PJRT_Buffer_Type_U8 = 6,
  PJRT_Buffer_Type_U16 = 7,
  PJRT_Buffer_Type_U32 = 8,
  PJRT_Buffer_Type_U64 = 9,
  PJRT_Buffer_Type_F16 = 10,
  PJRT_Buffer_Type_F32 = 11,
  PJRT_Buffer_Type_F64 = 12,
  PJRT_Buffer_Type_BF16 = 13,
  PJRT_Buffer_Type_C64 = 14,
  PJRT_Buffer_Type_C128 = 15,
  PJRT_Buffer_Type_F8E5M2 = 16,
  PJRT_Buffer_Type_F8E4M3FN = 17
} PJRT_Buffer_Type;

typedef enum {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall = 0,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes = 1,
  PJRT_HostBufferSemantics_kZeroCopy = 2
} PJRT_HostBufferSemantics;

typedef struct {
  size_t struct_size; void* priv;
  PJRT_Client* client;
  const void* data;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;  /* NULL: dense, major to minor */
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device;
  PJRT_Memory* memory;       /* NULL: the device's default memory */
  void* device_layout;       /* NULL: dense, major to minor */
  PJRT_Event* done_with_host_buffer;  /* out, freed by the caller */
  PJRT_Buffer* buffer;                /* out, freed by the caller */
} PJRT_Client_BufferFromHostBuffer_Args;

typedef struct { size_t struct_size; void* priv; PJRT_LoadedExecutable* executable; } PJRT_LoadedExecutable_Destroy_Args;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;  /* out, freed with PJRT_Executable_Destroy */
} PJRT_LoadedExecutable_GetExecutable_Args;
typedef struct { size_t struct_size; void* priv; PJRT_Executable* executable; } PJRT_Executable_Destroy_Args;
typedef struct { size_t struct_size; void* priv; PJRT_Executable* executable; size_t num_outputs; } PJRT_Executable_NumOutputs_Args;

typedef struct {
  size_t struct_size; void* priv;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
} PJRT_ExecuteOptions;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;  /* [num_devices][num_args] */
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;  /* [num_devices][num_outputs], arrays owned by the caller */
  PJRT_Event** device_complete_events;  /* optional, [num_devices] */
  PJRT_Device* execute_device;          /* NULL: the compiled-for device */
} PJRT_LoadedExecutable_Execute_Args;

typedef struct { size_t struct_size; void* priv; PJRT_Buffer* buffer; } PJRT_Buffer_Destroy_Args;
typedef struct { size_t struct_size; void* priv; PJRT_Buffer* buffer; PJRT_Buffer_Type type; } PJRT_Buffer_ElementType_Args;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_Buffer* buffer;
  const int64_t* dims;  /* out, lives as long as the buffer */
  size_t num_dims;      /* out */
} PJRT_Buffer_Dimensions_Args;
typedef struct {
  size_t struct_size; void* priv;
  PJRT_Buffer* src;
  void* host_layout;  /* NULL: dense, major to minor */
  void* dst;          /* NULL: only report dst_size */
  size_t dst_size;
  PJRT_Event* event;  /* out, freed by the caller */
} PJRT_Buffer_ToHostBuffer_Args;

typedef PJRT_Error* (*PJRT_Fn_Plugin_Initialize)(PJRT_Plugin_Initialize_Args*);
typedef void* PJRT_Unused;

/* The function table, every slot of version 0.33 in order. */
typedef struct PJRT_Api {
  size_t struct_size;
  void* extension_start;
  PJRT_Api_Version pjrt_api_version;

  void (*PJRT_Error_Destroy)(PJRT_Error_Destroy_Args*);
  void (*PJRT_Error_Message)(PJRT_Error_Message_Args*);
  PJRT_Error* (*PJRT_Error_GetCode)(PJRT_Error_GetCode_Args*);

  PJRT_Error* (*PJRT_Plugin_Initialize)(PJRT_Plugin_Initialize_Args*);
  PJRT_Unused PJRT_Plugin_Attributes;

  PJRT_Error* (*PJRT_Event_Destroy)(PJRT_Event_Destroy_Args*);
  PJRT_Unused PJRT_Event_IsReady;
  PJRT_Unused PJRT_Event_Error;
  PJRT_Error* (*PJRT_Event_Await)(PJRT_Event_Await_Args*);
  PJRT_Unused PJRT_Event_OnReady;

  PJRT_Error* (*PJRT_Client_Create)(PJRT_Client_Create_Args*);
  PJRT_Error* (*PJRT_Client_Destroy)(PJRT_Client_Destroy_Args*);
  PJRT_Error* (*PJRT_Client_PlatformName)(PJRT_Client_PlatformName_Args*);
  PJRT_Unused PJRT_Client_ProcessIndex;
  PJRT_Unused PJRT_Client_PlatformVersion;
  PJRT_Unused PJRT_Client_Devices;
  PJRT_Error* (*PJRT_Client_AddressableDevices)(PJRT_Client_AddressableDevices_Args*);
  PJRT_Unused PJRT_Client_LookupDevice;
  PJRT_Unused PJRT_Client_LookupAddressableDevice;
  PJRT_Unused PJRT_Client_AddressableMemories;
  PJRT_Error* (*PJRT_Client_Compile)(PJRT_Client_Compile_Args*);
  PJRT_Unused PJRT_Client_DefaultDeviceAssignment;
  PJRT_Error* (*PJRT_Client_BufferFromHostBuffer)(PJRT_Client_BufferFromHostBuffer_Args*);

  PJRT_Unused PJRT_DeviceDescription_Id;
  PJRT_Unused PJRT_DeviceDescription_ProcessIndex;
  PJRT_Unused PJRT_DeviceDescription_Attributes;
  PJRT_Unused PJRT_DeviceDescription_Kind;
  PJRT_Unused PJRT_DeviceDescription_DebugString;
  PJRT_Unused PJRT_DeviceDescription_ToString;

  PJRT_Unused PJRT_Device_GetDescription;
  PJRT_Unused PJRT_Device_IsAddressable;
  PJRT_Unused PJRT_Device_LocalHardwareId;
  PJRT_Unused PJRT_Device_AddressableMemories;
  PJRT_Unused PJRT_Device_DefaultMemory;
  PJRT_Unused PJRT_Device_MemoryStats;

  PJRT_Unused PJRT_Memory_Id;
  PJRT_Unused PJRT_Memory_Kind;
  PJRT_Unused PJRT_Memory_DebugString;
  PJRT_Unused PJRT_Memory_ToString;
  PJRT_Unused PJRT_Memory_AddressableByDevices;

  PJRT_Error* (*PJRT_Executable_Destroy)(PJRT_Executable_Destroy_Args*);
  PJRT_Unused PJRT_Executable_Name;
  PJRT_Unused PJRT_Executable_NumReplicas;
  PJRT_Unused PJRT_Executable_NumPartitions;
  PJRT_Error* (*PJRT_Executable_NumOutputs)(PJRT_Executable_NumOutputs_Args*);
  PJRT_Unused PJRT_Executable_SizeOfGeneratedCodeInBytes;
  PJRT_Unused PJRT_Executable_GetCostAnalysis;
  PJRT_Unused PJRT_Executable_OutputMemoryKinds;
  PJRT_Unused PJRT_Executable_OptimizedProgram;
  PJRT_Unused PJRT_Executable_Serialize;

  PJRT_Error* (*PJRT_LoadedExecutable_Destroy)(PJRT_LoadedExecutable_Destroy_Args*);
  PJRT_Error* (*PJRT_LoadedExecutable_GetExecutable)(PJRT_LoadedExecutable_GetExecutable_Args*);
  PJRT_Unused PJRT_LoadedExecutable_AddressableDevices;
  PJRT_Unused PJRT_LoadedExecutable_Delete;
  PJRT_Unused PJRT_LoadedExecutable_IsDeleted;
  PJRT_Error* (*PJRT_LoadedExecutable_Execute)(PJRT_LoadedExecutable_Execute_Args*);
  PJRT_Unused PJRT_Executable_DeserializeAndLoad;
  PJRT_Unused PJRT_LoadedExecutable_Fingerprint;

  PJRT_Error* (*PJRT_Buffer_Destroy)(PJRT_Buffer_Destroy_Args*);
  PJRT_Error* (*PJRT_Buffer_ElementType)(PJRT_Buffer_ElementType_Args*);
  PJRT_Error* (*PJRT_Buffer_Dimensions)(PJRT_Buffer_Dimensions_Args*);
  PJRT_Unused PJRT_Buffer_UnpaddedDimensions;
  PJRT_Unused PJRT_Buffer_DynamicDimensionIndices;
  PJRT_Unused PJRT_Buffer_GetMemoryLayout;
  PJRT_Unused PJRT_Buffer_OnDeviceSizeInBytes;
  PJRT_Unused PJRT_Buffer_Device;
  PJRT_Unused PJRT_Buffer_Memory;
  PJRT_Unused PJRT_Buffer_Delete;
  PJRT_Unused PJRT_Buffer_IsDeleted;
  PJRT_Unused PJRT_Buffer_CopyToDevice;
  PJRT_Error* (*PJRT_Buffer_ToHostBuffer)(PJRT_Buffer_ToHostBuffer_Args*);
  PJRT_Unused PJRT_Buffer_IsOnCpu;
  PJRT_Unused PJRT_Buffer_ReadyEvent;
  PJRT_Unused PJRT_Buffer_UnsafePointer;
  PJRT_Unused PJRT_Buffer_IncreaseExternalReferenceCount;
  PJRT_Unused PJRT_Buffer_DecreaseExternalReferenceCount;
  PJRT_Unused PJRT_Buffer_OpaqueDeviceMemoryDataPointer;

  PJRT_Unused PJRT_CopyToDeviceStream_Destroy;
  PJRT_Unused PJRT_CopyToDeviceStream_AddChunk;
  PJRT_Unused PJRT_CopyToDeviceStream_TotalBytes;
  PJRT_Unused PJRT_CopyToDeviceStream_GranuleSize;
  PJRT_Unused PJRT_CopyToDeviceStream_CurrentBytes;

  PJRT_Unused PJRT_TopologyDescription_Create;
  PJRT_Unused PJRT_TopologyDescription_Destroy;
  PJRT_Unused PJRT_TopologyDescription_PlatformName;
  PJRT_Unused PJRT_TopologyDescription_PlatformVersion;
  PJRT_Unused PJRT_TopologyDescription_GetDeviceDescriptions;
  PJRT_Unused PJRT_TopologyDescription_Serialize;
  PJRT_Unused PJRT_TopologyDescription_Attributes;

  PJRT_Unused PJRT_Compile;

  PJRT_Unused PJRT_Executable_OutputElementTypes;
  PJRT_Unused PJRT_Executable_OutputDimensions;
  PJRT_Unused PJRT_Buffer_CopyToMemory;
  PJRT_Unused PJRT_Executable_OutputShardings;
} PJRT_Api;

typedef const PJRT_Api* (*PJRT_GetApiFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TPUCORE_DEVICE_PJRT_PJRT_C_API_H_ */
