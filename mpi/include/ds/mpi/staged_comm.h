// StagedComm: ds::Communicator on device memory that stages every collective through pinned
// host memory and runs it with a host communicator (MpiComm). For the cases NCCL does not
// cover: several ranks on ONE GPU (NCCL refuses two ranks per device) and builds or
// machines without NCCL. make_communicator(ctx, "staged") builds one (comm_factory.h).
//
// Each operation: the device buffer is copied into a pinned staging buffer with
// cudaMemcpyAsync on the compute stream (set_compute_stream; nullptr = the legacy default
// stream), so it follows the work enqueued there, and that stream is synchronised; the host
// communicator runs the collective on the staging buffers; the result is copied back to the
// device buffer on the compute stream, and the stream is synchronised again, so the result is
// complete on the device when a blocking call returns or wait() returns.
//
// Non-blocking calls copy in at call time and start the host communicator's non-blocking
// collective (MpiComm's progress thread overlaps it with the caller); the copy back runs in
// wait() (or in test() once the host operation completed). Operations complete in the order
// they were started: waiting for one first completes every older one (with its copy back). A
// handle dropped without wait() still completes its host collective (the staging memory is
// in use) but does not copy the result back.
//
// Pinned staging blocks are kept for reuse (one per operation in flight, best fit). Every
// CUDA call is checked (DS_CUDA_CHECK: the call, the device, CUDA's error). Without CUDA in
// the build, the constructor throws ds::Error saying so.
#pragma once

#include <mpi.h>

#include <memory>

#include "ds/mpi/comm_backends.h"
#include "ds/mpi/communicator.h"

namespace ds {

namespace detail {
struct MpiRuntime;
}

class StagedComm final : public Communicator {
 public:
  // Collective over `comm` (builds an MpiComm over it); `device` is this rank's CUDA device,
  // which other ranks may share.
  StagedComm(MPI_Comm comm, int device, std::shared_ptr<detail::MpiRuntime> runtime = nullptr);
  ~StagedComm() override;
  StagedComm(const StagedComm&) = delete;
  StagedComm& operator=(const StagedComm&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return kStagedBackend; }

  // A cudaStream_t (void* keeps CUDA headers out of this header); nullptr = legacy default stream.
  void set_compute_stream(void* stream) override;

  void all_reduce(TensorView buf, ReduceOp op) override;
  CommWork iall_reduce(TensorView buf, ReduceOp op) override;
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  // Stages the whole buffer, reduces over MpiComm, copies back only this rank's block.
  CommWork ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) override;
  void all_gather(TensorView send, TensorView recv) override;
  CommWork iall_gather(TensorView send, TensorView recv) override;
  void broadcast(TensorView buf, int root) override;
  void barrier() override;
  // The host communicator's deadline, paths (MpiComm's rules).
  void set_timeout(double seconds) override;
  double timeout() const override;
  void set_paths(const CommPaths& paths) override;

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the handles in flight
};

}  // namespace ds
