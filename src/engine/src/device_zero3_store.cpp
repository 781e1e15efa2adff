// DevicePartitionedParamStore: ZeRO stage 3 on a CUDA device (device_zero3_store.h).
#include "device_zero3_store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "zero3_space.h"

#if DS_PRECISION_HAVE_CUDA
#include <cuda_runtime.h>

#include "deferred_release.h"
#include "device_fold.h"
#include "device_grad_stats.h"
#include "device_step.h"
#include "ds/core/cuda_check.h"
#include "ds/precision/cuda_kernels.h"
#endif

namespace ds::engine {

#if DS_PRECISION_HAVE_CUDA

namespace {

// CUDA events recorded on one stream, under ReleaseEvents' names. Dropped events are kept for
// reuse: a release is queued per group use, so creating one each time would be wasteful.
class StreamEvents final : public ReleaseEvents {
 public:
  explicit StreamEvents(void* stream) : stream_(stream) {}
  ~StreamEvents() override {
    for (auto& [id, e] : live_) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }
  std::uint64_t record() override {
    cudaEvent_t e = nullptr;
    if (spare_.empty()) {
      DS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = spare_.back();
      spare_.pop_back();
    }
    const cudaError_t rc = cudaEventRecord(e, as_stream(stream_));
    if (rc != cudaSuccess) spare_.push_back(e);
    DS_CUDA_CHECK(rc);
    live_.emplace(++last_, e);
    return last_;
  }
  bool done(std::uint64_t id) override {
    const cudaError_t rc = cudaEventQuery(event(id));
    if (rc == cudaErrorNotReady) return false;
    DS_CUDA_CHECK(rc);
    return true;
  }
  void wait(std::uint64_t id) override { DS_CUDA_CHECK(cudaEventSynchronize(event(id))); }
  void drop(std::uint64_t id) noexcept override {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    try {
      spare_.push_back(it->second);
    } catch (...) {
      cudaEventDestroy(it->second);
    }
    live_.erase(it);
  }

 private:
  cudaEvent_t event(std::uint64_t id) const {
    auto it = live_.find(id);
    DS_CHECK(it != live_.end(), "stage 3 on the device: release event " << id << " is unknown");
    return it->second;
  }
  void* stream_;
  std::uint64_t last_ = 0;
  std::unordered_map<std::uint64_t, cudaEvent_t> live_;
  std::vector<cudaEvent_t> spare_;
};

class DevicePartitionedParamStore final : public Zero3Store {
 public:
  DevicePartitionedParamStore(const PartitionMap& map, int rank, const StoreOptions& o, void* stream);
  ~DevicePartitionedParamStore() override { free_all(); }

  TensorView params(std::size_t offset, std::size_t count) const override {
    return TensorView{static_cast<char*>(flat_params_->data()) + offset * es_, count, o_.wdtype};
  }
  TensorView grads(std::size_t offset, std::size_t count) const override {
    return TensorView{static_cast<char*>(flat_grads_->data()) + offset * es_, count, o_.wdtype};
  }
  void set_initial(const float* full) override {
    for (std::size_t g = 0; g < map_.groups.size(); ++g) set_initial_group(g, full + map_.groups[g].offset);
  }
  void set_initial_group(std::size_t g, const float* group_values) override;
  void views_bound() override;
  precision::GradStats grad_stats() override;
  void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) override;
  bool async_step() const override { return true; }
  void launch_step(optim::Optimizer& opt, optim::StepContext ctx, const precision::StepInputs& in,
                   Communicator* stats_comm, Communicator* gather_comm) override;
  precision::StepDecision finish_step() override;
  void gather_params(Communicator&) override {}  // the fetcher gathers groups on use
  void zero_grads() override;
  void to_host(optim::Optimizer& opt) override;
  void from_host(optim::Optimizer& opt, bool with_optimizer_state) override;
  std::vector<float> params_fp32() const override;
  void add_memory(ModelStateBytes& b) const override;
  void* stream() const override { return stream_; }

