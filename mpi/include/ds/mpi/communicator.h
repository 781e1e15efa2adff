// Collective communication for gradients and parameters: one interface, an MPI backend for
// host memory (MpiComm, with a shared-memory fast path inside a node) and an NCCL backend
// for device memory (NcclComm). make_communicator() in comm_factory.h picks one.
//
// Contract (every backend):
// - Collective: every rank of the group calls the same operations in the same order with the
//   same counts and dtypes. A mismatch is undefined (typically a hang), as in MPI.
// - Counts are elements of the view's dtype, never bytes. Messages above INT_MAX elements
//   are split by the backend.
// - Threads: a communicator is used by one thread at a time. Non-blocking calls return a
//   handle; the buffers belong to the operation until wait() returns (or test() says done),
//   and handles must be waited in the order they were started.
// - An operation or dtype a backend does not support throws ds::Error naming both.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "ds/core/buffer.h"

namespace ds {

enum class ReduceOp { Sum, Avg, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

// ireduce_scatter_in_place's block layout, for its implementations: throws ds::Error (naming
// `who`) unless counts has one entry per rank summing to `total`; returns the element offset
// of `rank`'s block.
std::size_t in_place_block_offset(std::span<const std::size_t> counts, int size, int rank, std::size_t total,
                                  std::string_view who);

class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void wait() = 0;  // blocks until the operation completed
  virtual bool test() = 0;  // true once completed (then wait() returns at once)
  // Makes the CUDA stream `stream` (a cudaStream_t as void*) wait for the operation: on the
  // device where the communicator can (NCCL: its completion event), otherwise by waiting now.
  // wait() is still called afterwards, as always.
  virtual void order_stream(void* /*stream*/) { wait(); }
};
using CommWork = std::unique_ptr<CommHandle>;

// Which host-side paths a backend may use (config `communication`); see set_paths().
struct CommPaths {
  bool shared_memory = true;    // shared-memory collectives between the ranks of a node
  bool progress_thread = true;  // a thread that runs the non-blocking shared-memory collectives
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi", "nccl"

  // In place: buf = op over ranks of buf.
  virtual void all_reduce(TensorView buf, ReduceOp op) = 0;
  virtual CommWork iall_reduce(TensorView buf, ReduceOp op) = 0;

  // send.count == recv.count * size(); rank r receives op over ranks of block r of send.
  virtual void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) = 0;
  virtual CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) = 0;

  // In place, each block reduced only to the rank that owns it (ZeRO's reduce to the slice's rank):
  // buf is one block per rank in rank order, counts[r] elements for rank r (counts.size() ==
  // size(), sum == buf.count, zeros allowed; counts is copied before the call returns). Once
  // complete, this rank's block holds op over ranks of that block; the other blocks' contents
  // are unspecified. Half the bytes of an all-reduce on the wire. The default all-reduces the
  // whole buffer (a correct superset); MpiComm, NcclComm and StagedComm move each block only
  // to the rank that holds it.
  virtual CommWork ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> /*counts*/, ReduceOp op) {
    return iall_reduce(buf, op);
  }

  // recv.count == send.count * size(); block r of recv is rank r's send.
  virtual void all_gather(TensorView send, TensorView recv) = 0;
  virtual CommWork iall_gather(TensorView send, TensorView recv) = 0;

  virtual void broadcast(TensorView buf, int root) = 0;
  virtual void barrier() = 0;

  // Device backends (NcclComm): each operation first waits for the work enqueued so far on
  // this cudaStream_t (void* keeps CUDA headers out), so buffers produced there are complete.
  // Host backends ignore it.
  virtual void set_compute_stream(void* /*stream*/) {}

  // Seconds a collective may wait for the other ranks before the job is ended with one line
  // naming the collective (config comms_config.timeout; 0: wait forever). Backends without
  // a deadline ignore it.
  virtual void set_timeout(double /*seconds*/) {}
  // The deadline in force (seconds; 0: none). Checkpoint collectives wait as long.
  virtual double timeout() const { return 0; }

  // Host backends (MpiComm): turns the shared-memory path or the progress thread off after
  // construction (config `communication`, applied by the engine); what the communicator was
  // built without stays off. Not collective, but every rank must pass the same values before
  // its next collective. Other backends ignore it.
  virtual void set_paths(const CommPaths& /*paths*/) {}
};

}  // namespace ds
