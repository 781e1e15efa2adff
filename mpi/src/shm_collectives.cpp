// The shared-memory window collectives (docs/dev/communication.md "Shared-memory collectives")
// and their reduction kernels. Built with -fopenmp-simd (mpi/CMakeLists.txt) so the loops
// vectorize without -ffast-math reassociation.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "mpi_comm_impl.h"
#include "mpi_types.h"

namespace ds {

using detail::divide;
using detail::mptr;
using detail::ptr;

namespace {

// ---- shm reduction kernels: dst[i] = op over r of srcs[r][i], in rank order ----

template <typename T>
inline T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Max: return b > a ? b : a;
    case ReduceOp::Min: return b < a ? b : a;
    default: return a + b;
  }
}

template <typename T, ReduceOp Op>
void reduce_block_typed(T* __restrict acc, const T* __restrict src, std::size_t k) {
  if constexpr (Op == ReduceOp::Max) {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = src[i] > acc[i] ? src[i] : acc[i];
  } else if constexpr (Op == ReduceOp::Min) {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = src[i] < acc[i] ? src[i] : acc[i];
  } else {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = acc[i] + src[i];
  }
}

// dst2 (optional): a second copy of the result, written from the same L1-resident block (one
// pass over the sources for two outputs). dst / dst2 may equal a source: a block is read in
// full before it is written.
template <typename T, ReduceOp Op>
void reduce_slices_typed(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n) {
  constexpr std::size_t kBlock = 4096 / sizeof(T) * 4;  // 16 KiB accumulator, stays in L1
  alignas(64) T acc[kBlock];
  T* out = static_cast<T*>(dst);
  T* out2 = static_cast<T*>(dst2);
  for (std::size_t off = 0; off < n; off += kBlock) {
    const std::size_t k = std::min(kBlock, n - off);
    std::memcpy(acc, reinterpret_cast<const T*>(srcs[0]) + off, k * sizeof(T));
    for (std::size_t r = 1; r < srcs.size(); ++r)
      reduce_block_typed<T, Op>(acc, reinterpret_cast<const T*>(srcs[r]) + off, k);
    std::memcpy(out + off, acc, k * sizeof(T));
    if (out2) std::memcpy(out2 + off, acc, k * sizeof(T));
  }
}

template <ReduceOp Op>
void reduce_slices_half(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n, DType t) {
  constexpr std::size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  alignas(64) std::uint16_t rounded[kBlock];
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t off = 0; off < n; off += kBlock) {
    const std::size_t k = std::min(kBlock, n - off);
    convert(reinterpret_cast<const std::uint16_t*>(srcs[0]) + off, t, acc, DType::F32, k);
    for (std::size_t r = 1; r < srcs.size(); ++r) {
      convert(reinterpret_cast<const std::uint16_t*>(srcs[r]) + off, t, tmp, DType::F32, k);
      if constexpr (Op == ReduceOp::Sum) {
        // Round after every addition, as the MPI user op does, so both paths agree bit for bit.
        for (std::size_t i = 0; i < k; ++i) acc[i] = acc[i] + tmp[i];
        if (r + 1 < srcs.size()) {  // through a scratch: dst may be one of the sources
          convert(acc, DType::F32, rounded, t, k);
          convert(rounded, t, acc, DType::F32, k);
        }
      } else {
        reduce_block_typed<float, Op>(acc, tmp, k);
      }
    }
    convert(acc, DType::F32, out + off, t, k);
    if (dst2) std::memcpy(static_cast<std::uint16_t*>(dst2) + off, out + off, k * sizeof(std::uint16_t));
  }
}

template <ReduceOp Op>
void reduce_slices_op(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n, DType t) {
  switch (t) {
    case DType::F32: reduce_slices_typed<float, Op>(dst, dst2, srcs, n); break;
    case DType::F64: reduce_slices_typed<double, Op>(dst, dst2, srcs, n); break;
    case DType::I32: reduce_slices_typed<std::int32_t, Op>(dst, dst2, srcs, n); break;
    case DType::I64: reduce_slices_typed<std::int64_t, Op>(dst, dst2, srcs, n); break;
    case DType::F16: case DType::BF16: reduce_slices_half<Op>(dst, dst2, srcs, n, t); break;
    default: DS_THROW("shm reduction: unsupported dtype " << dtype_name(t));
  }
}