  // Zero3Store.
  void read_part_params(std::size_t g, void* dst) const override;
  TensorView part_params(std::size_t g) const override {
    const FlatGroup& fg = map_.groups[g];
    return TensorView{static_cast<char*>(d_part_params_) + fg.part_offset * es_, fg.piece, o_.wdtype};
  }
  void params_needed(std::size_t g) override;
  void release_params(std::size_t g) override {
    const auto [lo, hi] = group_range(g);
    param_releases_->defer(g, lo, hi);
  }
  void grads_needed(std::size_t g) override;
  void release_grads(std::size_t g) override {
    const auto [lo, hi] = group_range(g);
    grad_releases_->defer(g, lo, hi);
  }
  void fold(std::size_t g, TensorView reduced) override {
    cuda::add_into_f32(d_part_grads_ + map_.groups[g].part_offset, reduced, stream_);
  }
  bool orders_on_device() const override { return true; }
  void order_after(CommHandle& work) override { work.order_stream(stream_); }
  void set_live_limit(std::size_t elements) override {
    live_limit_ = elements > std::numeric_limits<std::size_t>::max() / es_ ? std::numeric_limits<std::size_t>::max()
                                                                            : elements * es_;
  }
  void* reduce_scratch(std::size_t bytes) override;

 private:
  // Byte range of group g's chunks in either flat space: from its start (2 MiB-aligned,
  // partition.cpp) to the next chunk boundary after its end. The chunk divides 2 MiB
  // (checked), so no chunk holds two groups.
  std::pair<std::size_t, std::size_t> group_range(std::size_t g) const {
    const FlatGroup& fg = map_.groups[g];
    const std::size_t c = flat_params_->chunk_bytes();
    const std::size_t hi = ((fg.offset + fg.padded) * es_ + c - 1) / c * c;
    return {fg.offset * es_, std::min(hi, flat_params_->mapped_bytes())};
  }
  void synchronize() const {
    note_device_stream_sync();
    DS_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  }
  void free_all() noexcept;

  void* stream_ = nullptr;
  std::size_t P_ = 0, es_ = 0;
  std::unique_ptr<DevicePagedBuffer> flat_params_, flat_grads_;
  std::unique_ptr<StreamEvents> events_;
  std::unique_ptr<DeferredReleases> param_releases_, grad_releases_;
  std::size_t live_limit_ = std::numeric_limits<std::size_t>::max();  // bytes of flat parameters mapped
  void* d_part_params_ = nullptr;  // P_ x wdtype
  float* d_part_grads_ = nullptr;  // P_ x F32
  float* d_master_ = nullptr;      // P_ x F32
  void* d_scratch_ = nullptr;      // the fetcher's reduce-scatter slots
  std::size_t scratch_bytes_ = 0;
  double* d_sumsq_ = nullptr;
  int* d_found_inf_ = nullptr;
  void* h_stats_ = nullptr;  // pinned DeviceStatsHost
  std::unique_ptr<DeviceAsyncStep> async_;  // the asynchronous boundary step's scalars
};

DevicePartitionedParamStore::DevicePartitionedParamStore(const PartitionMap& map, int rank, const StoreOptions& o,
                                                         void* stream)
    : Zero3Store(map, rank, o), stream_(stream), P_(map.partition_numel), es_(dtype_size(o.wdtype)) {
  DS_CHECK(map_.stage == 3, "DevicePartitionedParamStore needs a stage-3 partition map");
  DS_CHECK(!o_.nvme.any() && !o_.offload_optimizer,
           "stage 3 on a CUDA device keeps every model state in device memory: offload is refused there");
  DS_CHECK(master_.bytes() >= P_ * sizeof(float), "stage 3 on the device: the master staging copy is too small");
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) cudaGetLastError();
  DS_CHECK(rc == cudaSuccess && count > 0, "the module runs on a CUDA device but no CUDA device is visible ("
                                               << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices")
                                               << "): train it on the CPU, or where a GPU is visible");
  try {
    const std::size_t flat_bytes = std::max<std::size_t>(map_.padded_numel, 1) * es_;
    flat_params_ = std::make_unique<DevicePagedBuffer>(flat_bytes, stream_);
    flat_grads_ = std::make_unique<DevicePagedBuffer>(flat_bytes, stream_);
    const std::size_t chunk = flat_params_->chunk_bytes();
    DS_CHECK(PagedBuffer::kHugePage % chunk == 0,
             "stage 3 on the device: the device's allocation granularity (" << chunk << " bytes) does not divide the "
             "2 MiB the parameter groups are aligned to, so a chunk could hold two groups");
    events_ = std::make_unique<StreamEvents>(stream_);
    param_releases_ = std::make_unique<DeferredReleases>(
        *events_, [this](std::size_t b, std::size_t e) { flat_params_->release(b, e); });
    grad_releases_ = std::make_unique<DeferredReleases>(
        *events_, [this](std::size_t b, std::size_t e) { flat_grads_->release(b, e); });
    const std::size_t p = std::max<std::size_t>(P_, 1);
    DS_CUDA_CHECK(cudaMalloc(&d_part_params_, p * es_));
    DS_CUDA_CHECK(cudaMalloc(&d_part_grads_, p * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_master_, p * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_sumsq_, sizeof(double)));
    DS_CUDA_CHECK(cudaMalloc(&d_found_inf_, sizeof(int)));
    DS_CUDA_CHECK(cudaMallocHost(&h_stats_, sizeof(DeviceStatsHost)));
    async_ = std::make_unique<DeviceAsyncStep>(stream_);
    cudaStream_t s = as_stream(stream_);
    DS_CUDA_CHECK(cudaMemsetAsync(d_part_params_, 0, p * es_, s));
    DS_CUDA_CHECK(cudaMemsetAsync(d_part_grads_, 0, p * sizeof(float), s));
    DS_CUDA_CHECK(cudaMemsetAsync(d_master_, 0, p * sizeof(float), s));
    // Until views_bound(): the chunk of each parameter's first element in both spaces, so that
    // the module's bind() finds device memory where it asks (cudaPointerGetAttributes).
    for (const auto& fp : map_.params) {
      if (fp.numel == 0) continue;
      const std::size_t b = fp.offset * es_ / chunk * chunk, e = std::min(b + chunk, flat_params_->mapped_bytes());
      flat_params_->populate(b, e);
      flat_grads_->populate(b, e);
    }
  } catch (...) {
    free_all();
    throw;
  }
}

