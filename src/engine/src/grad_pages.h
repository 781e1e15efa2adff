// GradPages: the gradient buffer as ZeRO-2 sees it, wherever it lives -- units of memory that
// the GradReducer gives back once their bucket is reduced (docs/dev/engine.md "Stage 2") and
// that read as zero when backward writes them again. Host: the pages of a PagedBuffer
// (HostGradPages below; a page faults in on its own at the first write). CUDA device: the
// chunks of a DevicePagedBuffer (device_param_store.cpp), which must be mapped before any
// kernel touches them, so the reducer maps the chunks of each parameter group as backward
// starts on it (GradReducer::acquire).
#pragma once

#include <cstddef>
#include <cstring>

#include "ds/engine/memory.h"

namespace ds::engine {

class GradPages {
 public:
  virtual ~GradPages() = default;
  virtual std::size_t unit() const = 0;          // bytes of a page / chunk
  virtual std::size_t mapped_bytes() const = 0;  // the buffer's bytes rounded up to units
  virtual bool on_device() const = 0;
  // Backward will write [begin, end) (unit-aligned begin). Host: a hint, fault the pages in at
  // once. Device: required -- map the chunks not mapped yet; they read as zero.
  virtual void make_resident(std::size_t begin, std::size_t end) = 0;
  // Gives [begin, end) back (unit boundaries, or mapped_bytes() as end); it reads as zero when
  // resident again. Device: nothing still queued on a stream may use it (see the caller).
  virtual void release(std::size_t begin, std::size_t end) = 0;
  // Writes zeros over bytes [begin, end) (device: on the store's stream).
  virtual void zero(std::size_t begin, std::size_t end) = 0;
  // Bytes resident among the units of [begin, end) (unit-aligned begin).
  virtual std::size_t resident_bytes(std::size_t begin, std::size_t end) const = 0;
  std::size_t resident_bytes() const { return resident_bytes(0, mapped_bytes()); }
};

// Host pages: PagedBuffer's calls under GradPages' names.
class HostGradPages final : public GradPages {
 public:
  explicit HostGradPages(PagedBuffer& b) : b_(b) {}
  std::size_t unit() const override { return PagedBuffer::page_size(); }
  std::size_t mapped_bytes() const override { return b_.mapped_bytes(); }
  bool on_device() const override { return false; }
  void make_resident(std::size_t begin, std::size_t end) override { b_.populate(begin, end); }
  void release(std::size_t begin, std::size_t end) override { b_.release(begin, end); }
  void zero(std::size_t begin, std::size_t end) override {
    if (end > begin) std::memset(static_cast<char*>(b_.data()) + begin, 0, end - begin);
  }
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const override {
    return b_.resident_bytes(begin, end);
  }

 private:
  PagedBuffer& b_;
};

}  // namespace ds::engine
