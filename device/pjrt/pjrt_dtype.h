// The PJRT element type of a tensor dtype, shared by our PJRT client and our PJRT plugin.
#pragma once

#include "device/pjrt/pjrt_c_api.h"
#include "tpucore/core/dtype.h"

namespace tpu::pjrt {

inline PJRT_Buffer_Type buffer_type_of(DType t) {
  switch (t) {
    case DType::boolean: return PJRT_Buffer_Type_PRED;
    case DType::i8: return PJRT_Buffer_Type_S8;
    case DType::i32: return PJRT_Buffer_Type_S32;
    case DType::i64: return PJRT_Buffer_Type_S64;
    case DType::u8: return PJRT_Buffer_Type_U8;
    case DType::f16: return PJRT_Buffer_Type_F16;
    case DType::f32: return PJRT_Buffer_Type_F32;
    case DType::bf16: return PJRT_Buffer_Type_BF16;
    case DType::f8e4m3: return PJRT_Buffer_Type_F8E4M3FN;
    case DType::f8e5m2: return PJRT_Buffer_Type_F8E5M2;
  }
  return PJRT_Buffer_Type_INVALID;
}

}  // namespace tpu::pjrt
