// ParamStore (common part) and HostParamStore: the flat storage in host memory.
#include "param_store.h"

#include <algorithm>
#include <cstring>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "add_into_f32.h"
#include "device_zero3_store.h"
#include "zero3_store.h"

namespace ds::engine {

namespace {

TensorView sub_view(void* base, DType t, std::size_t offset, std::size_t count) {
  return TensorView{static_cast<char*>(base) + offset * dtype_size(t), count, t};
}

void zero_range(const PagedBuffer& b, DType t, std::size_t begin, std::size_t end) {
  if (end <= begin) return;
  TensorView v = sub_view(b.data(), t, begin, end - begin);
  std::memset(v.data, 0, v.bytes());
}

}  // namespace

std::unique_ptr<ParamStore> ParamStore::make(const PartitionMap& map, int rank, const StoreOptions& o, Module& module) {
  if (module.device() == Device::Cuda && map.stage == 3) return make_device_zero3_store(map, rank, o, module.device_stream());
  if (module.device() == Device::Cuda && o.offload_optimizer)
    return make_offload_device_store(map, rank, o, module.device_stream());
  if (module.device() == Device::Cuda) return std::make_unique<DeviceParamStore>(map, rank, o, module.device_stream());
  if (map.stage == 3) return std::make_unique<PartitionedParamStore>(map, rank, o);
  return std::make_unique<HostParamStore>(map, rank, o);
}

ParamStore::ParamStore(const PartitionMap& map, int rank, const StoreOptions& o)
    : map_(map), rank_(rank), slice_(map.slices[std::size_t(rank)]), o_(o) {
  for (const auto& sg : map_.segments(rank)) segments_.push_back(optim::Segment{sg.slice_offset, sg.count});
  if (map_.stage < 3) params_ = HostBuffer(map_.padded_numel, o_.wdtype);
  if (!o_.nvme.optimizer) master_ = HostBuffer(slice_.count, DType::F32);
}

void ParamStore::attach_optimizer(optim::Optimizer& opt) {
  if (o_.nvme.any()) swap_ = std::make_unique<NvmeSwap>(o_.nvme, rank_, step_count(), opt, o_.wdtype);
  if (!o_.nvme.optimizer) opt.init_state(step_count());
}

void ParamStore::set_initial(const float* full) {
  if (master_swapped()) swap_->write_master(0, step_count(), full + slice_.offset);
  else std::memcpy(master_.data(), full + slice_.offset, slice_.count * sizeof(float));
  convert(full, DType::F32, params_.data(), o_.wdtype, map_.padded_numel);
  upload();
}

StateViews ParamStore::state_views(optim::Optimizer& opt) {
  if (master_swapped()) return swap_->map();
  return StateViews{std::span<float>(master_.as<float>(), step_count()), opt.state_tensors()};
}

void ParamStore::done_with_state_views(bool written) {
  if (master_swapped()) swap_->unmap(written);
}

void ParamStore::add_swap_memory(ModelStateBytes& b) const {
  if (swap_) swap_->add_memory(b);
}

std::vector<float> ParamStore::params_fp32() const {
  std::vector<float> out(map_.total_numel);
  convert(params_.data(), o_.wdtype, out.data(), DType::F32, map_.total_numel);
  return out;
}

// ---- HostParamStore ----

HostParamStore::HostParamStore(const PartitionMap& map, int rank, const StoreOptions& o) : ParamStore(map, rank, o) {
  // Address space for the whole flat space; the pages that stay resident (all of them, or
  // under ZeRO-2 this rank's slice) are touched once here (docs/dev/engine.md "Stage 2").
  grads_ = PagedBuffer(map_.padded_numel, o_.wdtype);
  keep_lo_ = 0;
  keep_hi_ = grads_.mapped_bytes();
  if (o_.release_grads) {
    const std::size_t ps = PagedBuffer::page_size(), es = dtype_size(o_.wdtype);
    keep_lo_ = slice_.offset * es / ps * ps;
    keep_hi_ = std::min(grads_.mapped_bytes(), ((slice_.offset + slice_.count) * es + ps - 1) / ps * ps);
  }
  grads_.touch(keep_lo_, keep_hi_);
  if (o_.accum_fp32) accum_ = HostBuffer(slice_.count, DType::F32);
  if (o_.gather_chunk > 0 && o_.gather_chunk < map_.partition_numel)
    gather_recv_ = HostBuffer(o_.gather_chunk * std::size_t(map_.world_size), o_.wdtype);
}

TensorView HostParamStore::params(std::size_t offset, std::size_t count) const {
  return sub_view(const_cast<void*>(params_.data()), o_.wdtype, offset, count);
}

TensorView HostParamStore::grads(std::size_t offset, std::size_t count) const {
  return sub_view(grads_.data(), o_.wdtype, offset, count);
}

TensorView HostParamStore::step_grads(std::size_t offset, std::size_t count) const {
  if (o_.accum_fp32) return sub_view(const_cast<void*>(accum_.data()), DType::F32, offset - slice_.offset, count);
  return grads(offset, count);
}

void HostParamStore::after_backward() {
  // data_types.grad_accum_dtype fp32: the micro-step gradients of this rank's slice (reduced
  // first when world > 1) are added into accum_ and the gradients zeroed, so the sum over the
  // cycle is rounded once, in fp32; the boundary step reads accum_.
  if (!o_.accum_fp32) return;
  add_into_f32(accum_.as<float>(), grads(slice_.offset, slice_.count));
  // Stage 2 (world > 1) already zeroed or released everything outside the slice; stages 0/1
  // hold the whole (reduced) space, which must read zero for the next backward.
  if (o_.release_grads) zero_range(grads_, o_.wdtype, slice_.offset, slice_.offset + slice_.count);
  else zero_range(grads_, o_.wdtype, 0, map_.padded_numel);
}

precision::GradStats HostParamStore::grad_stats() {
  return precision::grad_stats(step_grads(step_offset(), step_count()), 1.0);
}

void HostParamStore::optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) {
  const std::size_t off = step_offset(), n = step_count();
  if (n == 0) return;
  if (master_swapped()) return swap_->step(opt, step_grads(off, n), params(off, n), ctx);
  opt.step(std::span<float>(master_.as<float>(), n), step_grads(off, n), params(off, n), segments_, ctx);
}

