// ZeRO-Offload on the GPU path: HostOffloadStep (host side, any build) and
// OffloadDeviceParamStore (CUDA builds). docs/dev/gpu.md "The offloaded step".
#include "device_offload_store.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ds/core/error.h"

#if DS_PRECISION_HAVE_CUDA
#include <cuda_runtime.h>

#include "device_grad_stats.h"
#include "ds/core/cuda_check.h"
#endif

namespace ds::engine {

// ---- HostOffloadStep ----

HostOffloadStep::HostOffloadStep(std::size_t n, std::size_t sub_group)
    : n_(n), sub_(sub_group == 0 || sub_group > n ? std::max<std::size_t>(n, 1) : sub_group),
      pieces_(n == 0 ? 0 : (n + sub_ - 1) / sub_) {}

std::pair<std::size_t, std::size_t> HostOffloadStep::piece(std::size_t i) const {
  const std::size_t b = i * sub_;
  return {b, std::min(sub_, n_ - b)};
}

namespace {
// Optimizers whose update of an element reads only that element (Optimizer::step_piece):
// all but Lamb, whose trust ratio needs whole tensors.
bool elementwise(const optim::Optimizer& opt) { return opt.name() != "lamb"; }

TensorView sub(const TensorView& v, std::size_t begin, std::size_t count) {
  return TensorView{static_cast<char*>(v.data) + begin * dtype_size(v.dtype), count, v.dtype};
}
}  // namespace

void HostOffloadStep::step(optim::Optimizer& opt, std::span<float> master, TensorView grads, TensorView staging,
                           std::span<const optim::Segment> segments, const optim::StepContext& ctx,
                           OffloadCopier& copier) const {
  DS_CHECK(master.size() == n_ && grads.count == n_ && staging.count == n_,
           "HostOffloadStep: master " << master.size() << ", gradient copy " << grads.count << " and staging "
                                      << staging.count << " elements, expected " << n_ << " each");
  if (n_ == 0) return;
  copier.wait_params();  // the previous step's copies back may still read the staging buffer
  for (std::size_t i = 0; i < pieces_; ++i) {
    const auto [b, c] = piece(i);
    copier.grads_to_host(i, b, c);
  }
  if (!elementwise(opt)) {
    for (std::size_t i = 0; i < pieces_; ++i) copier.wait_grads(i);
    opt.step(master, grads, staging, segments, ctx);
    for (std::size_t i = 0; i < pieces_; ++i) {
      const auto [b, c] = piece(i);
      copier.params_to_device(i, b, c);
    }
    return;
  }
  // The optimizer's own state arrays (init_state(n)), stepped a sub-group at a time.
  auto state = opt.state_tensors();
  std::vector<float*> ptr(state.size());
  for (const auto& [name, span] : state)
    DS_CHECK(span.size() == n_, "HostOffloadStep: optimizer state " << name << " holds " << span.size()
                                                                    << " elements, expected " << n_);
  for (std::size_t i = 0; i < pieces_; ++i) {
    const auto [b, c] = piece(i);
    copier.wait_grads(i);
    for (std::size_t k = 0; k < state.size(); ++k) ptr[k] = state[k].second.data() + b;
    opt.step_piece(master.subspan(b, c), sub(grads, b, c), sub(staging, b, c), ptr, ctx);
    copier.params_to_device(i, b, c);
  }
}

bool covered_by(std::span<const EarlyCopy> ranges, std::size_t lo, std::size_t hi) {
  std::size_t covered = 0;
  for (const EarlyCopy& r : ranges) {
    const std::size_t a = std::max(lo, r.lo), b = std::min(hi, r.hi);
    if (a < b) covered += b - a;
  }
  return covered >= hi - lo;
}

namespace {
std::size_t piece_elems(const StoreOptions& o) {
  if (o.sub_group == 0) return 0;
  return std::max(o.sub_group, OffloadDeviceParamStore::kMinPieceBytes / dtype_size(o.wdtype));
}
}  // namespace

std::unique_ptr<ParamStore> make_offload_device_store(const PartitionMap& map, int rank, const StoreOptions& o,
                                                      void* stream) {
  return std::make_unique<OffloadDeviceParamStore>(map, rank, o, stream);
}

#if DS_PRECISION_HAVE_CUDA

namespace {

// The copies on the module's stream: after backward (the gradients are final there) and
// before the next forward (which reads the params copied back). One event per sub-group
// says when its gradients are on the host; one event after the last copy back. A sub-group
// whose gradients the early copies (OffloadDeviceParamStore::grads_reducing) cover is not
// copied again: waiting for it waits for those copies' events.
class StreamCopier final : public OffloadCopier {
 public:
  StreamCopier(void* stream, const void* d_grads, void* d_params, void* h_grads, const void* h_staging, DType t,
               std::size_t pieces, const std::vector<EarlyCopy>* early)
      : s_(as_stream(stream)), d_grads_(static_cast<const char*>(d_grads)), d_params_(static_cast<char*>(d_params)),
        h_grads_(static_cast<char*>(h_grads)), h_staging_(static_cast<const char*>(h_staging)), es_(dtype_size(t)),
        grads_done_(pieces, nullptr), early_(early), range_(pieces) {
    try {
      for (auto& e : grads_done_) DS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      DS_CUDA_CHECK(cudaEventCreateWithFlags(&params_done_, cudaEventDisableTiming));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~StreamCopier() override { destroy(); }
  void grads_to_host(std::size_t piece, std::size_t begin, std::size_t count) override {
    range_[piece] = {begin, count};
    if (covered_by(*early_, begin, begin + count)) return;  // on its way already
    DS_CUDA_CHECK(cudaMemcpyAsync(h_grads_ + begin * es_, d_grads_ + begin * es_, count * es_,
                                  cudaMemcpyDeviceToHost, s_));
    DS_CUDA_CHECK(cudaEventRecord(grads_done_[piece], s_));
    range_[piece].second = 0;  // copied here: wait for grads_done_
  }
  void wait_grads(std::size_t piece) override {
    const auto [begin, count] = range_[piece];
    if (count == 0) {
      DS_CUDA_CHECK(cudaEventSynchronize(grads_done_[piece]));
      return;
    }
    for (const EarlyCopy& e : *early_)
      if (e.lo < begin + count && begin < e.hi) DS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e.event)));
  }
  void params_to_device(std::size_t, std::size_t begin, std::size_t count) override {
    DS_CUDA_CHECK(cudaMemcpyAsync(d_params_ + begin * es_, h_staging_ + begin * es_, count * es_,
                                  cudaMemcpyHostToDevice, s_));
    DS_CUDA_CHECK(cudaEventRecord(params_done_, s_));
    params_pending_ = true;
  }
  void wait_params() override {
    if (params_pending_) DS_CUDA_CHECK(cudaEventSynchronize(params_done_));
    params_pending_ = false;
  }

