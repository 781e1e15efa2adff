// DeviceParamStore: the flat storage on a CUDA device (the GPU path, docs/dev/gpu.md).
#include "param_store.h"

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "engine_testing.h"

#if DS_PRECISION_HAVE_CUDA
#include <cuda_runtime.h>

#include <atomic>

#include "device_grad_stats.h"
#include "device_step.h"
#include "ds/core/cuda_check.h"
#include "ds/precision/cuda_kernels.h"
#endif

namespace ds::engine {

#if DS_PRECISION_HAVE_CUDA

namespace {
std::atomic<std::uint64_t> g_stream_syncs{0};
}  // namespace

void note_device_stream_sync() { g_stream_syncs.fetch_add(1, std::memory_order_relaxed); }
std::uint64_t device_stream_syncs() { return g_stream_syncs.load(std::memory_order_relaxed); }

namespace {

// The ZeRO-2 gradient chunks under GradPages' names (what the GradReducer calls).
class DeviceGradPages final : public GradPages {
 public:
  DeviceGradPages(DevicePagedBuffer& b, void* stream) : b_(b), stream_(stream) {}
  std::size_t unit() const override { return b_.chunk_bytes(); }
  std::size_t mapped_bytes() const override { return b_.mapped_bytes(); }
  bool on_device() const override { return true; }
  void make_resident(std::size_t begin, std::size_t end) override { b_.populate(begin, end); }
  void release(std::size_t begin, std::size_t end) override { b_.release(begin, end); }
  void zero(std::size_t begin, std::size_t end) override {
    if (end > begin) DS_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(b_.data()) + begin, 0, end - begin, as_stream(stream_)));
  }
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const override { return b_.resident_bytes(begin, end); }

 private:
  DevicePagedBuffer& b_;
  void* stream_;
};
}  // namespace

DeviceParamStore::DeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o, void* stream)
    : ParamStore(map, rank, o), n_(map.padded_numel), master_n_(slice_.count), stream_(stream) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) cudaGetLastError();
  DS_CHECK(rc == cudaSuccess && count > 0, "the module runs on a CUDA device but no CUDA device is visible ("
                                               << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices")
                                               << "): train it on the CPU, or where a GPU is visible");
  try {
    const std::size_t wb = std::max<std::size_t>(n_, 1) * dtype_size(o_.wdtype);
    DS_CUDA_CHECK(cudaMalloc(&d_params_, wb));
    if (o_.release_grads) {
      // ZeRO-2 with several ranks: address space for every gradient, memory for the chunks of
      // this rank's slice only (mapped and zeroed here, kept for good); the GradReducer maps
      // the rest as backward writes it and unmaps it once reduced.
      grad_pages_ = std::make_unique<DevicePagedBuffer>(wb, stream_);
      grad_space_ = std::make_unique<DeviceGradPages>(*grad_pages_, stream_);
      d_grads_ = grad_pages_->data();
      const ByteRange keep = units_covering(slice_.offset, slice_.count, dtype_size(o_.wdtype),
                                            grad_pages_->chunk_bytes(), grad_pages_->mapped_bytes());
      keep_lo_ = keep.begin;
      keep_hi_ = keep.end;
      grad_pages_->touch(keep_lo_, keep_hi_);
      // Until views_bound(): each gradient view's first chunk, so that the module's bind()
      // finds device memory where it asks (cudaPointerGetAttributes on the view's start).
      for (const auto& p : map_.params) {
        if (p.numel == 0) continue;
        const ByteRange first = units_covering(p.offset, 1, dtype_size(o_.wdtype), grad_pages_->chunk_bytes(),
                                               grad_pages_->mapped_bytes());
        grad_pages_->populate(first.begin, first.end);
      }
    } else {
      DS_CUDA_CHECK(cudaMalloc(&d_grads_, wb));
    }
    // offload_optimizer: the master stays in host memory (OffloadDeviceParamStore).
    if (!o_.offload_optimizer) DS_CUDA_CHECK(cudaMalloc(&d_master_, std::max<std::size_t>(master_n_, 1) * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_sumsq_, sizeof(double)));
    DS_CUDA_CHECK(cudaMalloc(&d_found_inf_, sizeof(int)));
    DS_CUDA_CHECK(cudaMallocHost(&h_stats_, sizeof(DeviceStatsHost)));
    async_ = std::make_unique<DeviceAsyncStep>(stream_);
    DS_CUDA_CHECK(cudaMemsetAsync(d_params_, 0, wb, as_stream(stream_)));
    if (!grad_pages_) DS_CUDA_CHECK(cudaMemsetAsync(d_grads_, 0, wb, as_stream(stream_)));
  } catch (...) {
    release();
    throw;
  }
}

