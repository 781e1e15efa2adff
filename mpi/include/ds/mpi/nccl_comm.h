// NcclComm: ds::Communicator on device memory over NCCL (compiled when NCCL is found).
//
// Bootstrap: rank 0 creates the ncclUniqueId and broadcasts it over the MPI communicator,
// then every rank calls ncclCommInitRank on device `device`. Operations run on the
// communicator's own stream; before each one the stream waits on an event recorded on the
// caller's compute stream (set_compute_stream), so gradients produced there are complete.
// Blocking calls return when the operation finished on the device; non-blocking calls
// return a handle whose wait() blocks the host until the operation's event completed (and
// makes the compute stream wait on it). On any NCCL error the communicator is aborted
// (ncclCommAbort) and ds::Error is thrown (DS_NCCL_CHECK). Buffers are device pointers;
// counts are elements.
//
// Deadline: a host wait for an operation (a blocking call, or a handle's wait()) longer than
// the timeout (set_timeout: the config's comms_config.timeout; DS_COMM_TIMEOUT wins; default
// 1800 s, 0 = none) ends the job with one line naming the collective and its sequence number
// (MPI_Abort), the same watchdog as MpiComm's; NCCL cannot tell which ranks did not arrive.
#pragma once

#include <mpi.h>

#include <memory>

#include "ds/mpi/comm_backends.h"
#include "ds/mpi/communicator.h"

namespace ds {

class NcclComm final : public Communicator {
 public:
  // Collective over `comm` (MPI, used for the id broadcast only).
  NcclComm(MPI_Comm comm, int device);
  ~NcclComm() override;  // ncclCommDestroy, or ncclCommAbort after an error
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return kNcclBackend; }

  // A cudaStream_t (void* keeps CUDA headers out of this header); nullptr = legacy default stream.
  void set_compute_stream(void* stream) override;
  void* stream() const;  // the communicator's own cudaStream_t

  void all_reduce(TensorView buf, ReduceOp op) override;
  CommWork iall_reduce(TensorView buf, ReduceOp op) override;
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  // One ncclReduce per non-empty block, rooted at the rank that holds it, in one NCCL group.
  CommWork ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) override;
  void all_gather(TensorView send, TensorView recv) override;
  CommWork iall_gather(TensorView send, TensorView recv) override;
  void broadcast(TensorView buf, int root) override;
  void barrier() override;
  void set_timeout(double seconds) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
