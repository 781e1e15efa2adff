// The plain MPI collectives of MpiComm (blocking, or MPI_I* requests appended to `reqs`);
// counts above max_count are split.
#include <algorithm>
#include <cstring>

#include "mpi_comm_impl.h"
#include "mpi_types.h"

namespace ds {

using detail::divide;
using detail::mptr;
using detail::ptr;

// ---- plain MPI collectives (reqs != nullptr: non-blocking, requests appended) ----

void MpiComm::Impl::mpi_all_reduce(TensorView buf, ReduceOp op, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(buf.dtype);
  const MPI_Op mop = mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, buf.dtype);
  for (std::size_t off = 0; off < buf.count; off += opt.max_count) {
    const int k = static_cast<int>(std::min(opt.max_count, buf.count - off));
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, mptr(buf, off), k, t, mop, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mptr(buf, off), k, t, mop, comm));
    }
  }
  if (!reqs && op == ReduceOp::Avg) divide(buf.data, buf.count, buf.dtype, size);
}

void MpiComm::Impl::mpi_reduce_scatter(TensorView send, TensorView recv, ReduceOp op, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(send.dtype);
  const MPI_Op mop = mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, send.dtype);
  const std::size_t n = recv.count;
  if (n * static_cast<std::size_t>(size) <= opt.max_count) {
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Ireduce_scatter_block(send.data, recv.data, static_cast<int>(n), t, mop, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Reduce_scatter_block(send.data, recv.data, static_cast<int>(n), t, mop, comm));
    }
  } else {
    // Too many elements for one int count: block r is reduced to rank r in pieces.
    for (int r = 0; r < size; ++r) {
      for (std::size_t off = 0; off < n; off += opt.max_count) {
        const int k = static_cast<int>(std::min(opt.max_count, n - off));
        void* out = r == rank ? mptr(recv, off) : nullptr;
        if (reqs) {
          reqs->emplace_back();
          DS_MPI_CHECK(MPI_Ireduce(ptr(send, r * n + off), out, k, t, mop, r, comm, &reqs->back()));
        } else {
          DS_MPI_CHECK(MPI_Reduce(ptr(send, r * n + off), out, k, t, mop, r, comm));
        }
      }
    }
  }
  if (!reqs && op == ReduceOp::Avg) divide(recv.data, recv.count, recv.dtype, size);
}

std::function<void()> MpiComm::Impl::mpi_reduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts,
                                                               ReduceOp op, std::vector<MPI_Request>* reqs) {
  // One MPI_Reduce per non-empty block, rooted at the rank that holds it and in place there (in pieces of
  // max_count elements). Not MPI_Reduce_scatter with uneven counts: Open MPI ran that slower
  // than an all-reduce of the whole buffer at some sizes, the rooted reduces never
  // (bench/results/2026-12-04-bucket-reduce.md).
  const MPI_Datatype t = mpi_datatype(buf.dtype);
  const MPI_Op mop = mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, buf.dtype);
  std::size_t at = 0, own = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank) own = at;
    for (std::size_t off = 0; off < counts[r]; off += opt.max_count) {
      const int k = static_cast<int>(std::min(opt.max_count, counts[r] - off));
      char* p = mptr(buf, at + off);
      const void* sbuf = r == rank ? MPI_IN_PLACE : p;
      void* rbuf = r == rank ? p : nullptr;
      if (reqs) {
        reqs->emplace_back();
        DS_MPI_CHECK(MPI_Ireduce(sbuf, rbuf, k, t, mop, r, comm, &reqs->back()));
      } else {
        DS_MPI_CHECK(MPI_Reduce(sbuf, rbuf, k, t, mop, r, comm));
      }
    }
    at += counts[r];
  }
  std::function<void()> finish;
  if (op == ReduceOp::Avg) finish = [block = mptr(buf, own), mine = counts[rank], t = buf.dtype, n = size] {
    divide(block, mine, t, n);
  };
  if (reqs) return finish;
  if (finish) finish();
  return nullptr;
}

void MpiComm::Impl::mpi_all_gather(TensorView send, TensorView recv, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(send.dtype);
  const std::size_t n = send.count;
  const bool in_place = send.data == ptr(recv, rank * n);
  if (n * static_cast<std::size_t>(size) <= opt.max_count) {
    const void* sbuf = in_place ? MPI_IN_PLACE : send.data;
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Iallgather(sbuf, static_cast<int>(n), t, recv.data, static_cast<int>(n), t, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Allgather(sbuf, static_cast<int>(n), t, recv.data, static_cast<int>(n), t, comm));
    }
  } else {
    // Too many elements for one int count: every rank broadcasts its block in pieces.
    if (!in_place) std::memcpy(mptr(recv, rank * n), send.data, send.bytes());
    for (int r = 0; r < size; ++r) {
      for (std::size_t off = 0; off < n; off += opt.max_count) {
        const int k = static_cast<int>(std::min(opt.max_count, n - off));
        if (reqs) {
          reqs->emplace_back();
          DS_MPI_CHECK(MPI_Ibcast(mptr(recv, r * n + off), k, t, r, comm, &reqs->back()));
        } else {
          DS_MPI_CHECK(MPI_Bcast(mptr(recv, r * n + off), k, t, r, comm));
        }
      }
    }
  }
}

}  // namespace ds
