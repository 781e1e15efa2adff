// A Batch as the module receives it, and the source's result checked as the loss; logits
// that the cross-entropy against the class ids turns into the loss (the contract in
// ds/torch/torch_module.h).
#include "torch_call.h"
#include "torch_impl.h"

namespace ds::torch {

namespace {

std::vector<std::int64_t> with_batch(std::int64_t batch, std::span<const std::int64_t> shape,
                                     std::int64_t fallback) {
  std::vector<std::int64_t> dims{batch};
  if (shape.empty()) {
    if (fallback > 0) dims.push_back(fallback);
  } else {
    dims.insert(dims.end(), shape.begin(), shape.end());
  }
  return dims;
}

// The caller's memory copied into a tensor of `dtype` (the module may keep its inputs for
// backward, after the caller has moved on).
template <class T>
at::Tensor owned(std::span<const T> data, const std::vector<std::int64_t>& dims, at::ScalarType from,
                 at::ScalarType dtype, const std::string& path) {
  std::int64_t numel = 1;
  for (auto d : dims) numel *= d;
  DS_CHECK(numel == std::int64_t(data.size()), path << ": the batch holds " << data.size()
                                                    << " values where its shape needs " << numel);
  const auto view = at::from_blob(const_cast<T*>(data.data()), dims, at::TensorOptions().dtype(from));
  return dtype == from ? view.clone() : view.to(dtype);
}

struct BatchTensors {
  at::Tensor inputs, targets;
};

BatchTensors batch_tensors(const Batch& b, at::ScalarType working, const std::string& path) {
  if (b.features.empty()) {  // token model
    const std::vector<std::int64_t> dims{b.batch, b.seq};
    return {owned(b.inputs, dims, at::kInt, at::kLong, path), owned(b.targets, dims, at::kInt, at::kLong, path)};
  }
  const auto in_dims = with_batch(b.batch, b.sample_shape, b.feature_dim);
  const auto target_dims = with_batch(b.batch, b.target_shape, 0);
  at::Tensor inputs = owned(b.features, in_dims, at::kFloat, working, path);
  // Float targets stay fp32 whatever the working dtype: the loss is best taken in fp32 (and
  // libtorch's CPU mse_loss has no bf16 kernel).
  at::Tensor targets = b.target_values.empty() ? owned(b.targets, target_dims, at::kInt, at::kLong, path)
                                               : owned(b.target_values, target_dims, at::kFloat, at::kFloat, path);
  return {std::move(inputs), std::move(targets)};
}

at::Tensor checked_loss(const at::Tensor& loss, bool need_grad, const std::string& path) {
  DS_CHECK(loss.defined(), path << ": forward returned no loss (an undefined tensor)");
  DS_CHECK(loss.numel() == 1 && loss.dim() <= 1 && at::isFloatingType(loss.scalar_type()),
           path << ": forward must return the mean loss as a floating-point scalar, got a tensor of shape "
                << loss.sizes() << " and dtype " << loss.scalar_type());
  DS_CHECK(!need_grad || loss.requires_grad(),
           path << ": the loss forward returned does not depend on any parameter that requires grad");
  return loss.reshape({});
}

}  // namespace

// The mean cross-entropy of logits [*target shape, classes] against class ids, in fp32
// whatever the working dtype, as F.cross_entropy(logits.view(-1, classes), targets.view(-1)).
at::Tensor logits_loss(const at::Tensor& logits, const at::Tensor& targets, const std::string& path) {
  const bool shaped = logits.dim() == targets.dim() + 1 && logits.sizes().slice(0, std::size_t(targets.dim())) ==
                                                               targets.sizes();
  DS_CHECK(shaped && at::isFloatingType(logits.scalar_type()),
           path << ": forward(inputs) must return floating-point logits, the targets' shape " << targets.sizes()
                << " and a class axis, got shape " << logits.sizes() << " and dtype " << logits.scalar_type());
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}));
}

at::Tensor TorchModule::Impl::forward_loss(const Batch& batch, bool need_grad) {
  BatchTensors t = batch_tensors(batch, working, path);
  return checked_loss(source_loss(t.inputs, t.targets, need_grad), need_grad, path);
}

}  // namespace ds::torch
