// DevicePagedBuffer: the CUDA driver's virtual memory calls behind a PagedBuffer-like contract.
#include "device_paged_buffer.h"

#include <algorithm>

#include "ds/core/error.h"

#if DS_PRECISION_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#endif

namespace ds::engine {

#if DS_PRECISION_HAVE_CUDA

namespace {

// The driver entry points, looked up once through the runtime (cudaGetDriverEntryPointByVersion)
// instead of linking libcuda: that library comes with the GPU driver, so an executable linked
// against it would not even start on a machine without one -- and every dstrain executable
// links this file, also for CPU training there. The runtime finds the driver at run time.
// Members named as the driver's functions, so DS_CU_CHECK's message names the call.
struct Vmm {
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
};

// The ABI of these calls as of CUDA 12.0 (the PFN_*_v10020 / _v2000 types: unchanged since).
constexpr unsigned kDriverAbi = 12000;

template <class Fn>
void lookup(Fn& fn, const char* symbol) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  DS_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbi, cudaEnableDefault, &q));
  DS_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr,
           "the CUDA driver has no " << symbol << " (entry point query result " << int(q)
                                     << "): ZeRO-2 on the GPU needs a driver with virtual memory management "
                                        "(CUDA 10.2 or later)");
  fn = reinterpret_cast<Fn>(p);
}