void HostParamStore::gather_params(Communicator& comm) {
  // Updated working params of each slice -> every rank, gather_chunk elements per rank per
  // collective (allgather_bucket_size in all); in place when a chunk is a whole slice.
  const std::size_t S = map_.partition_numel, W = std::size_t(map_.world_size), es = dtype_size(o_.wdtype);
  const std::size_t chunk = o_.gather_chunk;
  char* base = static_cast<char*>(params_.data());
  for (std::size_t c = 0; c < S; c += chunk) {
    const std::size_t k = std::min(chunk, S - c);
    TensorView send{base + (slice_.offset + c) * es, k, o_.wdtype};
    if (chunk == S) {
      comm.all_gather(send, TensorView{base, S * W, o_.wdtype});  // in place: send is block rank
    } else {
      char* rb = static_cast<char*>(gather_recv_.data());
      comm.all_gather(send, TensorView{rb, k * W, o_.wdtype});
      for (std::size_t r = 0; r < W; ++r) {
        if (int(r) == rank_) continue;
        std::memcpy(base + (r * S + c) * es, rb + r * k * es, k * es);
      }
    }
  }
}

void HostParamStore::zero_grads() {
  if (o_.accum_fp32) std::memset(accum_.data(), 0, accum_.bytes());
  if (o_.release_grads) {  // normally nothing outside the partition is resident here
    grads_.release(0, keep_lo_);
    grads_.release(keep_hi_, grads_.mapped_bytes());
  }
  grads_.touch(keep_lo_, keep_hi_);
}

void HostParamStore::add_memory(ModelStateBytes& b) const {
  b.params = params_.bytes();
  if (o_.release_grads) {
    b.grads = grads_.resident_bytes(keep_lo_, keep_hi_);  // the partition's pages, kept for good
  } else {
    b.grads = grads_.bytes();
  }
  b.grads += accum_.bytes();  // the fp32 accumulation buffer (data_types.grad_accum_dtype)
  b.master = master_.bytes();
  b.comm_scratch += gather_recv_.bytes();
}

}  // namespace ds::engine