void DevicePartitionedParamStore::free_all() noexcept {
  // No checks: also runs while an exception unwinds. The queues first (they use the events
  // and unmap through the buffers), then the events, then the memory.
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  param_releases_.reset();
  grad_releases_.reset();
  events_.reset();
  flat_params_.reset();  // synchronises, unmaps, frees the range
  flat_grads_.reset();
  cudaFree(d_part_params_);
  cudaFree(d_part_grads_);
  cudaFree(d_master_);
  cudaFree(d_scratch_);
  cudaFree(d_sumsq_);
  cudaFree(d_found_inf_);
  cudaFreeHost(h_stats_);
  async_.reset();
  d_part_params_ = d_scratch_ = h_stats_ = nullptr;
  d_part_grads_ = d_master_ = nullptr;
  d_sumsq_ = nullptr;
  d_found_inf_ = nullptr;
}

void DevicePartitionedParamStore::set_initial_group(std::size_t g, const float* values) {
  const FlatGroup& fg = map_.groups[g];
  const float* mine = values + std::size_t(rank_) * fg.piece;
  float* staged = master_.as<float>() + fg.part_offset;  // the host staging copy (checkpoints)
  std::memcpy(staged, mine, fg.piece * sizeof(float));
  std::vector<char> w(fg.piece * es_);
  convert(mine, DType::F32, w.data(), o_.wdtype, fg.piece);
  cudaStream_t s = as_stream(stream_);
  DS_CUDA_CHECK(cudaMemcpyAsync(d_master_ + fg.part_offset, staged, fg.piece * sizeof(float), cudaMemcpyHostToDevice, s));
  DS_CUDA_CHECK(cudaMemcpyAsync(part_params(g).data, w.data(), w.size(), cudaMemcpyHostToDevice, s));
  synchronize();  // `w` goes out of scope
}

void DevicePartitionedParamStore::views_bound() {
  // The module has checked its views: nothing is in use until the fetcher gathers a group.
  synchronize();
  flat_params_->release(0, flat_params_->mapped_bytes());
  flat_grads_->release(0, flat_grads_->mapped_bytes());
}

void DevicePartitionedParamStore::read_part_params(std::size_t g, void* dst) const {
  const TensorView src = part_params(g);
  const auto d = reinterpret_cast<std::uintptr_t>(dst), flat = reinterpret_cast<std::uintptr_t>(flat_params_->data());
  if (d >= flat && d - flat < flat_params_->mapped_bytes()) {
    // One rank's gather: into the flat space on the compute stream, which the module's
    // kernels follow; no host wait.
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToDevice, as_stream(stream_)));
    return;
  }
  // Anywhere else (an export's host buffer): complete when the call returns.
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDefault, as_stream(stream_)));
  synchronize();
}