const Vmm& vmm() {
  static const Vmm v = [] {  // a thread-safe static; a failed lookup throws and is retried next time
    Vmm x;
    lookup(x.cuMemAddressReserve, "cuMemAddressReserve");
    lookup(x.cuMemAddressFree, "cuMemAddressFree");
    lookup(x.cuMemCreate, "cuMemCreate");
    lookup(x.cuMemRelease, "cuMemRelease");
    lookup(x.cuMemMap, "cuMemMap");
    lookup(x.cuMemUnmap, "cuMemUnmap");
    lookup(x.cuMemSetAccess, "cuMemSetAccess");
    lookup(x.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    lookup(x.cuDeviceGet, "cuDeviceGet");
    lookup(x.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    return x;
  }();
  return v;
}

// Ordinary device memory of `device` (pinned: not migratable), not exportable.
CUmemAllocationProp chunk_props(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

CUdeviceptr dptr(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

std::size_t DevicePagedBuffer::granularity(int device) {
  const CUmemAllocationProp prop = chunk_props(device);
  std::size_t g = 0;
  DS_CU_CHECK(vmm().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  DS_CHECK(g > 0, "CUDA device " << device << " reports an allocation granularity of 0");
  return g;
}

DevicePagedBuffer::DevicePagedBuffer(std::size_t bytes, void* stream, std::size_t chunk_bytes)
    : bytes_(bytes), stream_(stream) {
  DS_CUDA_CHECK(cudaGetDevice(&device_));
  // The runtime's primary context exists and is current from here on: the driver calls below
  // act in it, as the kernels and copies of the runtime do.
  DS_CUDA_CHECK(cudaFree(nullptr));
  CUdevice dev = 0;
  DS_CU_CHECK(vmm().cuDeviceGet(&dev, device_));
  int vmm_supported = 0;
  DS_CU_CHECK(vmm().cuDeviceGetAttribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  DS_CHECK(vmm_supported != 0, "CUDA device " << device_ << " does not support virtual memory management, which "
                               "ZeRO-2 on the GPU needs for its gradient buffer: use zero_optimization.stage 1");
  const std::size_t g = granularity(device_);
  table_ = ChunkTable(bytes, chunk_bytes == 0 ? g : round_up(chunk_bytes, g));
  if (table_.reserved_bytes() == 0) return;
  CUdeviceptr p = 0;
  DS_CU_CHECK(vmm().cuMemAddressReserve(&p, table_.reserved_bytes(), table_.chunk_bytes(), 0, 0));
  base_ = reinterpret_cast<void*>(p);
}

DevicePagedBuffer::~DevicePagedBuffer() {
  if (!base_) return;
  // No checks: also runs while an exception unwinds. Nothing may still use the memory.
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  unmap_all();
  vmm().cuMemAddressFree(dptr(base_), table_.reserved_bytes());
}

void DevicePagedBuffer::unmap_all() noexcept {
  const std::size_t cb = table_.chunk_bytes();
  for (std::size_t c = 0; c < table_.chunks(); ++c) {
    if (!table_.mapped(c)) continue;
    vmm().cuMemUnmap(dptr(base_) + c * cb, cb);
    table_.set_mapped(c, false);
  }
}

void DevicePagedBuffer::map_chunk(std::size_t c) {
  const std::size_t cb = table_.chunk_bytes();
  const CUdeviceptr at = dptr(base_) + c * cb;
  const CUmemAllocationProp prop = chunk_props(device_);
  // The handle goes as soon as the mapping holds the memory (cuMemUnmap then frees it); on a
  // failed map it frees the memory at once.
  struct Handle {
    CUmemGenericAllocationHandle h = 0;
    ~Handle() {
      if (h) vmm().cuMemRelease(h);
    }
  } mem;
  DS_CU_CHECK(vmm().cuMemCreate(&mem.h, cb, &prop, 0));  // CUDA_ERROR_OUT_OF_MEMORY when the device is full
  DS_CU_CHECK(vmm().cuMemMap(at, cb, 0, mem.h, 0));
  const CUmemGenericAllocationHandle h = mem.h;
  mem.h = 0;
  try {
    DS_CU_CHECK(vmm().cuMemRelease(h));
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DS_CU_CHECK(vmm().cuMemSetAccess(at, cb, &access, 1));
  } catch (...) {
    vmm().cuMemUnmap(at, cb);
    throw;
  }
  table_.set_mapped(c, true);
}

void DevicePagedBuffer::populate(std::size_t begin, std::size_t end) {
  const std::size_t cb = table_.chunk_bytes();
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  for (const ChunkTable::Run& run : table_.unmapped_runs(begin, end)) {
    // Fresh physical memory holds whatever was there before: zero it before any kernel on
    // the stream reads it (the kernels that accumulate gradients into it run on `s`, behind
    // this memset). Chunks mapped before a failure are zeroed too, so none is left mapped
    // with stale contents.
    std::size_t c = run.first;
    try {
      for (; c < run.last; ++c) map_chunk(c);
    } catch (...) {
      if (c > run.first) cudaMemsetAsync(static_cast<char*>(base_) + run.first * cb, 0, (c - run.first) * cb, s);
      throw;
    }
    DS_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(base_) + run.first * cb, 0, (run.last - run.first) * cb, s));
  }
}

void DevicePagedBuffer::touch(std::size_t begin, std::size_t end) {
  end = std::min(end, mapped_bytes());
  if (end <= begin) return;
  populate(begin, end);
  DS_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(base_) + begin, 0, end - begin, static_cast<cudaStream_t>(stream_)));
}

void DevicePagedBuffer::release(std::size_t begin, std::size_t end) {
  const std::size_t cb = table_.chunk_bytes();
  for (std::size_t c : table_.mapped_in(begin, end)) {
    DS_CU_CHECK(vmm().cuMemUnmap(dptr(base_) + c * cb, cb));
    table_.set_mapped(c, false);
  }
}

#else  // built without CUDA

std::size_t DevicePagedBuffer::granularity(int) { return 0; }
DevicePagedBuffer::DevicePagedBuffer(std::size_t, void*, std::size_t) {
  DS_THROW("a device paged buffer needs CUDA, but dstrain was built without it (DS_WITH_CUDA)");
}
DevicePagedBuffer::~DevicePagedBuffer() = default;
void DevicePagedBuffer::unmap_all() noexcept {}
void DevicePagedBuffer::map_chunk(std::size_t) {}
void DevicePagedBuffer::populate(std::size_t, std::size_t) {}
void DevicePagedBuffer::touch(std::size_t, std::size_t) {}
void DevicePagedBuffer::release(std::size_t, std::size_t) {}

#endif

}  // namespace ds::engine
