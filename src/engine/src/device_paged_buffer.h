// DevicePagedBuffer: device memory reserved as address space and populated chunk by chunk --
// PagedBuffer (ds/engine/memory.h) for a CUDA device, so that ZeRO-2 on the GPU path keeps
// only this rank's slice of the gradients (and the buckets being written or reduced) in
// device memory, as the host path keeps only the slice's pages (docs/dev/gpu.md "ZeRO-2").
//
// The CUDA driver's virtual memory management: cuMemAddressReserve for the whole buffer once;
// a chunk (cuMemGetAllocationGranularity's minimum for the device, 2 MiB on current GPUs) gets
// its own physical allocation (cuMemCreate), mapping (cuMemMap) and access (cuMemSetAccess)
// when it is made resident, and cuMemUnmap frees it again when released. One mapping per
// chunk because cuMemUnmap takes only a whole mapping. Which chunks are mapped is a
// ChunkTable (chunk_table.h, tested on the CPU).
//
// Contract, as PagedBuffer's where it can be:
// - touch(b, e): [b, e) resident and zero (zeros written on the stream);
// - populate(b, e): the chunks of [b, e) resident; the chunks it maps read as zero (a memset
//   on the stream right after the map), the ones already mapped keep their contents;
// - release(b, e): chunk-aligned (end may be mapped_bytes()); the chunks are unmapped and
//   read as zero when made resident again. The CALLER guarantees that no work still queued
//   on any stream reads or writes them: unlike madvise, unmapping memory a kernel is about to
//   use is a fault. release() does not synchronise (that would stall the host on backward);
//   see DeviceParamStore / GradReducer for why each call is safe where it is made;
// - resident_bytes(b, e): bytes of the mapped chunks among those of [b, e).
// Touching an unmapped byte from a kernel is an illegal address (there is no page fault to
// fill it in), so everything a kernel writes must be made resident first.
//
// The zeroing memsets go on `stream` (a cudaStream_t as void*: the module's stream, which the
// kernels that later write the chunks run on, so they follow the memset without an event).
// Built without CUDA the constructor throws. Not copyable, not movable.
#pragma once

#include <cstddef>

#include "chunk_table.h"

namespace ds::engine {

class DevicePagedBuffer {
 public:
  // Reserves `bytes` (rounded up to chunks) on the current CUDA device; nothing is mapped.
  // chunk_bytes 0: the device's minimum granularity; otherwise a multiple of it (rounded up).
  DevicePagedBuffer(std::size_t bytes, void* stream, std::size_t chunk_bytes = 0);
  ~DevicePagedBuffer();  // synchronises the stream, unmaps everything, frees the range
  DevicePagedBuffer(const DevicePagedBuffer&) = delete;
  DevicePagedBuffer& operator=(const DevicePagedBuffer&) = delete;

  void* data() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  std::size_t chunk_bytes() const { return table_.chunk_bytes(); }
  std::size_t mapped_bytes() const { return table_.reserved_bytes(); }  // bytes() rounded up to chunks
  const ChunkTable& table() const { return table_; }

  void touch(std::size_t begin, std::size_t end);
  void populate(std::size_t begin, std::size_t end);
  void release(std::size_t begin, std::size_t end);
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const { return table_.resident_bytes(begin, end); }
  std::size_t resident_bytes() const { return table_.resident_bytes(); }

  // The device's minimum allocation granularity (bytes) for this buffer's kind of memory.
  static std::size_t granularity(int device);

 private:
  void map_chunk(std::size_t c);
  void unmap_all() noexcept;

  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
  void* stream_ = nullptr;
  ChunkTable table_;
};

}  // namespace ds::engine
