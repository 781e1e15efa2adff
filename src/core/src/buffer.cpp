#include "ds/core/buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "ds/core/error.h"

namespace ds {

HostBuffer::HostBuffer(std::size_t bytes) : bytes_(bytes), count_(bytes) {
  if (bytes == 0) return;
  const std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  data_ = std::aligned_alloc(kHostAlignment, rounded);
  DS_CHECK(data_ != nullptr, "out of host memory allocating " << bytes << " bytes");
  // Large arenas: ask for huge pages (fewer first-touch faults), then touch once now.
  if (rounded >= (std::size_t(2) << 20)) madvise(data_, rounded, MADV_HUGEPAGE);
  std::memset(data_, 0, rounded);
}

HostBuffer::~HostBuffer() { std::free(data_); }

}  // namespace ds