void DevicePartitionedParamStore::params_needed(std::size_t g) {
  // Releases whose kernels have run go now (a query, no wait).
  param_releases_->poll();
  grad_releases_->poll();
  const auto [lo, hi] = group_range(g);
  // Used again while its release was queued: its chunks stay mapped (the gather overwrites
  // them, behind the kernels that read them before: the gather starts behind the compute
  // stream).
  if (!param_releases_->cancel(g)) {
    // stage3_max_live_parameters bounds the mapped flat parameters, queued releases included:
    // wait for the oldest queued ones until this group fits.
    const std::size_t need = (hi - lo) - flat_params_->resident_bytes(lo, hi);
    const std::size_t mapped = flat_params_->resident_bytes(), queued = param_releases_->queued_bytes();
    if (queued > 0 && mapped + need > live_limit_) {
      const std::size_t in_use = mapped - std::min(mapped, queued);
      param_releases_->make_room(live_limit_ > in_use + need ? live_limit_ - in_use - need : 0);
    }
  }
  // Newly mapped chunks are zeroed on the stream (DevicePagedBuffer::populate); the all-gather
  // starts behind that (the communicator waits for the compute stream) and writes them whole.
  flat_params_->populate(lo, hi);
}

void DevicePartitionedParamStore::grads_needed(std::size_t g) {
  const auto [lo, hi] = group_range(g);
  // Still mapped from an earlier micro-step, its release queued: those chunks hold that
  // step's gradients, which must read zero now, as a freshly mapped chunk does.
  if (grad_releases_->cancel(g))
    DS_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(flat_grads_->data()) + lo, 0, hi - lo, as_stream(stream_)));
  flat_grads_->populate(lo, hi);
}

void* DevicePartitionedParamStore::reduce_scratch(std::size_t bytes) {
  if (scratch_bytes_ >= bytes) return d_scratch_;
  synchronize();  // nothing queued may still use the old slots
  cudaFree(d_scratch_);
  d_scratch_ = nullptr;
  scratch_bytes_ = 0;
  DS_CUDA_CHECK(cudaMalloc(&d_scratch_, std::max<std::size_t>(bytes, 1)));
  scratch_bytes_ = bytes;
  return d_scratch_;
}

precision::GradStats DevicePartitionedParamStore::grad_stats() {
  const precision::GradStats st = device_grad_stats(TensorView{d_part_grads_, P_, DType::F32}, d_sumsq_,
                                                    d_found_inf_, h_stats_, as_stream(stream_));
  // The stream is idle: every queued release's event has completed, so they all go now.
  param_releases_->poll();
  grad_releases_->poll();
  return st;
}

void DevicePartitionedParamStore::optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) {
  if (P_ == 0) return;
  ctx.stream = stream_;
  // Padding elements have zero gradient and zero master, so every optimizer leaves them zero.
  opt.step(std::span<float>(d_master_, P_), TensorView{d_part_grads_, P_, DType::F32},
           TensorView{d_part_params_, P_, o_.wdtype}, segments_, ctx);
}

void DevicePartitionedParamStore::launch_step(optim::Optimizer& opt, optim::StepContext ctx,
                                              const precision::StepInputs& in, Communicator* stats_comm,
                                              Communicator* /*gather_comm*/) {  // the fetcher gathers on use
  const optim::cuda::DeviceStepControl ctl =
      async_->decide(TensorView{d_part_grads_, P_, DType::F32}, d_sumsq_, d_found_inf_, in, stats_comm);
  if (P_ > 0) {
    ctx.stream = stream_;
    ctx.grad_scale = 1.0;  // the kernels multiply by exactly *ctl.d_grad_scale
    ctx.device_control = &ctl;  // read during opt.step
    opt.step(std::span<float>(d_master_, P_), TensorView{d_part_grads_, P_, DType::F32},
             TensorView{d_part_params_, P_, o_.wdtype}, segments_, ctx);
  }
  async_->record();
}

precision::StepDecision DevicePartitionedParamStore::finish_step() {
  const precision::StepDecision d = async_->wait();
  // The stream ran past the step: the releases queued before it can all go (without waiting).
  param_releases_->poll();
  grad_releases_->poll();
  return d;
}