 private:
  void destroy() {  // no checks: also runs while an exception unwinds
    for (auto& e : grads_done_)
      if (e) cudaEventDestroy(e);
    if (params_done_) cudaEventDestroy(params_done_);
    grads_done_.clear();
    params_done_ = nullptr;
  }
  cudaStream_t s_;
  const char* d_grads_;
  char* d_params_;
  char* h_grads_;
  const char* h_staging_;
  std::size_t es_;
  std::vector<cudaEvent_t> grads_done_;
  cudaEvent_t params_done_ = nullptr;
  bool params_pending_ = false;
  const std::vector<EarlyCopy>* early_;  // the store's
  std::vector<std::pair<std::size_t, std::size_t>> range_;  // per piece: its range if covered early, else count 0
};

}  // namespace

OffloadDeviceParamStore::OffloadDeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o,
                                                 void* stream)
    : DeviceParamStore(map, rank, o, stream), plan_(step_count(), piece_elems(o)) {
  const std::size_t n = step_count(), bytes = std::max<std::size_t>(n, 1) * dtype_size(o_.wdtype);
  try {
    if (o_.pin_memory) {
      pinned_ = true;
      for (void** p : {&h_grads_, &h_staging_}) {
        const cudaError_t rc = cudaMallocHost(p, bytes);
        if (rc != cudaSuccess) {
          cudaGetLastError();
          *p = nullptr;
        }
        DS_CHECK(rc == cudaSuccess, "zero_optimization.offload_optimizer.pin_memory: pinning "
                                        << bytes << " bytes of host memory failed (" << cudaGetErrorString(rc)
                                        << "); set pin_memory to false");
      }
    } else {
      pageable_grads_ = HostBuffer(bytes);
      pageable_staging_ = HostBuffer(bytes);
      h_grads_ = pageable_grads_.data();
      h_staging_ = pageable_staging_.data();
    }
    copier_ = std::make_unique<StreamCopier>(stream_, grads(step_offset(), n).data, params(step_offset(), n).data,
                                             h_grads_, h_staging_, o_.wdtype, plan_.pieces(), &early_);
    cudaStream_t cs = nullptr;
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    copy_stream_ = cs;
  } catch (...) {
    release_host();
    throw;
  }
}

