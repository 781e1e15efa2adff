// Host memory that is allocated and first-touched once, then reused.
//
// Fresh pages cost ~13 us each on our CI machines (bench/results/2026-11-29-quiet.md, "Checkpoint save/load"): parameters,
// gradients, optimizer state and scratch are HostBuffers sized at setup, never per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "ds/core/dtype.h"

namespace ds {

inline constexpr std::size_t kHostAlignment = 64;  // one cache line, one AVX-512 vector

// Owning, 64-byte aligned, zero-filled host allocation. Movable, not copyable.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(std::size_t bytes);
  HostBuffer(std::size_t count, DType dtype) : HostBuffer(count * dtype_size(dtype)) { dtype_ = dtype; count_ = count; }
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept { swap(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept { HostBuffer t(std::move(o)); swap(t); return *this; }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  template <typename T> T* as() { return static_cast<T*>(data_); }
  template <typename T> const T* as() const { return static_cast<const T*>(data_); }
  template <typename T> std::span<T> span() { return {as<T>(), bytes_ / sizeof(T)}; }
  template <typename T> std::span<const T> span() const { return {as<T>(), bytes_ / sizeof(T)}; }

 private:
  void swap(HostBuffer& o) noexcept {
    std::swap(data_, o.data_); std::swap(bytes_, o.bytes_);
    std::swap(count_, o.count_); std::swap(dtype_, o.dtype_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t count_ = 0;
  DType dtype_ = DType::U8;
};

// Non-owning, typed view of contiguous elements; counts are elements, never bytes.
struct TensorView {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::F32;
  template <typename T> T* as() const { return static_cast<T*>(data); }
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

}  // namespace ds
