/// @file
/// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors):
///
///   u64 little-endian N | N bytes of JSON header | data buffer
///
/// The header maps each tensor name to {"dtype": "F32"|"BF16"|"F16"|"I64"|"I32"|"I8"|"U8"|"BOOL",
/// "shape": [...], "data_offsets": [begin, end]} (offsets relative to the data buffer), plus an
/// optional "__metadata__" object of string -> string. The writer pads the header with spaces so
/// the data buffer starts 8-byte aligned, and lays the tensors out back to back.
///
/// The reader is strict, as the format asks: every tensor's byte span must equal shape x dtype
/// size, the spans must not overlap and must cover the data buffer exactly (no holes, no
/// trailing bytes), names are unique, and the header is a JSON object of at most 100 MB. Unknown
/// fields inside a tensor entry are ignored (forward compatibility). BOOL bytes other than 0 are
/// read as true. Every violation is a tpu::Error naming the file and the tensor or field.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu {

/// Named tensors in a chosen order.
using TensorList = std::vector<std::pair<std::string, Tensor>>;
/// String to string (a safetensors file's metadata).
using StringMap = std::map<std::string, std::string>;

/// A parsed safetensors file.
struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;  ///< by name (sorted)
  StringMap metadata;                     ///< "__metadata__", empty if absent
};

/// Writes tensors (in the given order) to path. Tensors on other devices are copied to the host,
/// non-contiguous ones are written contiguous. The file is written to "<path>.tmp" and renamed,
/// so a failed save never leaves a half-written checkpoint under path.
void save_safetensors(const std::string& path, const TensorList& tensors, const StringMap& metadata = {});
/// Writes tensors in name order (as the overload above).
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const StringMap& metadata = {});
/// The same bytes, in memory.
std::vector<uint8_t> serialize_safetensors(const TensorList& tensors, const StringMap& metadata = {});

/// Reads every tensor of a file onto `device` (host by default).
std::map<std::string, Tensor> load_safetensors(const std::string& path, Device device = Device());
/// Reads every tensor and the metadata of a file onto `device`.
SafetensorsContents read_safetensors(const std::string& path, Device device = Device());
/// Reads the tensors of a file one at a time, in file order, onto `device` (host by default),
/// handing each to `fn` before the next is read: a loader that converts and drops each tensor
/// holds one at a time, not the file. The whole header and layout are checked first (the same
/// errors as load_safetensors); returns the file's metadata.
StringMap for_each_safetensor(const std::string& path, const std::function<void(const std::string&, Tensor)>& fn,
                              Device device = Device());
/// From bytes in memory; `name` stands for the file in error messages.
SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, std::string_view name = "<memory>",
                                      Device device = Device());

/// The safetensors dtype string of a DType ("F32", "BF16", ...) and back (a tpu::Error naming
/// `where` for an unknown or unsupported string).
std::string_view safetensors_dtype_name(DType t);
/// The DType of a safetensors dtype string.
DType parse_safetensors_dtype(std::string_view s, std::string_view where = "safetensors");

/// For loaders of module state: a tpu::Error unless `loaded` has the dtype and shape of
/// `expected`, e.g. "load_state_dict: tensor 'fc.weight' in model.safetensors is bf16 [10, 4],
/// the module expects f32 [10, 4]". `source` names the checkpoint.
void check_checkpoint_tensor(std::string_view what, std::string_view name, std::string_view source,
                             const Tensor& loaded, const Tensor& expected);

}  // namespace tpu
