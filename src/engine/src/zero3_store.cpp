// PartitionedParamStore: the stage-3 host store (zero3_store.h).
#include "zero3_store.h"

#include <algorithm>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "add_into_f32.h"

namespace ds::engine {

PartitionedParamStore::PartitionedParamStore(const PartitionMap& map, int rank, const StoreOptions& o)
    : Zero3Store(map, rank, o) {
  DS_CHECK(map_.stage == 3, "PartitionedParamStore needs a stage-3 partition map");
  flat_params_ = PagedBuffer(map_.padded_numel, o_.wdtype, /*huge=*/true);
  flat_grads_ = PagedBuffer(map_.padded_numel, o_.wdtype, /*huge=*/true);
  if (!o_.nvme.params) part_params_ = HostBuffer(map_.partition_numel, o_.wdtype);
  part_grads_ = HostBuffer(map_.partition_numel, DType::F32);
}

TensorView PartitionedParamStore::params(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(flat_params_.data()) + offset * dtype_size(o_.wdtype), count, o_.wdtype};
}

TensorView PartitionedParamStore::grads(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(flat_grads_.data()) + offset * dtype_size(o_.wdtype), count, o_.wdtype};
}

TensorView PartitionedParamStore::part_params(std::size_t g) const {
  DS_CHECK(!params_swapped(), "stage 3: the parameter partition is in the NVMe swap file (read_part_params)");
  const FlatGroup& fg = map_.groups[g];
  return TensorView{static_cast<char*>(const_cast<void*>(part_params_.data())) + fg.part_offset * dtype_size(o_.wdtype),
                    fg.piece, o_.wdtype};
}

void PartitionedParamStore::read_part_params(std::size_t g, void* dst) const {
  const FlatGroup& fg = map_.groups[g];
  if (params_swapped()) swap_->read_params(fg.part_offset, fg.piece, dst);
  else std::memcpy(dst, part_params(g).data, fg.piece * dtype_size(o_.wdtype));
}

std::uint64_t PartitionedParamStore::start_read_part_params(std::size_t g, void* dst) {
  DS_CHECK(params_swapped(), "stage 3: start_read_part_params without offload_param nvme");
  const FlatGroup& fg = map_.groups[g];
  return swap_->start_read_params(fg.part_offset, fg.piece, dst);
}

void PartitionedParamStore::finish_read_part_params(std::uint64_t id) { swap_->finish_read_params(id); }

float* PartitionedParamStore::part_grads(std::size_t g) const {
  return const_cast<float*>(part_grads_.as<float>()) + map_.groups[g].part_offset;
}

void PartitionedParamStore::release_params(std::size_t g) {
  const auto [lo, hi] = group_bytes(g);
  flat_params_.release(lo, hi);
}

void PartitionedParamStore::release_grads(std::size_t g) {
  const auto [lo, hi] = group_bytes(g);
  flat_grads_.release(lo, hi);
}

void PartitionedParamStore::fold(std::size_t g, TensorView reduced) { add_into_f32(part_grads(g), reduced); }

void* PartitionedParamStore::reduce_scratch(std::size_t bytes) {
  if (rs_scratch_.bytes() < bytes) rs_scratch_ = HostBuffer(bytes, DType::U8);
  return rs_scratch_.data();
}

std::pair<std::size_t, std::size_t> PartitionedParamStore::group_bytes(std::size_t g) const {
  const FlatGroup& fg = map_.groups[g];
  // From the group's 2 MiB boundary to the next one: the gap after it is its own (never
  // written), so a huge page over its tail goes back whole.
  const std::size_t hp = PagedBuffer::kHugePage, es = dtype_size(o_.wdtype);
  const std::size_t lo = fg.offset * es;
  const std::size_t hi = std::min(flat_params_.mapped_bytes(), ((fg.offset + fg.padded) * es + hp - 1) / hp * hp);
  return {lo, hi};
}

void PartitionedParamStore::set_initial(const float* full) {
  for (std::size_t g = 0; g < map_.groups.size(); ++g) set_initial_group(g, full + map_.groups[g].offset);
}