OffloadDeviceParamStore::~OffloadDeviceParamStore() { release_host(); }

void OffloadDeviceParamStore::release_host() {
  // No checks: also runs while an exception unwinds. Copies in flight read these buffers.
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  if (copy_stream_) cudaStreamSynchronize(as_stream(copy_stream_));
  for (EarlyCopy& e : early_) cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
  early_.clear();
  if (copy_stream_) cudaStreamDestroy(as_stream(copy_stream_));
  copy_stream_ = nullptr;
  copier_.reset();
  if (pinned_) {
    if (h_grads_) cudaFreeHost(h_grads_);
    if (h_staging_) cudaFreeHost(h_staging_);
  }
  h_grads_ = h_staging_ = nullptr;
  pinned_ = false;
}

void OffloadDeviceParamStore::upload() {
  DeviceParamStore::upload();  // synchronises: no copy back reads the staging buffer now
  const std::size_t es = dtype_size(o_.wdtype);
  std::memcpy(h_staging_, static_cast<const char*>(params_.data()) + step_offset() * es, step_count() * es);
}

void OffloadDeviceParamStore::optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) {
  const std::size_t n = step_count();
  if (n == 0) return;
  ctx.stream = nullptr;  // the CPU kernels
  plan_.step(opt, std::span<float>(master_.as<float>(), n), TensorView{h_grads_, n, o_.wdtype},
             TensorView{h_staging_, n, o_.wdtype}, segments_, ctx, *copier_);
  drop_early();
}

void OffloadDeviceParamStore::grads_reducing(std::size_t begin, std::size_t count, CommHandle& work) {
  const std::size_t off = step_offset(), n = step_count(), es = dtype_size(o_.wdtype);
  const std::size_t lo = std::max(begin, off), hi = std::min(begin + count, off + n);
  // Pageable host memory makes a device-to-host copy block the host until it is done, which
  // would stall backward behind the reduction: then the step copies after backward instead.
  if (lo >= hi || !pinned_) return;
  cudaStream_t cs = as_stream(copy_stream_);
  work.order_stream(cs);  // behind the reduction, on the device (NCCL) or at once
  cudaEvent_t ev = nullptr;
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  early_.push_back({lo - off, hi - off, ev});
  DS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(h_grads_) + (lo - off) * es, grads(lo, hi - lo).data, (hi - lo) * es,
                                cudaMemcpyDeviceToHost, cs));
  DS_CUDA_CHECK(cudaEventRecord(ev, cs));
}

void OffloadDeviceParamStore::drop_early() {
  // The module's stream (the next zeroing of the gradients) waits for every early copy.
  for (EarlyCopy& e : early_) {
    auto ev = static_cast<cudaEvent_t>(e.event);
    DS_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), ev, 0));
    DS_CUDA_CHECK(cudaEventDestroy(ev));
  }
  early_.clear();
}

void OffloadDeviceParamStore::zero_grads() {
  drop_early();  // a skipped step never waited for them
  DeviceParamStore::zero_grads();
}

void OffloadDeviceParamStore::add_memory(ModelStateBytes& b) const {
  DeviceParamStore::add_memory(b);  // params and grads on the device; master_ is host memory here
  b.optimizer_offloaded = true;
  b.comm_scratch += 2 * step_count() * dtype_size(o_.wdtype);  // host gradient copy + staging
}

#else  // built without CUDA: DeviceParamStore's constructor throws saying so

OffloadDeviceParamStore::OffloadDeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o,
                                                 void* stream)
    : DeviceParamStore(map, rank, o, stream), plan_(step_count(), piece_elems(o)) {}
OffloadDeviceParamStore::~OffloadDeviceParamStore() = default;
void OffloadDeviceParamStore::release_host() {}
void OffloadDeviceParamStore::upload() {}
void OffloadDeviceParamStore::optimizer_step(optim::Optimizer&, optim::StepContext) {}
void OffloadDeviceParamStore::add_memory(ModelStateBytes&) const {}
void OffloadDeviceParamStore::grads_reducing(std::size_t, std::size_t, CommHandle&) {}
void OffloadDeviceParamStore::zero_grads() {}
void OffloadDeviceParamStore::drop_early() {}

#endif

}  // namespace ds::engine