DeviceParamStore::~DeviceParamStore() { release(); }

void DeviceParamStore::release() {
  // No checks: also runs while an exception unwinds.
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  cudaFree(d_params_);
  if (grad_pages_) {
    grad_space_.reset();
    grad_pages_.reset();  // synchronises the stream, unmaps, frees the address range
  } else {
    cudaFree(d_grads_);
  }
  cudaFree(d_master_);
  cudaFree(d_sumsq_);
  cudaFree(d_found_inf_);
  cudaFreeHost(h_stats_);
  async_.reset();
  d_params_ = d_grads_ = nullptr;
  d_master_ = nullptr;
  d_sumsq_ = nullptr;
  d_found_inf_ = nullptr;
  h_stats_ = nullptr;
}

TensorView DeviceParamStore::params(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(d_params_) + offset * dtype_size(o_.wdtype), count, o_.wdtype};
}
TensorView DeviceParamStore::grads(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(d_grads_) + offset * dtype_size(o_.wdtype), count, o_.wdtype};
}

void DeviceParamStore::upload() {
  // Pageable host memory: the copies are staged, so the host buffers may change afterwards.
  DS_CUDA_CHECK(cudaMemcpyAsync(d_params_, params_.data(), n_ * dtype_size(o_.wdtype), cudaMemcpyHostToDevice,
                                as_stream(stream_)));
  if (d_master_)
    DS_CUDA_CHECK(cudaMemcpyAsync(d_master_, master_.data(), master_n_ * sizeof(float), cudaMemcpyHostToDevice,
                                  as_stream(stream_)));
  synchronize();
}

void DeviceParamStore::to_host(optim::Optimizer& opt) {
  if (d_master_)
    DS_CUDA_CHECK(cudaMemcpyAsync(master_.data(), d_master_, master_n_ * sizeof(float), cudaMemcpyDeviceToHost,
                                  as_stream(stream_)));
  download_params(params_);  // synchronises, so the master copy is complete too
  opt.download_state();
}

void DeviceParamStore::from_host(optim::Optimizer& opt, bool with_optimizer_state) {
  upload();
  if (with_optimizer_state) opt.upload_state();
}

void DeviceParamStore::download_params(HostBuffer& params) const {
  DS_CHECK(params.bytes() >= n_ * dtype_size(o_.wdtype),
           "DeviceParamStore: host params smaller than the device params");
  DS_CUDA_CHECK(cudaMemcpyAsync(params.data(), d_params_, n_ * dtype_size(o_.wdtype), cudaMemcpyDeviceToHost,
                                as_stream(stream_)));
  synchronize();
}

std::vector<float> DeviceParamStore::params_fp32() const {
  std::vector<float> out(map_.total_numel);
  HostBuffer p(map_.padded_numel, o_.wdtype);
  download_params(p);
  convert(p.data(), o_.wdtype, out.data(), DType::F32, map_.total_numel);
  return out;
}

void DeviceParamStore::views_bound() {
  if (!grad_pages_) return;
  synchronize();  // the zeroing memsets of the constructor are done with those chunks
  grad_pages_->release(0, keep_lo_);
  grad_pages_->release(keep_hi_, grad_pages_->mapped_bytes());
}

void DeviceParamStore::zero_grads() {
  if (grad_pages_) {
    // ZeRO-2: only the slice's chunks are mapped here normally (end_backward released every
    // other chunk as its bucket finished). Should any other be mapped, it goes as on the host
    // store -- after a synchronisation, so that no queued kernel still uses it (only after a
    // failed backward: a complete one leaves no other chunk mapped).
    if (grad_pages_->resident_bytes() > grad_pages_->resident_bytes(keep_lo_, keep_hi_)) {
      synchronize();
      grad_pages_->release(0, keep_lo_);
      grad_pages_->release(keep_hi_, grad_pages_->mapped_bytes());
    }
    grad_pages_->touch(keep_lo_, keep_hi_);  // zeros on the stream, behind the optimizer
    return;
  }
  DS_CUDA_CHECK(cudaMemsetAsync(d_grads_, 0, n_ * dtype_size(o_.wdtype), as_stream(stream_)));
}

