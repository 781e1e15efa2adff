// DevicePagedBuffer (src/engine/src/device_paged_buffer.h), the device memory behind ZeRO-2's
// gradients on the GPU path, on a real device:
//   - the reservation: bytes rounded up to chunks of the device's granularity, nothing mapped;
//     a chunk size asked for is rounded up to a multiple of it;
//   - touch maps and zeroes; populate maps only what is missing, zeroes what it maps and keeps
//     the contents of chunks already mapped; resident bytes follow; cudaPointerGetAttributes
//     calls a mapped chunk device memory (the models' bind() checks every view that way);
//   - release unmaps; a released chunk reads as zero when mapped again, although its old
//     physical memory held a pattern (the memset after the map);
//   - a release off the chunk boundaries is refused (ds::Error), the partial last chunk goes
//     with mapped_bytes() as the end;
//   - device memory really comes and goes (cudaMemGetInfo over 64 chunks, with slack for
//     other users of the GPU);
//   - a driver failure is reported through DS_CU_CHECK naming the call, the file and the
//     driver's error (the granularity of a device that does not exist).
// Without a GPU: exits 77 (skipped). Written on a machine without a GPU: not run on one yet.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "device_paged_buffer.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"

namespace {

using ds::engine::DevicePagedBuffer;

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) {                                      \
      ++cuda_test::g_failures;                          \
      std::printf("FAIL line %d: ", __LINE__);          \
      std::printf(__VA_ARGS__);                         \
      std::printf("\n");                                \
    }                                                   \
  } while (0)

// Bytes [begin, end) of the buffer, copied to the host after the stream's work.
std::vector<std::uint8_t> read(const DevicePagedBuffer& b, cudaStream_t s, std::size_t begin, std::size_t end) {
  std::vector<std::uint8_t> h(end - begin);
  DS_CUDA_CHECK(cudaMemcpyAsync(h.data(), static_cast<const char*>(b.data()) + begin, h.size(),
                                cudaMemcpyDeviceToHost, s));
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

bool all_equal(const std::vector<std::uint8_t>& v, std::uint8_t x) {
  for (std::uint8_t b : v)
    if (b != x) return false;
  return true;
}

void fill(DevicePagedBuffer& b, cudaStream_t s, std::size_t begin, std::size_t end, std::uint8_t x) {
  DS_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(b.data()) + begin, x, end - begin, s));
}