void DevicePartitionedParamStore::zero_grads() {
  // Normally every group's flat gradients were released as their reduce-scatter finished:
  // mapped are only ranges whose release is queued behind the stream, which go when it passes
  // them (no wait here: the asynchronous step does not synchronise). Chunks mapped beyond those
  // (a failed backward) go after the stream ran past their users.
  grad_releases_->poll();
  if (flat_grads_->resident_bytes() > grad_releases_->queued_bytes()) {
    grad_releases_->flush();
    synchronize();
    flat_grads_->release(0, flat_grads_->mapped_bytes());
  }
  DS_CUDA_CHECK(cudaMemsetAsync(d_part_grads_, 0, std::max<std::size_t>(P_, 1) * sizeof(float), as_stream(stream_)));
}

void DevicePartitionedParamStore::to_host(optim::Optimizer& opt) {
  DS_CUDA_CHECK(cudaMemcpyAsync(master_.data(), d_master_, P_ * sizeof(float), cudaMemcpyDeviceToHost,
                                as_stream(stream_)));
  synchronize();
  opt.download_state();
}

void DevicePartitionedParamStore::from_host(optim::Optimizer& opt, bool with_optimizer_state) {
  // A checkpoint load filled the host master: the device master and the working pieces (the
  // master rounded) follow it.
  cudaStream_t s = as_stream(stream_);
  DS_CUDA_CHECK(cudaMemcpyAsync(d_master_, master_.data(), P_ * sizeof(float), cudaMemcpyHostToDevice, s));
  if (P_ > 0) precision::cuda::cast_from_f32(d_master_, TensorView{d_part_params_, P_, o_.wdtype}, s);
  synchronize();
  if (with_optimizer_state) opt.upload_state();
}

std::vector<float> DevicePartitionedParamStore::params_fp32() const {
  const std::size_t W = std::size_t(map_.world_size);
  HostBuffer all(P_ * W, o_.wdtype);
  if (W > 1) {
    DS_CHECK(comm_ != nullptr, "stage 3: gathering the parameters needs the communicator");
    void* d_all = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&d_all, std::max<std::size_t>(P_ * W, 1) * es_));
    try {
      comm_->all_gather(TensorView{d_part_params_, P_, o_.wdtype}, TensorView{d_all, P_ * W, o_.wdtype});
      DS_CUDA_CHECK(cudaMemcpyAsync(all.data(), d_all, P_ * W * es_, cudaMemcpyDeviceToHost, as_stream(stream_)));
      synchronize();
    } catch (...) {
      cudaFree(d_all);
      throw;
    }
    DS_CUDA_CHECK(cudaFree(d_all));
  } else {
    DS_CUDA_CHECK(cudaMemcpyAsync(all.data(), d_part_params_, P_ * es_, cudaMemcpyDeviceToHost, as_stream(stream_)));
    synchronize();
  }
  std::vector<float> all32(P_ * W), out(map_.total_numel);
  convert(all.data(), o_.wdtype, all32.data(), DType::F32, P_ * W);
  for (const FlatGroup& g : map_.groups)
    for (std::size_t r = 0; r < W; ++r) {
      const std::size_t n = g.piece_real(int(r));
      if (n > 0)
        std::memcpy(out.data() + g.dense_offset + r * g.piece, all32.data() + r * P_ + g.part_offset, n * sizeof(float));
    }
  return out;
}

void DevicePartitionedParamStore::add_memory(ModelStateBytes& b) const {
  // The pieces, plus the flat spaces' chunks mapped now (groups gathered or being written,
  // and releases still queued behind the stream).
  b.params = P_ * es_ + flat_params_->resident_bytes();
  b.grads = P_ * sizeof(float) + flat_grads_->resident_bytes();
  b.master = P_ * sizeof(float);
}

}  // namespace

std::unique_ptr<ParamStore> make_device_zero3_store(const PartitionMap& map, int rank, const StoreOptions& o,
                                                    void* stream) {
  return std::make_unique<DevicePartitionedParamStore>(map, rank, o, stream);
}

#else  // built without CUDA

std::unique_ptr<ParamStore> make_device_zero3_store(const PartitionMap&, int, const StoreOptions&, void*) {
  DS_THROW("the module runs on a CUDA device but dstrain was built without CUDA (DS_WITH_CUDA): "
           "rebuild with the CUDA toolkit, or train on the CPU");
}

#endif

}  // namespace ds::engine
