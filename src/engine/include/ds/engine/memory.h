// Model-state memory per rank: what the engine really allocated (Engine::memory_report) and
// the ZeRO paper's estimate (arXiv:1910.02054 §5), like DeepSpeed's
// estimate_zero2_model_states_mem_needs but with the paper's accounting:
//   stage 0: wP + wP + (4 + K)P            (w = working bytes/param: 2 for fp16/bf16, 4 for fp32)
//   stage 1: wP + wP + (4 + K)P/N          mixed-precision Adam (K = 8): 2P + 2P + 12P/N
//   stage 2: wP + wP/N + (4 + K)P/N        mixed-precision Adam: 2P + (2 + 12)P/N
//   stage 3: wP/N + 4P/N + (4 + K)P/N      dstrain keeps the reduced gradients in fp32:
//                                          mixed-precision Adam 18P/N, DeepSpeed's figure
// K = optimizer state bytes per parameter (Adam/AdamW/Lamb 8, SGD with momentum 4,
// SGD without 0, Adagrad 4); 4P = fp32 master weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/dtype.h"

namespace ds::engine {

struct ModelStateBytes {
  std::size_t params = 0;           // working parameters (fp32 | fp16 | bf16)
  std::size_t grads = 0;            // gradients (working dtype) resident between backwards;
                                    // ZeRO-2: the pages (CUDA device: the mapped chunks) of
                                    // this rank's partition (measured)
  std::size_t grad_buckets = 0;     // engine, ZeRO-2 only: the most gradient bytes seen
                                    // resident BEYOND `grads` during a backward (buckets being
                                    // written or reduced; measured with mincore, or counted
                                    // chunks on a device; 0 before the first backward)
  std::size_t master = 0;           // fp32 master weights (this rank's slice under ZeRO)
  std::size_t optimizer_state = 0;  // optimizer moments etc. (this rank's slice under ZeRO)
  std::size_t comm_scratch = 0;     // engine only: all-gather staging, comm-dtype copies
  std::size_t swap_buffers = 0;     // engine, NVMe offload: the sub-group buffers the swap
                                    // files are read into and written from
  std::size_t on_nvme = 0;          // engine, NVMe offload: bytes held in swap files (the
                                    // master, optimizer state, stage-3 parameter partition
                                    // moved there); disk, not memory: not in total()
  bool optimizer_offloaded = false; // ZeRO-Offload on the GPU path: `master` and
                                    // `optimizer_state` are host memory, the rest device memory
  std::size_t total() const {
    return params + grads + grad_buckets + master + optimizer_state + comm_scratch + swap_buffers;
  }
  std::string to_string() const;    // "params 1.2 MiB, grads ..., master ..., optimizer ..., total ..."
};

// Host memory reserved as address space and populated page by page (ZeRO-2's full-size
// gradient buffer, docs/dev/engine.md "Stage 2"). An anonymous private mapping: pages cost
// nothing until written and read as zero before; release() hands whole pages back to the
// kernel (madvise MADV_DONTNEED: they read as zero again, the state a backward accumulates
// into); resident_bytes() asks the kernel (mincore) which pages are really there. No
// MADV_HUGEPAGE unless asked for (see the constructor). Movable, not copyable.
class PagedBuffer {
 public:
  PagedBuffer() = default;
  // huge: starts on a 2 MiB boundary and asks for transparent huge pages (stage 3's flat
  // buffers, released in 2 MiB-aligned groups); otherwise 4 KiB pages only.
  PagedBuffer(std::size_t count, DType dtype, bool huge = false);
  static constexpr std::size_t kHugePage = std::size_t(2) << 20;
  ~PagedBuffer();
  PagedBuffer(PagedBuffer&& o) noexcept { swap(o); }
  PagedBuffer& operator=(PagedBuffer&& o) noexcept { PagedBuffer t(std::move(o)); swap(t); return *this; }
  PagedBuffer(const PagedBuffer&) = delete;
  PagedBuffer& operator=(const PagedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  std::size_t bytes() const { return count_ * dtype_size(dtype_); }
  std::size_t mapped_bytes() const { return mapped_; }  // bytes() rounded up to pages
  static std::size_t page_size();

  // Writes zeros over bytes [begin, end) (first touch: the pages become resident).
  void touch(std::size_t begin, std::size_t end);
  // Drops the pages of bytes [begin, end): begin page-aligned, end page-aligned or
  // mapped_bytes(). The contents read as zero afterwards.
  void release(std::size_t begin, std::size_t end);
  // Makes the pages of [begin, end) (page-aligned) resident at once, contents unchanged
  // (madvise MADV_POPULATE_WRITE: one call instead of a fault per page). A hint: does
  // nothing where the kernel lacks it (before Linux 5.14).
  void populate(std::size_t begin, std::size_t end);
  // Bytes of [begin, end) (page-aligned begin) whose pages are resident now.
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const;
  std::size_t resident_bytes() const { return resident_bytes(0, mapped_); }

 private:
  void swap(PagedBuffer& o) noexcept {
    std::swap(data_, o.data_); std::swap(mapped_, o.mapped_);
    std::swap(count_, o.count_); std::swap(dtype_, o.dtype_);
  }
  void* data_ = nullptr;
  std::size_t mapped_ = 0;
  std::size_t count_ = 0;
  DType dtype_ = DType::U8;
  mutable std::vector<unsigned char> vec_;  // mincore scratch, sized once
};

// Optimizer state bytes per parameter for a DeepSpeed optimizer name ("adam", "adamw",
// "lamb", "sgd", "adagrad"): 4 per state tensor its descriptor lists (ds/config/registry.h);
// `sgd_momentum` says whether SGD keeps a momentum buffer.
std::size_t optimizer_state_bytes_per_param(const std::string& optimizer_type, bool sgd_momentum = true);

// DeepSpeed's estimate_zero3_model_states_mem_needs (no offload): bytes per rank for the
// model states at stage 3, 4 * largest_layer_params + 18 * total_params / world_size.
std::size_t deepspeed_zero3_estimate_bytes(std::size_t total_params, std::size_t largest_layer_params, int world_size);

// The paper's per-rank bytes for `num_params` parameters on `world_size` data-parallel ranks.
ModelStateBytes estimate_model_states_bytes(std::size_t num_params, int world_size, int zero_stage,
                                            DType working_dtype = DType::F16,
                                            std::size_t optimizer_bytes_per_param = 8);

}  // namespace ds::engine