void contract(cudaStream_t s) {
  const std::size_t g = DevicePagedBuffer::granularity(0);
  std::printf("device 0: allocation granularity %zu bytes\n", g);
  CHECK(g > 0, "granularity 0");
  DevicePagedBuffer b(5 * g + g / 2, s);
  CHECK(b.chunk_bytes() == g && b.mapped_bytes() == 6 * g && b.bytes() == 5 * g + g / 2,
        "reservation: chunk %zu, mapped %zu, bytes %zu", b.chunk_bytes(), b.mapped_bytes(), b.bytes());
  CHECK(b.data() != nullptr && b.resident_bytes() == 0, "fresh buffer: data %p, resident %zu", b.data(),
        b.resident_bytes());

  b.touch(g, 3 * g);  // chunks 1, 2
  CHECK(b.resident_bytes() == 2 * g && b.table().mapped(1) && b.table().mapped(2) && !b.table().mapped(0),
        "touch: resident %zu", b.resident_bytes());
  CHECK(all_equal(read(b, s, g, 3 * g), 0), "touch: not zero");
  // What the models' bind() asks of every gradient view (DecoderCuda::bind_views): a mapped
  // chunk must read as device memory of this device.
  cudaPointerAttributes attr{};
  DS_CUDA_CHECK(cudaPointerGetAttributes(&attr, static_cast<char*>(b.data()) + g + 100));
  CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0,
        "a mapped chunk is not device memory of device 0 to cudaPointerGetAttributes (type %d, device %d)",
        int(attr.type), attr.device);

  fill(b, s, g, 3 * g, 0xAB);
  b.populate(0, 4 * g - 1);  // maps 0 and 3, keeps 1 and 2
  CHECK(b.resident_bytes() == 4 * g && b.resident_bytes(g, 2 * g) == g, "populate: resident %zu", b.resident_bytes());
  CHECK(all_equal(read(b, s, 0, g), 0) && all_equal(read(b, s, 3 * g, 4 * g), 0), "populate: new chunks not zero");
  CHECK(all_equal(read(b, s, g, 3 * g), 0xAB), "populate: changed a chunk that was mapped already");

  DS_CUDA_CHECK(cudaStreamSynchronize(s));  // the release contract: nothing queued uses chunk 1
  b.release(g, 2 * g);
  CHECK(b.resident_bytes() == 3 * g && !b.table().mapped(1) && b.resident_bytes(g, 2 * g) == 0,
        "release: resident %zu", b.resident_bytes());
  b.populate(g, g + 1);  // chunk 1 again: fresh memory, perhaps the very pages that held 0xAB
  CHECK(all_equal(read(b, s, g, 2 * g), 0), "a released chunk does not read as zero when mapped again");
  CHECK(all_equal(read(b, s, 2 * g, 3 * g), 0xAB), "release of chunk 1 changed chunk 2");

  bool threw = false;
  try {
    b.release(g / 2, 2 * g);
  } catch (const ds::Error& e) {
    threw = std::string(e.what()).find("chunk boundaries") != std::string::npos;
  }
  CHECK(threw, "a release off the chunk boundaries was not refused");
  CHECK(b.resident_bytes() == 4 * g, "the refused release changed the mapping (%zu)", b.resident_bytes());

  b.touch(5 * g, b.bytes());  // the partial last chunk
  CHECK(b.table().mapped(5) && all_equal(read(b, s, 5 * g, b.bytes()), 0), "last chunk: not mapped / not zero");
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  b.release(5 * g, b.mapped_bytes());
  b.release(0, b.mapped_bytes());
  CHECK(b.resident_bytes() == 0, "release of everything left %zu bytes", b.resident_bytes());

  DevicePagedBuffer big_chunks(10 * g, s, g + 1);
  CHECK(big_chunks.chunk_bytes() == 2 * g && big_chunks.mapped_bytes() == 10 * g, "asked-for chunk: %zu",
        big_chunks.chunk_bytes());
}

void memory_comes_and_goes(cudaStream_t s) {
  const std::size_t g = DevicePagedBuffer::granularity(0), n = 64;
  DevicePagedBuffer b(n * g, s);
  std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  DS_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  b.touch(0, b.mapped_bytes());
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  DS_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  b.release(0, b.mapped_bytes());
  DS_CUDA_CHECK(cudaMemGetInfo(&free2, &total));
  const double mib = 1024.0 * 1024.0, want = double(n * g) / mib;
  std::printf("%zu chunks: free %.1f -> %.1f -> %.1f MiB\n", n, double(free0) / mib, double(free1) / mib,
              double(free2) / mib);
  // Slack of a quarter for other processes and the driver's own bookkeeping.
  CHECK(double(free0) - double(free1) >= 0.75 * want * mib, "mapping %.0f MiB took only %.1f MiB", want,
        (double(free0) - double(free1)) / mib);
  CHECK(double(free2) - double(free1) >= 0.75 * want * mib, "releasing %.0f MiB gave back only %.1f MiB", want,
        (double(free2) - double(free1)) / mib);
}

void driver_errors_name_the_call() {
  std::string what;
  try {
    DevicePagedBuffer::granularity(1 << 20);  // no such device
  } catch (const ds::Error& e) {
    what = e.what();
  }
  std::printf("granularity of device 1048576: %s\n", what.c_str());
  CHECK(what.find("cuMemGetAllocationGranularity") != std::string::npos &&
            what.find("device_paged_buffer.cpp") != std::string::npos && what.find("CUDA_ERROR") != std::string::npos,
        "the driver error does not name the call, the file and the driver's error: %s", what.c_str());
}

}  // namespace

int main() {
  if (int rc = cuda_test::skip_without_gpu("test_device_paged_buffer")) return rc;
  try {
    DS_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t s = nullptr;
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    contract(s);
    memory_comes_and_goes(s);
    driver_errors_name_the_call();
    DS_CUDA_CHECK(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::printf("test_device_paged_buffer: error: %s\n", e.what());
    return 1;
  }
  return cuda_test::finish("test_device_paged_buffer");
}