precision::GradStats DeviceParamStore::grad_stats() {
  const std::size_t offset = step_offset(), count = step_count();
  return device_grad_stats(count > 0 ? grads(offset, count) : TensorView{}, d_sumsq_, d_found_inf_, h_stats_,
                           as_stream(stream_));
}

void DeviceParamStore::optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) {
  const std::size_t off = step_offset(), n = step_count();
  if (n == 0) return;
  ctx.stream = stream_;
  opt.step(std::span<float>(d_master_, n), grads(off, n), params(off, n), segments_, ctx);
}

bool DeviceParamStore::async_step() const { return !o_.offload_optimizer; }

void DeviceParamStore::launch_step(optim::Optimizer& opt, optim::StepContext ctx, const precision::StepInputs& in,
                                   Communicator* stats_comm, Communicator* gather_comm) {
  const std::size_t off = step_offset(), n = step_count();
  const optim::cuda::DeviceStepControl ctl =
      async_->decide(n > 0 ? grads(off, n) : TensorView{}, d_sumsq_, d_found_inf_, in, stats_comm);
  if (n > 0) {
    ctx.stream = stream_;
    ctx.grad_scale = 1.0;  // the kernels multiply by exactly *ctl.d_grad_scale
    ctx.device_control = &ctl;  // read during opt.step
    opt.step(std::span<float>(d_master_, n), grads(off, n), params(off, n), segments_, ctx);
  }
  if (gather_comm) {
    // As gather_params, but not blocking: NCCL's blocking gather would make the host wait for
    // its stream, i.e. for this whole step.
    const std::size_t S = map_.partition_numel, W = std::size_t(map_.world_size);
    async_->keep(gather_comm->iall_gather(params(slice_.offset, S), TensorView{d_params_, S * W, o_.wdtype}));
  }
  async_->record();
}

precision::StepDecision DeviceParamStore::finish_step() { return async_->wait(); }

void DeviceParamStore::gather_params(Communicator& comm) {
  // NCCL gathers the whole partition in place (send is block `rank` of the receive buffer).
  const std::size_t S = map_.partition_numel, W = std::size_t(map_.world_size);
  comm.all_gather(params(slice_.offset, S), TensorView{d_params_, S * W, o_.wdtype});
}

void DeviceParamStore::add_memory(ModelStateBytes& b) const {
  b.params = params_.bytes();
  // On the device, as params and master. ZeRO-2: the slice's chunks, mapped for good (the
  // engine adds the most seen beyond them during a backward as grad_buckets).
  b.grads = grad_pages_ ? grad_pages_->resident_bytes(keep_lo_, keep_hi_) : n_ * dtype_size(o_.wdtype);
  b.master = master_.bytes();
}

void DeviceParamStore::synchronize() const {
  note_device_stream_sync();
  DS_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

#else  // built without CUDA

class DeviceAsyncStep {};
std::uint64_t device_stream_syncs() { return 0; }

DeviceParamStore::DeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o, void*)
    : ParamStore(map, rank, o) {
  DS_THROW("the module runs on a CUDA device but dstrain was built without CUDA (DS_WITH_CUDA): "
           "rebuild with the CUDA toolkit, or train on the CPU");
}
DeviceParamStore::~DeviceParamStore() = default;
void DeviceParamStore::release() {}
TensorView DeviceParamStore::params(std::size_t, std::size_t) const { return {}; }
TensorView DeviceParamStore::grads(std::size_t, std::size_t) const { return {}; }
void DeviceParamStore::upload() {}
void DeviceParamStore::to_host(optim::Optimizer&) {}
void DeviceParamStore::from_host(optim::Optimizer&, bool) {}
void DeviceParamStore::download_params(HostBuffer&) const {}
std::vector<float> DeviceParamStore::params_fp32() const { return {}; }
void DeviceParamStore::zero_grads() {}
void DeviceParamStore::views_bound() {}
precision::GradStats DeviceParamStore::grad_stats() { return {}; }
void DeviceParamStore::optimizer_step(optim::Optimizer&, optim::StepContext) {}
bool DeviceParamStore::async_step() const { return false; }
void DeviceParamStore::launch_step(optim::Optimizer&, optim::StepContext, const precision::StepInputs&, Communicator*,
                                   Communicator*) {}
precision::StepDecision DeviceParamStore::finish_step() { return {}; }
void DeviceParamStore::gather_params(Communicator&) {}
void DeviceParamStore::add_memory(ModelStateBytes&) const {}
void DeviceParamStore::synchronize() const {}

#endif

}  // namespace ds::engine
