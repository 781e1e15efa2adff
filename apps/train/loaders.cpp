#include "loaders.h"

#include "ds/data/feature_loader.h"

namespace ds::train {

namespace {

std::unique_ptr<data::BatchLoader> make_loader(const Job& j, bool train, std::size_t samples, bool drop_last) {
  data::DistributedSampler sampler(samples, std::size_t(j.dp_size), std::size_t(j.dp_rank),
                                   std::size_t(j.cfg.train_micro_batch_size_per_gpu), train, j.seed, drop_last);
  if (j.feature_data())
    return std::make_unique<data::FeatureLoader>(train ? *j.train_arrays : *j.val_arrays, std::move(sampler));
  return std::make_unique<data::Loader>(train ? j.train_src() : j.val_src(), j.spec.block_size, std::move(sampler));
}

}  // namespace

std::unique_ptr<data::BatchLoader> make_train_loader(const Job& j) {
  return make_loader(j, true, j.train_samples(), j.cfg.dataloader_drop_last);
}

std::unique_ptr<data::BatchLoader> make_val_loader(const Job& j) {
  const std::size_t samples = j.val_samples();
  if (samples < std::size_t(j.dp_size) || j.eval_iters <= 0) return nullptr;
  return make_loader(j, false, samples, false);
}

}  // namespace ds::train