// Sum for avg too (the division comes afterwards).
void reduce_slices(void* dst, const std::vector<const char*>& srcs, std::size_t n, DType t, ReduceOp op,
                   void* dst2 = nullptr) {
  if (n == 0) return;
  switch (op) {
    case ReduceOp::Max: reduce_slices_op<ReduceOp::Max>(dst, dst2, srcs, n, t); break;
    case ReduceOp::Min: reduce_slices_op<ReduceOp::Min>(dst, dst2, srcs, n, t); break;
    default: reduce_slices_op<ReduceOp::Sum>(dst, dst2, srcs, n, t); break;
  }
}

// dst = dst2 = src, reading src once (16 KiB blocks: the second copy reads the first from L1).
void copy2(void* dst, void* dst2, const void* src, std::size_t bytes) {
  constexpr std::size_t kBlock = 16384;
  auto* d = static_cast<char*>(dst);
  auto* d2 = static_cast<char*>(dst2);
  auto* s = static_cast<const char*>(src);
  for (std::size_t off = 0; off < bytes; off += kBlock) {
    const std::size_t k = std::min(kBlock, bytes - off);
    std::memcpy(d + off, s + off, k);
    std::memcpy(d2 + off, d + off, k);
  }
}
}  // namespace

// ---- shm collectives ----

// Small messages on one node: every rank copies its whole buffer in; one barrier; every rank
// reduces the whole message from all segments in rank order (the same kernel and order on
// every rank, so the same bits as the sliced form). One barrier instead of two, for n times
// the reduction reads: wins while latency dominates.
void MpiComm::Impl::shm_all_reduce_oneshot(TensorView buf, ReduceOp op) {
  const std::uint64_t seq = chunk_seq++;
  std::memcpy(half(node_rank, seq), buf.data, buf.bytes());
  sync_barrier();
  std::vector<const char*> srcs(node_size);
  for (int r = 0; r < node_size; ++r) srcs[r] = r == node_rank ? static_cast<const char*>(buf.data) : half(r, seq);
  reduce_slices(buf.data, srcs, buf.count, buf.dtype, op);
  if (op == ReduceOp::Avg) divide(buf.data, buf.count, buf.dtype, size);
}

void MpiComm::Impl::shm_all_reduce(TensorView buf, ReduceOp op) {
  // (Oversubscribed, the n-fold reads share the CPUs: measured slower from 16 KiB at 4 ranks on 2.)
  if (nnodes == 1 && !oversub && buf.bytes() <= std::min(opt.shm_oneshot_max, half_bytes))
    return shm_all_reduce_oneshot(buf, op);
  const std::size_t es = dtype_size(buf.dtype);
  const std::size_t chunk = half_bytes / es / 64 * 64;
  std::vector<const char*> srcs(node_size);
  const MPI_Op mop = nnodes > 1 ? mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, buf.dtype) : MPI_OP_NULL;
  const MPI_Datatype mtype = nnodes > 1 ? mpi_datatype(buf.dtype) : MPI_DATATYPE_NULL;
  for (std::size_t off = 0; off < buf.count; off += chunk) {
    const std::size_t len = std::min(chunk, buf.count - off);
    const std::uint64_t seq = chunk_seq++;
    // Slices aligned to 16 elements; identical on every rank (and node).
    const std::size_t per = (len + node_size - 1) / node_size;
    const std::size_t per_al = (per + 15) / 16 * 16;
    auto begin = [&](int j) { return std::min(len, static_cast<std::size_t>(j) * per_al); };
    char* mine = half(node_rank, seq);
    const std::size_t b = begin(node_rank), e = begin(node_rank + 1);
    // Peers need every slice of my chunk but mine; my own slice is read from `buf` directly.
    std::memcpy(mine, ptr(buf, off), b * es);
    std::memcpy(mine + e * es, ptr(buf, off + e), (len - e) * es);
    sync_barrier();
    for (int r = 0; r < node_size; ++r) srcs[r] = r == node_rank ? ptr(buf, off + b) : half(r, seq) + b * es;
    if (nnodes == 1 && op != ReduceOp::Avg) {
      // My slice's result goes to the window (for the peers) and to `buf` in one pass.
      reduce_slices(mine + b * es, srcs, e - b, buf.dtype, op, mptr(buf, off + b));
    } else {
      reduce_slices(mine + b * es, srcs, e - b, buf.dtype, op);
      if (nnodes > 1 && e > b)
        DS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mine + b * es, static_cast<int>(e - b), mtype, mop, cross));
      if (op == ReduceOp::Avg) divide(mine + b * es, e - b, buf.dtype, size);
      std::memcpy(mptr(buf, off + b), mine + b * es, (e - b) * es);
    }
    sync_barrier();
    for (int j = 0; j < node_size; ++j) {  // the peers' slices (mine is in `buf` already)
      const std::size_t jb = begin(j), je = begin(j + 1);
      if (j != node_rank && je > jb) std::memcpy(mptr(buf, off + jb), half(j, seq) + jb * es, (je - jb) * es);
    }
  }
}

