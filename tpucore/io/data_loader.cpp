// DataLoader: epoch orders (seeded Fisher-Yates), batches of gathered rows, transforms.
#include <numeric>

#include "tpucore/data.h"
#include "tpucore/ops.h"

namespace tpu::data {

Transform to_float(double scale, bool flatten) {
  return [scale, flatten](const Tensor& x) {
    Tensor y = mul(x.to(DType::f32), scale);
    return flatten && y.dim() > 1 ? y.reshape({y.size(0), -1}) : y;
  };
}

DataLoader::DataLoader(TensorDataset dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opt_(std::move(options)) {
  TPU_CHECK(dataset_.inputs.defined(), "DataLoader: the dataset has no inputs tensor");
  TPU_CHECK(dataset_.inputs.dim() >= 1, "DataLoader: inputs must have a leading sample dim, got shape {}",
            dataset_.inputs.shape().str());
  if (dataset_.targets.defined())
    TPU_CHECK(dataset_.targets.dim() >= 1 && dataset_.targets.size(0) == dataset_.inputs.size(0),
              "DataLoader: inputs {} and targets {} must have the same number of samples (dim 0)",
              dataset_.inputs.shape().str(), dataset_.targets.shape().str());
  TPU_CHECK(opt_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got {}", opt_.batch_size);
}

int64_t DataLoader::size() const {
  const int64_t n = num_samples(), b = opt_.batch_size;
  return opt_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> DataLoader::order(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<size_t>(num_samples()));
  std::iota(p.begin(), p.end(), int64_t{0});
  if (!opt_.shuffle) return p;
  Generator g(opt_.seed + static_cast<uint64_t>(epoch));
  for (size_t i = p.size(); i > 1; --i) {
    // Unbiased draw in [0, i): reject the top partial range of 2^64.
    const uint64_t bound = i, limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = g.next_u64();
    while (r >= limit);
    std::swap(p[i - 1], p[static_cast<size_t>(r % bound)]);
  }
  return p;
}

Batch DataLoader::batch(const std::vector<int64_t>& order, int64_t index) const {
  TPU_CHECK(index >= 0 && index < size(), "DataLoader::batch: index {} out of range for {} batches", index, size());
  TPU_CHECK(static_cast<int64_t>(order.size()) == num_samples(),
            "DataLoader::batch: the order has {} entries for {} samples", order.size(), num_samples());
  const int64_t start = index * opt_.batch_size;
  const int64_t count = std::min(opt_.batch_size, num_samples() - start);
  // Consecutive rows are a slice; anything else a gather.
  bool consecutive = true;
  for (int64_t i = 1; i < count && consecutive; ++i)
    consecutive = order[static_cast<size_t>(start + i)] == order[static_cast<size_t>(start)] + i;
  auto take = [&](const Tensor& t) {
    if (consecutive) return t.narrow(0, order[static_cast<size_t>(start)], count).contiguous();
    std::vector<int32_t> ids(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(order[static_cast<size_t>(start + i)]);
    return index_select(t, 0, from_vector(ids, Shape{count}, TensorOptions(DType::i32, t.device())));
  };
  Batch b{take(dataset_.inputs), dataset_.targets.defined() ? take(dataset_.targets) : Tensor()};
  if (opt_.transform) b.inputs = opt_.transform(b.inputs);
  if (opt_.target_transform && b.targets.defined()) b.targets = opt_.target_transform(b.targets);
  if (opt_.device) {
    b.inputs = b.inputs.to(*opt_.device);
    if (b.targets.defined()) b.targets = b.targets.to(*opt_.device);
  }
  return b;
}

DataLoader::Iterator::Iterator(const DataLoader* l, std::shared_ptr<const std::vector<int64_t>> order, int64_t index)
    : loader_(l), order_(std::move(order)), index_(index) {
  if (index_ < loader_->size()) current_ = loader_->batch(*order_, index_);
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++index_;
  current_ = index_ < loader_->size() ? loader_->batch(*order_, index_) : Batch{};
  return *this;
}

DataLoader::Iterator DataLoader::begin() {
  TPU_CHECK(num_samples() <= INT32_MAX, "DataLoader: {} samples exceed the i32 index range", num_samples());
  auto ord = std::make_shared<const std::vector<int64_t>>(order(next_epoch_++));
  return Iterator(this, std::move(ord), 0);
}

DataLoader::Iterator DataLoader::end() const {
  Iterator it;
  it.index_ = size();
  return it;
}

}  // namespace tpu::data