void PartitionedParamStore::set_initial_group(std::size_t gi, const float* values) {
  const FlatGroup& g = map_.groups[gi];
  const float* mine = values + std::size_t(rank_) * g.piece;
  if (master_swapped()) swap_->write_master(g.part_offset, g.piece, mine);
  else std::memcpy(master_.as<float>() + g.part_offset, mine, g.piece * sizeof(float));
  if (!params_swapped()) return convert(mine, DType::F32, part_params(gi).data, o_.wdtype, g.piece);
  std::vector<char> w(g.piece * dtype_size(o_.wdtype));
  convert(mine, DType::F32, w.data(), o_.wdtype, g.piece);
  swap_->write_params(g.part_offset, g.piece, w.data());
}

void PartitionedParamStore::params_from_master(const float* master) {
  // The working partition = the master rounded to the working dtype, in memory or in the
  // parameter swap file, written behind (the fetcher's reads of a piece wait for its writes).
  const std::size_t P = map_.partition_numel;
  if (!params_swapped()) return convert(master, DType::F32, part_params_.data(), o_.wdtype, P);
  swap_->write_params_behind(master);
}

precision::GradStats PartitionedParamStore::grad_stats() {
  return precision::grad_stats(TensorView{part_grads_.data(), map_.partition_numel, DType::F32}, 1.0);
}

void PartitionedParamStore::optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) {
  const std::size_t n = map_.partition_numel;
  const TensorView grads{part_grads_.data(), n, DType::F32};
  // Padding elements have zero gradient and zero master, so every optimizer leaves them zero.
  if (master_swapped()) return swap_->step(opt, grads, params_swapped() ? TensorView{} : TensorView{part_params_.data(), n, o_.wdtype}, ctx);
  if (params_swapped()) {  // the master in memory: step it, then write the rounded partition out
    opt.step(std::span<float>(master_.as<float>(), n), grads, TensorView{}, segments_, ctx);
    return params_from_master(master_.as<float>());
  }
  opt.step(std::span<float>(master_.as<float>(), n), TensorView{part_grads_.data(), n, DType::F32},
           TensorView{part_params_.data(), n, o_.wdtype}, segments_, ctx);
}

void PartitionedParamStore::zero_grads() {
  std::memset(part_grads_.data(), 0, part_grads_.bytes());
  flat_grads_.release(0, flat_grads_.mapped_bytes());  // normally released group by group already
}

void PartitionedParamStore::done_with_state_views(bool written) {
  if (written) {
    const float* master = master_swapped() ? swap_->mapped_master() : master_.as<float>();
    if (master) params_from_master(master);
  }
  ParamStore::done_with_state_views(written);
}

std::vector<float> PartitionedParamStore::params_fp32() const {
  const std::size_t P = map_.partition_numel, W = std::size_t(map_.world_size);
  std::vector<float> mine(P), all(P * W), out(map_.total_numel);
  if (params_swapped()) {
    std::vector<char> w(P * dtype_size(o_.wdtype));
    swap_->read_params(0, P, w.data());
    convert(w.data(), o_.wdtype, mine.data(), DType::F32, P);
  } else {
    convert(part_params_.data(), o_.wdtype, mine.data(), DType::F32, P);
  }
  if (W > 1) {
    DS_CHECK(comm_ != nullptr, "stage 3: gathering the parameters needs the communicator");
    comm_->all_gather(TensorView{mine.data(), P, DType::F32}, TensorView{all.data(), P * W, DType::F32});
  } else {
    all = mine;
  }
  for (const FlatGroup& g : map_.groups)
    for (std::size_t r = 0; r < W; ++r) {
      const std::size_t n = g.piece_real(int(r));
      if (n > 0) std::memcpy(out.data() + g.dense_offset + r * g.piece, all.data() + r * P + g.part_offset, n * sizeof(float));
    }
  return out;
}

void PartitionedParamStore::add_memory(ModelStateBytes& b) const {
  b.params = part_params_.bytes() + flat_params_.resident_bytes();  // partition + groups gathered now
  b.grads = part_grads_.bytes() + flat_grads_.resident_bytes();
  b.master = master_.bytes();
}

}  // namespace ds::engine
