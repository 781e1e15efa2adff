// What ZeRO-2's page release costs per micro-step (not a test): for a gradient buffer of
// --mib MiB, times (a) zeroing it with memset while it stays resident (what stage 2 did
// before: other ranks' parts were zeroed after each reduction) against (b) releasing its
// pages with madvise(MADV_DONTNEED) in --bucket-mib pieces and writing every page again
// (what the next backward pays: one fresh-page fault per 4 KiB), (c) the same when each
// page is read before it is written (what a += into a released page does: a read fault maps
// the zero page, the write faults again), and (d) pre-populating each piece with
// madvise(MADV_POPULATE_WRITE) before writing it. Prints key=value lines;
// bench/zero/run.sh runs it once after the stage table.
//
// Check: every page rewritten after a release holds the written bytes (a page that came back
// other than written fails the run). Headline: the memset's time (the memory-bandwidth
// reference, measured here) over release + refault (>1: releasing is cheaper than zeroing);
// --min_ratio X fails the run below X. The last line is its JSON: record (bench/README.md).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_report.h"

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  double mib = 13.8, bucket_mib = 3.8;
  int reps = 9;
  CLI::App app{"page release vs memset"};
  app.add_option("--mib", mib, "gradient buffer size (MiB)");
  app.add_option("--bucket-mib", bucket_mib, "release granularity (MiB)");
  app.add_option("--reps", reps)->check(CLI::PositiveNumber);
  double min_ratio = 0;
  app.add_option("--min_ratio", min_ratio, "fail (exit 3) when memset time / (release + refault) is below this")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help)
    return code == 0 ? 0 : 2;      // bad arguments: 2, as every benchmark
  }
  const std::size_t ps = std::size_t(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = (std::size_t(mib * 1048576.0) + ps - 1) / ps * ps;
  const std::size_t chunk = std::max(ps, std::size_t(bucket_mib * 1048576.0) / ps * ps);
  char* p = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) return 1;
  madvise(p, bytes, MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);
  std::vector<double> zero, rel, fault, rw_fault, populate;
  std::size_t bad_bytes = 0;  // bytes that differ from what was written, after each release + rewrite
  for (int r = 0; r < reps; ++r) {
    double t0 = now_ms();
    std::memset(p, 0, bytes);
    double t1 = now_ms();
    for (std::size_t off = 0; off < bytes; off += chunk) madvise(p + off, std::min(chunk, bytes - off), MADV_DONTNEED);
    double t2 = now_ms();
    for (std::size_t off = 0; off < bytes; off += ps) p[off] = 1;  // one write per page: the faults
    std::memset(p, 1, bytes);                                        // and the data, as backward writes it
    double t3 = now_ms();
    std::memset(p, 1, bytes);  // the same writes on resident pages
    double t4 = now_ms();
    zero.push_back(t1 - t0);
    rel.push_back(t2 - t1);
    fault.push_back((t3 - t2) - (t4 - t3));
    for (std::size_t i = 0; i < bytes; ++i) bad_bytes += p[i] != 1;
    madvise(p, bytes, MADV_DONTNEED);
    double t5 = now_ms();
    volatile char sink = 0;
    for (std::size_t off = 0; off < bytes; off += ps) {
      sink = sink + p[off];  // read: maps the shared zero page
      p[off] = 1;            // write: the real fault
    }
    std::memset(p, 1, bytes);
    double t6 = now_ms();
    rw_fault.push_back((t6 - t5) - (t4 - t3));
    for (std::size_t i = 0; i < bytes; ++i) bad_bytes += p[i] != 1;
#ifdef MADV_POPULATE_WRITE
    madvise(p, bytes, MADV_DONTNEED);
    double t7 = now_ms();
    for (std::size_t off = 0; off < bytes; off += chunk) madvise(p + off, std::min(chunk, bytes - off), MADV_POPULATE_WRITE);
    std::memset(p, 1, bytes);
    double t8 = now_ms();
    populate.push_back((t8 - t7) - (t4 - t3));
#else
    populate.push_back(-1);
#endif
  }
  const double pages = double(bytes / ps);
  std::printf("page_release mib=%.1f pages=%.0f memset_ms=%.2f madvise_ms=%.2f refault_ms=%.2f us_per_page=%.2f "
              "read_then_write_refault_ms=%.2f populate_write_ms=%.2f\n", mib,
              pages, median(zero), median(rel), median(fault), (median(rel) + median(fault)) * 1000.0 / pages,
              median(rw_fault), median(populate));
  munmap(p, bytes);
  ds::bench::Report report("page_release_bench");
  report.min_ratio(min_ratio);
  report["mib"] = mib;
  report["bucket_mib"] = bucket_mib;
  report["pages"] = pages;
  report["memset_ms"] = median(zero);
  report["madvise_ms"] = median(rel);
  report["refault_ms"] = median(fault);
  report["us_per_page"] = (median(rel) + median(fault)) * 1000.0 / pages;
  report["read_then_write_refault_ms"] = median(rw_fault);
  report["populate_write_ms"] = median(populate);
  report.check("released pages hold what was written after the refault", bad_bytes == 0,
               std::to_string(bad_bytes) + " wrong bytes of " + std::to_string(2 * std::size_t(reps) * bytes));
  report.headline("memset time / (release + refault) time (medians)", median(zero) / (median(rel) + median(fault)));
  return report.finish();
}
