// The device stores' boundary step without a host synchronisation (docs/dev/gpu.md "The
// boundary step without a host synchronisation"): the scalars it keeps on the device, the
// enqueued decision, the pinned copy of its outcome and the event the engine waits on later.
// CUDA builds only (DS_PRECISION_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "device_grad_stats.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/mpi/communicator.h"
#include "ds/optim/cuda_kernels.h"
#include "ds/optim/optimizer.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/step_decision.h"

namespace ds::engine {

class DeviceAsyncStep {
 public:
  explicit DeviceAsyncStep(void* stream) : s_(as_stream(stream)) {
    try {
      DS_CUDA_CHECK(cudaMalloc(&d_red_, 4 * sizeof(double)));
      DS_CUDA_CHECK(cudaMalloc(&d_decision_, sizeof(precision::StepDecision)));
      DS_CUDA_CHECK(cudaMalloc(&d_skip_, sizeof(int)));
      DS_CUDA_CHECK(cudaMalloc(&d_grad_scale_, sizeof(float)));
      DS_CUDA_CHECK(cudaMallocHost(&h_decision_, sizeof(precision::StepDecision)));
      DS_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    } catch (...) {
      free_all();
      throw;
    }
  }
  ~DeviceAsyncStep() { free_all(); }
  DeviceAsyncStep(const DeviceAsyncStep&) = delete;
  DeviceAsyncStep& operator=(const DeviceAsyncStep&) = delete;

  // Enqueues the statistics of `grads` (into the store's d_sumsq / d_found_inf), their sum over
  // the ranks of `comm` (nullptr: one rank) and the decision; returns the optimizer's control.
  optim::cuda::DeviceStepControl decide(TensorView grads, double* d_sumsq, int* d_found_inf,
                                        const precision::StepInputs& in, Communicator* comm) {
    DS_CHECK(!launched_, "a device boundary step was launched while the previous one is unresolved");
    enqueue_device_grad_stats(grads, d_sumsq, d_found_inf, s_);
    precision::cuda::pack_step_stats(d_sumsq, d_found_inf, in, d_red_, s_);
    // NCCL: on its stream behind the compute stream, which waits for it on the device.
    // StagedComm stages through pinned host memory and synchronises inside (its design).
    if (comm) keep(comm->iall_reduce(TensorView{d_red_, 4, DType::F64}, ReduceOp::Sum));
    precision::cuda::decide_step(d_red_, d_sumsq, d_found_inf, in, d_decision_, d_skip_, d_grad_scale_, s_);
    optim::cuda::DeviceStepControl ctl;
    ctl.d_skip = d_skip_;
    ctl.d_grad_scale = d_grad_scale_;
    return ctl;
  }
  // A collective of this step (the statistics' all-reduce, ZeRO's parameter gather): the
  // stream waits for it on the device where the communicator can; its handle is waited for
  // (complete by then) in wait().
  void keep(CommWork w) {
    if (!w) return;
    w->order_stream(s_);
    work_.push_back(std::move(w));
  }
  // After the optimizer: the decision to pinned memory and the event that says it arrived.
  void record() {
    DS_CUDA_CHECK(cudaMemcpyAsync(h_decision_, d_decision_, sizeof(precision::StepDecision), cudaMemcpyDeviceToHost, s_));
    DS_CUDA_CHECK(cudaEventRecord(done_, s_));
    launched_ = true;
  }
  bool launched() const { return launched_; }
  // The decision of the launched step (waits for its event; the all-reduce completed before it).
  precision::StepDecision wait() {
    DS_CHECK(launched_, "no device boundary step was launched");
    launched_ = false;
    DS_CUDA_CHECK(cudaEventSynchronize(done_));
    for (CommWork& w : work_) w->wait();
    work_.clear();
    return *h_decision_;
  }

 private:
  void free_all() noexcept {
    // The owning store synchronised its stream before (release / free_all), so nothing queued
    // still writes these.
    work_.clear();
    cudaFree(d_red_);
    cudaFree(d_decision_);
    cudaFree(d_skip_);
    cudaFree(d_grad_scale_);
    cudaFreeHost(h_decision_);
    if (done_) cudaEventDestroy(done_);
    d_red_ = nullptr;
    d_decision_ = nullptr;
    d_skip_ = nullptr;
    d_grad_scale_ = nullptr;
    h_decision_ = nullptr;
    done_ = nullptr;
  }

  cudaStream_t s_;
  double* d_red_ = nullptr;                            // the 4 values the ranks sum
  precision::StepDecision* d_decision_ = nullptr;
  int* d_skip_ = nullptr;                              // DeviceStepControl::d_skip
  float* d_grad_scale_ = nullptr;                      // DeviceStepControl::d_grad_scale
  precision::StepDecision* h_decision_ = nullptr;      // pinned
  cudaEvent_t done_ = nullptr;
  std::vector<CommWork> work_;                         // this step's collectives (several ranks)
  bool launched_ = false;
};

}  // namespace ds::engine
