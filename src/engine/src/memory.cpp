#include "ds/engine/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "ds/config/registry.h"
#include "ds/core/error.h"

namespace ds::engine {

namespace {
std::string mib(std::size_t b) {
  char buf[64];
  if (b < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / (1024.0 * 1024.0));
  }
  return buf;
}
}  // namespace

std::string ModelStateBytes::to_string() const {
  return "params " + mib(params) + ", grads " + mib(grads) +
         (grad_buckets > 0 ? " (+ " + mib(grad_buckets) + " buckets in backward)" : std::string()) +
         ", master " + mib(master) +
         ", optimizer " + mib(optimizer_state) +
         (optimizer_offloaded ? " (master and optimizer in host memory)" : std::string()) +
         ", comm scratch " + mib(comm_scratch) +
         (swap_buffers > 0 || on_nvme > 0 ? ", swap buffers " + mib(swap_buffers) : std::string()) +
         ", total " + mib(total()) + (on_nvme > 0 ? " (+ " + mib(on_nvme) + " on NVMe)" : std::string());
}

std::size_t optimizer_state_bytes_per_param(const std::string& t, bool sgd_momentum) {
  const config::OptimizerDescriptor* d = config::find_optimizer(t);
  if (!d) {
    std::string known;
    const auto& all = config::optimizer_registry();
    for (std::size_t i = 0; i < all.size(); ++i)
      known += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i].name;
    DS_THROW("unknown optimizer type '" << t << "' (expected " << known << ")");
  }
  optim::OptimizerParams p = d->defaults;
  p.momentum = sgd_momentum ? 1.0 : 0.0;  // read by SGD's state list only
  return d->state(p).size() * sizeof(float);
}

ModelStateBytes estimate_model_states_bytes(std::size_t p, int n, int stage, DType working,
                                            std::size_t k) {
  DS_CHECK(n >= 1, "world size must be >= 1, got " << n);
  DS_CHECK(stage >= 0 && stage <= 3, "ZeRO stage " << stage << " is not supported (0 to 3)");
  const double w = double(dtype_size(working));
  const double P = double(p), N = double(n);
  ModelStateBytes b;
  b.params = std::size_t(stage == 3 ? w * P / N : w * P);
  // Stage 3 keeps each rank's reduced gradient sum in fp32 (the cycle's sum rounded once).
  b.grads = std::size_t(stage == 3 ? 4.0 * P / N : stage == 2 ? w * P / N : w * P);
  b.master = std::size_t(stage >= 1 ? 4.0 * P / N : 4.0 * P);
  b.optimizer_state = std::size_t(stage >= 1 ? double(k) * P / N : double(k) * P);
  return b;
}

std::size_t deepspeed_zero3_estimate_bytes(std::size_t total_params, std::size_t largest_layer_params, int world_size) {
  DS_CHECK(world_size >= 1, "world size must be >= 1, got " << world_size);
  return 4 * largest_layer_params + std::size_t(18.0 * double(total_params) / double(world_size));
}

// ---- PagedBuffer ----

std::size_t PagedBuffer::page_size() {
  static const std::size_t ps = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? std::size_t(v) : std::size_t(4096);
  }();
  return ps;
}

PagedBuffer::PagedBuffer(std::size_t count, DType dtype, bool huge) : count_(count), dtype_(dtype) {
  const std::size_t ps = page_size();
  mapped_ = (count * dtype_size(dtype) + ps - 1) / ps * ps;
  if (mapped_ == 0) return;
  // Huge: map kHugePage more and keep the 2 MiB-aligned part, so that every 2 MiB-aligned
  // offset of the buffer is a huge-page boundary.
  const std::size_t extra = huge ? kHugePage : 0;
  void* p = mmap(nullptr, mapped_ + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DS_CHECK(p != MAP_FAILED, "PagedBuffer: mmap of " << mapped_ + extra << " bytes failed: " << std::strerror(errno));
  char* base = static_cast<char*>(p);
  if (huge) {
    char* aligned = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage);
    if (aligned > base) munmap(base, std::size_t(aligned - base));
    const std::size_t tail = std::size_t(base + mapped_ + extra - (aligned + mapped_));
    if (tail > 0) munmap(aligned + mapped_, tail);
    base = aligned;
  }
  data_ = base;
#if defined(MADV_NOHUGEPAGE) && defined(MADV_HUGEPAGE)
  // Default: releases are per 4 KiB page, and a transparent huge page would be split on the
  // first one. Huge (stage 3's flat buffers): whole 2 MiB-aligned groups come and go, and a
  // fault per 2 MiB instead of per 4 KiB is what makes gathering a group cheap (advice only).
  (void)madvise(data_, mapped_, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
}

PagedBuffer::~PagedBuffer() {
  if (data_) munmap(data_, mapped_);
}

void PagedBuffer::touch(std::size_t begin, std::size_t end) {
  end = std::min(end, mapped_);
  if (end > begin) std::memset(static_cast<char*>(data_) + begin, 0, end - begin);
}

void PagedBuffer::release(std::size_t begin, std::size_t end) {
  end = std::min(end, mapped_);
  if (end <= begin) return;
  const std::size_t ps = page_size();
  DS_CHECK(begin % ps == 0 && (end % ps == 0 || end == mapped_),
           "PagedBuffer::release: [" << begin << ", " << end << ") is not page-aligned");
  DS_CHECK(madvise(static_cast<char*>(data_) + begin, end - begin, MADV_DONTNEED) == 0,
           "PagedBuffer: madvise(MADV_DONTNEED) of " << end - begin << " bytes failed: " << std::strerror(errno));
}

void PagedBuffer::populate(std::size_t begin, std::size_t end) {
  end = std::min(end, mapped_);
  if (end <= begin) return;
#ifdef MADV_POPULATE_WRITE
  static bool supported = true;  // EINVAL once: an older kernel, stop asking
  if (supported && madvise(static_cast<char*>(data_) + begin, end - begin, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
    supported = false;
#endif
}

std::size_t PagedBuffer::resident_bytes(std::size_t begin, std::size_t end) const {
  end = std::min(end, mapped_);
  if (end <= begin) return 0;
  const std::size_t ps = page_size();
  DS_CHECK(begin % ps == 0, "PagedBuffer::resident_bytes: begin " << begin << " is not page-aligned");
  const std::size_t pages = (end - begin + ps - 1) / ps;
  if (vec_.size() < pages) vec_.resize(mapped_ / ps);
  DS_CHECK(mincore(static_cast<char*>(data_) + begin, end - begin, vec_.data()) == 0,
           "PagedBuffer: mincore failed: " << std::strerror(errno));
  std::size_t n = 0;
  for (std::size_t i = 0; i < pages; ++i) n += vec_[i] & 1u;
  return n * ps;
}

}  // namespace ds::engine