void MpiComm::Impl::shm_reduce_scatter(TensorView send, TensorView recv, ReduceOp op) {
  std::vector<std::size_t> offs(node_size), counts(node_size, recv.count);
  for (int b = 0; b < node_size; ++b) offs[b] = b * recv.count;
  shm_reduce_scatter_blocks(send.data, offs, counts, recv.data, send.dtype, op);
}

void MpiComm::Impl::shm_reduce_scatter_blocks(const void* send, std::span<const std::size_t> offs,
                                              std::span<const std::size_t> counts, void* out, DType t, ReduceOp op) {
  const std::size_t es = dtype_size(t);
  const std::size_t longest = *std::max_element(counts.begin(), counts.end());
  // Each rank's half holds one chunk-long slot per destination block.
  const std::size_t chunk = std::max<std::size_t>(half_bytes / es / node_size / 16 * 16, 16);
  const char* in = static_cast<const char*>(send);
  const char* own = in + offs[node_rank] * es;
  std::vector<const char*> srcs(node_size);
  // The same number of rounds on every rank (counts are the same everywhere), so the
  // barriers pair up even for a rank whose block is shorter or empty.
  for (std::size_t off = 0; off < longest; off += chunk) {
    auto piece = [&](int blk) { return counts[blk] > off ? std::min(chunk, counts[blk] - off) : std::size_t(0); };
    const std::uint64_t seq = chunk_seq++;
    char* mine = half(node_rank, seq);
    for (int blk = 0; blk < node_size; ++blk)  // the peers' blocks; mine is read from `send`
      if (blk != node_rank) std::memcpy(mine + blk * chunk * es, in + (offs[blk] + off) * es, piece(blk) * es);
    sync_barrier();
    const std::size_t len = piece(node_rank);
    for (int r = 0; r < node_size; ++r) srcs[r] = r == node_rank ? own + off * es : half(r, seq) + node_rank * chunk * es;
    // In place (out == own) is fine: reduce_slices reads a block in full before writing it.
    reduce_slices(static_cast<char*>(out) + off * es, srcs, len, t, op);
    if (op == ReduceOp::Avg) divide(static_cast<char*>(out) + off * es, len, t, size);
  }
}

void MpiComm::Impl::shm_all_gather(TensorView send, TensorView recv) {
  const std::size_t es = dtype_size(send.dtype);
  const std::size_t n = send.count;
  const std::size_t chunk = half_bytes / es;
  const bool in_place = send.data == ptr(recv, node_rank * n);
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    const std::uint64_t seq = chunk_seq++;
    // My block into the window and (unless in place) into `recv`, reading `send` once.
    if (in_place) std::memcpy(half(node_rank, seq), ptr(send, off), len * es);
    else copy2(half(node_rank, seq), mptr(recv, node_rank * n + off), ptr(send, off), len * es);
    sync_barrier();
    for (int j = 0; j < node_size; ++j)
      if (j != node_rank) std::memcpy(mptr(recv, j * n + off), half(j, seq), len * es);
  }
}

}  // namespace ds
