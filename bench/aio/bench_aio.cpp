// Swap-file throughput through ds::io::AioQueue (not a test): writes a file of --bytes under
// --dir in sub-group requests of --chunk bytes (all queued at once, as the engine queues a
// sub-group's tensors), then reads it back the same way, with the given --block_size,
// --queue_depth and --thread_count; --repeats times. Prints write and read GB/s (10^9 bytes
// per second, dd's unit) per repeat and their medians. bench/aio/run.sh runs it beside dd.
//
// Check: after the timed passes, every chunk read back on its own equals what was written
// (the pattern varies along the chunk, so a block in the wrong place shows). Headline: with
// --dd_write_gbs and --dd_read_gbs (dd's medians, measured by run.sh on the same directory
// just before) the lower of write/dd-write and read/dd-read; --min_ratio X fails the run below
// X. The last line is its JSON: record (bench/README.md).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_report.h"
#include "ds/core/error.h"
#include "ds/io/aio.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp", min_ratio_s = "0";
  std::size_t bytes = std::size_t(1) << 30, chunk = std::size_t(64) << 20, block_size = std::size_t(1) << 20;
  int queue_depth = 8, thread_count = 1, repeats = 3;
  double dd_write = 0, dd_read = 0;
  CLI::App app{"bench_aio: swap-file write/read GB/s through ds::io::AioQueue"};
  app.add_option("--dir", dir, "directory of the test file (the NVMe drive to measure)");
  app.add_option("--bytes", bytes, "file size in bytes (rounded up to --chunk)");
  app.add_option("--chunk", chunk, "bytes per request (one sub-group), all queued at once");
  app.add_option("--block_size", block_size, "aio block_size: bytes per pread/pwrite");
  app.add_option("--queue_depth", queue_depth, "aio queue_depth");
  app.add_option("--thread_count", thread_count, "aio thread_count");
  app.add_option("--repeats", repeats, "write+read passes (medians printed)")->check(CLI::PositiveNumber);
  app.add_option("--dd_write_gbs", dd_write, "dd oflag=direct write GB/s on --dir (the headline's reference)");
  app.add_option("--dd_read_gbs", dd_read, "dd iflag=direct read GB/s on --dir");
  app.add_option("--min_ratio", min_ratio_s, "fail (exit 3) when the headline ratio is below this");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help)
    return code == 0 ? 0 : 2;      // bad arguments: 2, as every benchmark
  }
  const double min_ratio = ds::bench::parse_min_ratio("bench_aio", min_ratio_s);
  if (min_ratio > 0 && !(dd_write > 0 && dd_read > 0)) {
    std::fprintf(stderr, "bench_aio: error: --min_ratio compares against dd: add --dd_write_gbs and --dd_read_gbs\n");
    return 2;
  }
  if (bytes == 0 || chunk == 0 || block_size == 0 || queue_depth <= 0 || thread_count <= 0) {
    std::fprintf(stderr, "bench_aio: error: --bytes, --chunk, --block_size, --queue_depth and --thread_count must be positive\n");
    return 2;
  }
  chunk = ds::io::align_up(std::min(chunk, bytes));
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  bytes = chunks * chunk;

  ds::bench::Report report("bench_aio");
  report.min_ratio(min_ratio);
  try {
    const std::string path = (std::filesystem::path(dir) / ("bench_aio." + std::to_string(::getpid()) + ".swap")).string();
    ds::io::SwapFile f = ds::io::SwapFile::create(path, bytes);
    ds::io::AioQueue q({.block_size = block_size, .queue_depth = queue_depth, .thread_count = thread_count});
    ds::io::AlignedBuffer src(chunk), dst(chunk);
    auto* s = src.as<unsigned char>();
    for (std::size_t i = 0; i < chunk; ++i) s[i] = static_cast<unsigned char>((i * 2654435761u) >> 11);
    std::printf("file=%s bytes=%zu chunk=%zu block_size=%zu queue_depth=%d thread_count=%d threads=%d direct=%d\n",
                path.c_str(), bytes, chunk, block_size, queue_depth, thread_count, q.threads(), int(f.direct()));

    std::vector<double> wr, rd;
    for (int r = 0; r < repeats; ++r) {
      double t0 = now();
      for (std::size_t c = 0; c < chunks; ++c) q.write(f, c * chunk, chunk, src.data());
      q.wait_all();
      if (!f.direct()) ::fdatasync(f.fd());  // buffered fallback: count the writeback
      const double tw = now() - t0;
      t0 = now();
      // One destination for every chunk: the bytes are checked below, this pass is timed.
      for (std::size_t c = 0; c < chunks; ++c) q.read(f, c * chunk, chunk, dst.data());
      q.wait_all();
      const double tr = now() - t0;
      wr.push_back(double(bytes) / tw / 1e9);
      rd.push_back(double(bytes) / tr / 1e9);
      std::printf("repeat=%d write_gbs=%.3f read_gbs=%.3f\n", r, wr.back(), rd.back());
    }
    std::size_t bad = 0;
    for (std::size_t c = 0; c < chunks; ++c) {
      std::memset(dst.data(), 0xA5, chunk);
      q.wait(q.read(f, c * chunk, chunk, dst.data()));
      if (std::memcmp(dst.data(), src.data(), chunk) != 0) ++bad;
    }
    report.check("every chunk read back equals what was written", bad == 0,
                 std::to_string(bad) + " of " + std::to_string(chunks) + " chunks differ");
    const double w = ds::bench::median(wr), rr = ds::bench::median(rd);
    std::printf("write_gbs=%.3f read_gbs=%.3f (medians of %d)\n", w, rr, repeats);
    report["bytes"] = bytes;
    report["chunk"] = chunk;
    report["block_size"] = block_size;
    report["queue_depth"] = queue_depth;
    report["thread_count"] = thread_count;
    report["direct"] = f.direct();
    report["write_gbs"] = w;
    report["read_gbs"] = rr;
    if (dd_write > 0 && dd_read > 0) {
      std::printf("dd_write_gbs=%.3f dd_read_gbs=%.3f write_vs_dd=%.3f read_vs_dd=%.3f\n", dd_write, dd_read, w / dd_write,
                  rr / dd_read);
      report["dd_write_gbs"] = dd_write;
      report["dd_read_gbs"] = dd_read;
      report.headline("min(write / dd write, read / dd read) GB/s, medians", std::min(w / dd_write, rr / dd_read));
    } else {
      report.headline("none: pass --dd_write_gbs and --dd_read_gbs (bench/aio/run.sh)", std::nan(""));
    }
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "bench_aio: error: %s\n", e.what());
    return 1;
  }
  return report.finish();
}
