/// @file
/// Data: IDX files (the MNIST family's format, plain or gzip-compressed), Fashion-MNIST from
/// Debian's dataset-fashion-mnist package, and a DataLoader that batches (input, target) rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tpucore/core/tensor.h"

namespace tpu::data {

// ---------------- IDX ----------------
/// Format: bytes 0x00 0x00, a type byte (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32,
/// 0x0E f64), the number of dims, then each dim as a big-endian u32, then the big-endian data.
/// u8/i8/i32/f32 keep their type; i16 widens to i32 and f64 narrows to f32 (tpucore has neither).
/// A file starting with the gzip magic (1f 8b) is decompressed first. Bad magic, an unknown type,
/// a truncated file, trailing bytes, or a corrupt gzip stream is a tpu::Error naming the file.
/// Reads an IDX file (see the format above) into a cpu tensor.
Tensor read_idx(const std::string& path);
/// Parses IDX bytes in memory; `name` stands for the file in error messages.
Tensor parse_idx(std::span<const uint8_t> bytes, std::string_view name = "<memory>");
/// Decompresses a gzip (or zlib) stream; concatenated gzip members are joined.
std::vector<uint8_t> gunzip(std::span<const uint8_t> bytes, std::string_view name = "<memory>");

// ---------------- datasets ----------------
/// N rows along dim 0 of `inputs` and of `targets` (targets may be undefined).
struct TensorDataset {
  /// The rows: inputs, and targets (undefined when there are none).
  ///@{
  Tensor inputs, targets;
  ///@}
  /// Number of rows.
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

/// Which part of a dataset.
enum class Split { train, test };

/// Fashion-MNIST: inputs u8 [N, 28, 28] (N = 60000 train, 10000 test), targets i32 [N] class
/// indices 0-9. The directory is `dir` if given, else $TPU_FASHION_MNIST_DIR, else Debian's
/// /usr/share/datasets/fashion-mnist; files may be plain or .gz. Missing files are a tpu::Error
/// that says how to install the package.
TensorDataset load_fashion_mnist(Split split, const std::string& dir = {});
std::string fashion_mnist_dir(const std::string& dir = {});  ///< the directory that would be used
bool fashion_mnist_available(const std::string& dir = {});   ///< all four files are present
/// Fashion-MNIST's class names, by target index.
inline constexpr const char* kFashionMnistClasses[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// ---------------- DataLoader ----------------
/// One batch of a DataLoader: [batch, ...] rows of inputs and of targets.
struct Batch {
  /// Inputs and targets (undefined when the dataset has none).
  ///@{
  Tensor inputs, targets;
  ///@}
};
/// A function applied to a whole batch tensor.
using Transform = std::function<Tensor(const Tensor&)>;
/// A transform to f32 times `scale` (u8 pixels to [0, 1] by default), optionally flattened
/// to [batch, rest] (for MLPs).
Transform to_float(double scale = 1.0 / 255.0, bool flatten = false);

/// Options of a DataLoader.
struct DataLoaderOptions {
  /// Rows per batch.
  int64_t batch_size = 64;
  /// A new permutation every epoch (else rows in order).
  bool shuffle = false;
  uint64_t seed = 0;       ///< epoch e uses the permutation of Generator(seed + e)
  bool drop_last = false;  ///< drop a last batch smaller than batch_size
  Transform transform = {};          ///< applied to each batch's inputs (after gathering)
  Transform target_transform = {};   ///< applied to each batch's targets
  std::optional<Device> device = {};  ///< batches are moved here (after the transforms)
};

/// Iterates a dataset in batches of gathered, contiguous rows:
///   for (const auto& [x, y] : loader) ...
/// Each begin() starts the next epoch (0, 1, 2, ...; set_epoch() picks it, e.g. on resume):
/// with shuffle, the order is the permutation for (seed + epoch); without, it is 0..N-1.
class DataLoader {
 public:
  /// A loader over `dataset`; a batch_size below 1 or inputs and targets of different row counts
  /// are a tpu::Error.
  DataLoader(TensorDataset dataset, DataLoaderOptions options);
  /// A loader over rows of `inputs` and `targets`.
  DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options)
      : DataLoader(TensorDataset{std::move(inputs), std::move(targets)}, std::move(options)) {}

  int64_t size() const;  ///< batches per epoch
  /// Rows in the dataset.
  int64_t num_samples() const { return dataset_.size(); }
  /// The options.
  const DataLoaderOptions& options() const { return opt_; }
  /// The dataset.
  const TensorDataset& dataset() const { return dataset_; }
  int64_t epoch() const { return next_epoch_; }  ///< the epoch the next begin() starts
  /// Sets the epoch the next begin() starts.
  void set_epoch(int64_t e) { next_epoch_ = e; }
  /// The sample order of an epoch.
  std::vector<int64_t> order(int64_t epoch) const;
  /// Batch `index` of an epoch's order (0 <= index < size()).
  Batch batch(const std::vector<int64_t>& order, int64_t index) const;

  /// Input iterator over the batches of one epoch.
  class Iterator {
   public:
    /// A Batch.
    using value_type = Batch;
    /// For iterator traits.
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    /// The current batch.
    const Batch& operator*() const { return current_; }
    /// The current batch.
    const Batch* operator->() const { return &current_; }
    /// Gathers the next batch.
    Iterator& operator++();
    /// Same position.
    bool operator==(const Iterator& o) const { return index_ == o.index_; }
    /// Index of the current batch in the epoch.
    int64_t index() const { return index_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* l, std::shared_ptr<const std::vector<int64_t>> order, int64_t index);
    const DataLoader* loader_ = nullptr;
    std::shared_ptr<const std::vector<int64_t>> order_;
    int64_t index_ = 0;
    Batch current_;
  };
  /// Starts the next epoch (see the class description) at its first batch.
  Iterator begin();
  /// Past the last batch.
  Iterator end() const;

 private:
  TensorDataset dataset_;
  DataLoaderOptions opt_;
  int64_t next_epoch_ = 0;
};

}  // namespace tpu::data
