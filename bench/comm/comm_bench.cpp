// comm_bench: time, algbw, busbw and #wrong for MpiComm's all_reduce / reduce_scatter /
// all_gather (fp32) per message size, each beside the raw MPI call timed in the same run
// (MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather on the same buffers) and the
// machine's memcpy bandwidth at that size. nccl-tests definitions: size = bytes of the full
// buffer (all_reduce: the buffer; reduce_scatter: the send buffer; all_gather: the receive
// buffer), algbw = size / time, busbw = algbw * 2(n-1)/n (all_reduce) or (n-1)/n (others).
// Each time is the slowest rank's, the median of the repeats after warm-up; the raw MPI call
// and ours alternate repeat by repeat (which goes first alternates too), so load that comes and
// goes on a shared machine hits both alike.
//
// limit_x: the highest ratio to the raw MPI call that ANY shared-memory algorithm with private
// caller buffers could reach at this size (docs/dev/communication.md "How fast can it be"): the
// bytes it must move through the caller's buffers at the memcpy bandwidth of this size, plus
// the bytes it must move through the shared window at the in-cache (256 KiB) memcpy
// bandwidth, times ranks per core; MPI's median time divided by that lower bound.
//
// Checks: every collective's output (one more untimed run of ours per row) against the
// expected sum or gather; any wrong element fails the run (exit 1). Headline: the median over
// the rows of the raw MPI call's time over ours (>1: ours is faster); --min_ratio X fails the
// run (exit 3) below X. The communicator is built here from MpiCommOptions with the
// shared-memory tuning flags below applied, so a sweep of those constants needs no rebuild.
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bench/comm/comm_bench [--max_size 256M] [--in_place]
//       [--shm_chunk 1M] [--shm_oneshot_max 32K] [--shm_min 0] [--plain_all_reduce 128K:16M]
//       [--barrier_spins 256] [--no_shm] [--no_progress_thread] [--min_ratio X]
#include <mpi.h>
#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"
#include "bench_report.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One repeat: `prepare` untimed, a barrier, then `op`; the slowest rank's time.
double slowest(MPI_Comm comm, const std::function<void()>& prepare, const std::function<void()>& op) {
  if (prepare) prepare();
  MPI_Barrier(comm);
  const double t0 = now();
  op();
  double dt = now() - t0, mx = 0;
  MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, comm);
  return mx;
}

// Median over repeats of the slowest rank's time; `prepare` runs untimed before each repeat.
// *best gets the fastest repeat (on a loaded machine the median catches preemptions).
double timed(MPI_Comm comm, int warmup, int reps, const std::function<void()>& prepare, const std::function<void()>& op,
             double* best = nullptr) {
  std::vector<double> t;
  for (int i = 0; i < warmup + reps; ++i) {
    const double mx = slowest(comm, prepare, op);
    if (i >= warmup) t.push_back(mx);
  }
  std::sort(t.begin(), t.end());
  if (best) *best = t.front();
  return t[t.size() / 2];
}

// The raw call and ours, interleaved: repeat i runs both (raw first on even i, ours first on
// odd i), each after `prepare` and a barrier; medians (and fastest repeats) of the slowest rank.
struct PairTimes {
  double raw = 0, ours = 0, best_raw = 0, best_ours = 0;
};
PairTimes timed_pair(MPI_Comm comm, int warmup, int reps, const std::function<void()>& prepare,
                     const std::function<void()>& raw, const std::function<void()>& ours) {
  std::vector<double> tr, to;
  auto one = [&](const std::function<void()>& op) { return slowest(comm, prepare, op); };
  for (int i = 0; i < warmup + reps; ++i) {
    double a, b;
    if (i % 2 == 0) {
      a = one(raw);
      b = one(ours);
    } else {
      b = one(ours);
      a = one(raw);
    }
    if (i >= warmup) {
      tr.push_back(a);
      to.push_back(b);
    }
  }
  std::sort(tr.begin(), tr.end());
  std::sort(to.begin(), to.end());
  return {tr[tr.size() / 2], to[to.size() / 2], tr.front(), to.front()};
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

int cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

float value(int r, std::size_t i) { return float(int((i * 7 + r * 3) % 17) - 8); }

std::string human(std::size_t b) {
  char s[32];
  if (b >= (1u << 20) && b % (1u << 20) == 0) std::snprintf(s, sizeof s, "%zuM", b >> 20);
  else if (b % 1024 == 0) std::snprintf(s, sizeof s, "%zuK", b >> 10);
  else std::snprintf(s, sizeof s, "%zu", b);
  return s;
}

// Bytes with an optional K/M/G suffix; "max" is SIZE_MAX. Throws naming `flag`.
std::size_t parse_size(const std::string& s, const std::string& flag = "size") {
  if (s == "max") return SIZE_MAX;
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    throw CLI::ValidationError(flag, "expected bytes with an optional K/M/G suffix, got '" + s + "'");
  }
  const std::string suffix = s.substr(pos);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (suffix == "G" || suffix == "g") v <<= 30;
  else if (!suffix.empty()) throw CLI::ValidationError(flag, "expected bytes with an optional K/M/G suffix, got '" + s + "'");
  return std::size_t(v);
}

// FROM:BELOW (bytes, K/M/G suffixes, BELOW may be "max"); "none" or 0:0 is the empty band.
ds::SizeBand parse_band(const std::string& s, const std::string& flag) {
  if (s == "none") return {};
  const auto colon = s.find(':');
  if (colon == std::string::npos) throw CLI::ValidationError(flag, "expected FROM:BELOW (e.g. 128K:16M, 32K:max, none), got '" + s + "'");
  return {parse_size(s.substr(0, colon), flag), parse_size(s.substr(colon + 1), flag)};
}

std::string band_str(const ds::SizeBand& b) {
  if (b.from >= b.below) return "none";
  return human(b.from) + ":" + (b.below == SIZE_MAX ? std::string("max") : human(b.below));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"communication benchmark: MpiComm vs raw MPI vs memcpy"};
  std::string min_s = "4K", max_s = "256M";
  int warmup = 2;
  double budget = 0.4;  // seconds of timed work per size and collective (repeats 3..50)
  std::string only;
  app.add_option("--min_size", min_s, "smallest message (bytes; K/M suffix)");
  app.add_option("--max_size", max_s, "largest message (bytes; K/M suffix)");
  app.add_option("--warmup", warmup, "untimed repeats per size");
  app.add_option("--budget", budget, "seconds of repeats per size and collective");
  app.add_option("--only", only, "all_reduce | reduce_scatter | all_gather");
  bool in_place = false;
  app.add_flag("--in_place", in_place, "all_gather in place (send = this rank's block of recv, as ZeRO's parameter gather)");
  double min_ratio = 0;
  app.add_option("--min_ratio", min_ratio, "fail (exit 3) when the median MPI/ours time ratio is below this")
      ->check(CLI::NonNegativeNumber);
  // The communicator's shared-memory tuning (MpiCommOptions), set directly; unset flags keep
  // the library's defaults.
  std::string shm_chunk, shm_oneshot_max, shm_min, oversubscribed;
  std::string plain_ar, plain_rs, plain_ag, plain_ag_ip, plain_ar_over, plain_ag_over;
  int barrier_spins = -2;
  bool no_shm = false, no_progress = false;
  app.add_option("--shm_chunk", shm_chunk, "bytes per shared-window half-segment (shm_chunk_bytes)");
  app.add_option("--shm_oneshot_max", shm_oneshot_max, "largest one-barrier all_reduce on one node (0: off)");
  app.add_option("--shm_min", shm_min, "every message of at least this many bytes takes the window (clears the plain bands; set_shm_min)");
  app.add_option("--plain_all_reduce", plain_ar, "all_reduce sizes FROM:BELOW that take plain MPI (none: no band)");
  app.add_option("--plain_reduce_scatter", plain_rs, "reduce_scatter plain-MPI band FROM:BELOW");
  app.add_option("--plain_all_gather", plain_ag, "all_gather plain-MPI band FROM:BELOW");
  app.add_option("--plain_all_gather_in_place", plain_ag_ip, "in-place all_gather plain-MPI band FROM:BELOW");
  app.add_option("--plain_all_reduce_oversubscribed", plain_ar_over, "all_reduce plain-MPI band on an oversubscribed node");
  app.add_option("--plain_all_gather_oversubscribed", plain_ag_over, "all_gather plain-MPI band on an oversubscribed node");
  app.add_option("--barrier_spins", barrier_spins, "pause-spins of a window barrier before it yields (-1: the default rule)")
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--oversubscribed", oversubscribed, "auto | 0 | 1: whether the node counts as oversubscribed")
      ->check(CLI::IsMember({"auto", "0", "1"}));
  app.add_flag("--no_shm", no_shm, "no shared-memory window: every collective takes plain MPI");
  app.add_flag("--no_progress_thread", no_progress, "run non-blocking shm collectives inline");
  ds::MpiCommOptions opts = ds::MpiCommOptions::from_env();
  try {
    app.parse(argc, argv);
    if (no_shm) opts.shm = false;
    if (no_progress) opts.progress_thread = false;
    if (!shm_chunk.empty()) opts.shm_chunk_bytes = parse_size(shm_chunk, "--shm_chunk");
    if (!shm_oneshot_max.empty()) opts.shm_oneshot_max = parse_size(shm_oneshot_max, "--shm_oneshot_max");
    if (!shm_min.empty()) opts.set_shm_min(parse_size(shm_min, "--shm_min"));  // first: it clears the bands
    if (!plain_ar.empty()) opts.plain_all_reduce = parse_band(plain_ar, "--plain_all_reduce");
    if (!plain_rs.empty()) opts.plain_reduce_scatter = parse_band(plain_rs, "--plain_reduce_scatter");
    if (!plain_ag.empty()) opts.plain_all_gather = parse_band(plain_ag, "--plain_all_gather");
    if (!plain_ag_ip.empty()) opts.plain_all_gather_in_place = parse_band(plain_ag_ip, "--plain_all_gather_in_place");
    if (!plain_ar_over.empty()) opts.plain_all_reduce_oversubscribed = parse_band(plain_ar_over, "--plain_all_reduce_oversubscribed");
    if (!plain_ag_over.empty()) opts.plain_all_gather_oversubscribed = parse_band(plain_ag_over, "--plain_all_gather_oversubscribed");
    if (barrier_spins != -2) opts.barrier_spins = barrier_spins;
    if (!oversubscribed.empty()) opts.oversubscribed = oversubscribed == "auto" ? -1 : std::stoi(oversubscribed);
    parse_size(min_s, "--min_size");
    parse_size(max_s, "--max_size");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help)
    return code == 0 ? 0 : 2;      // bad arguments: 2, as every benchmark
  }

  ds::DistributedContext ctx = ds::init_distributed();
  // Our own communicator with `opts` (the context's default one goes first: one window at a time).
  ctx.comm.reset();
  auto comm_owner = std::make_shared<ds::MpiComm>(ctx.mpi_comm, opts, ctx.runtime);
  auto& comm = *comm_owner;
  const int n = ctx.world_size, r = ctx.rank;
  const std::size_t min_b = parse_size(min_s), max_b = parse_size(max_s);
  const std::size_t max_elems = max_b / 4;

  // Allocated and touched once (fresh pages cost ~13 us each here).
  ds::HostBuffer work(max_elems, ds::DType::F32), pristine(max_elems, ds::DType::F32), scratch(max_elems, ds::DType::F32);
  float* W = work.as<float>();
  float* P = pristine.as<float>();
  float* S = scratch.as<float>();
  for (std::size_t i = 0; i < max_elems; ++i) P[i] = value(r, i);
  std::memcpy(W, P, max_elems * 4);
  std::memcpy(S, P, max_elems * 4);

  // In-cache memcpy bandwidth (256 KiB: the smallest pipeline chunk worth a barrier), fastest of
  // 20 repeats: the best the shared window's traffic could do.
  const std::size_t cache_b = std::min<std::size_t>(256u << 10, max_elems * 4);
  double cache_best = 0;
  timed(MPI_COMM_SELF, 2, 20, nullptr, [&] { std::memcpy(S, P, cache_b); }, &cache_best);
  double cache_gbs = cache_b / cache_best / 1e9;
  MPI_Allreduce(MPI_IN_PLACE, &cache_gbs, 1, MPI_DOUBLE, MPI_MAX, ctx.mpi_comm);
  int cores = cpu_count();
  MPI_Allreduce(MPI_IN_PLACE, &cores, 1, MPI_INT, MPI_MIN, ctx.mpi_comm);
  const double per_core = double(n) / std::min(n, cores);  // ranks sharing one core's time

  if (r == 0) {
    const char* tun = std::getenv("GLIBC_TUNABLES");
    const auto& o = comm.options();
    auto band = band_str;
    std::printf("# comm_bench: %d ranks, %d node(s), shm %s (chunk %zu KiB; from %zu / %zu / %zu B for all_reduce / "
                "reduce_scatter / all_gather; plain-MPI bands %s / %s / %s / in place %s / oversubscribed: all_reduce %s, all_gather %s, %s), progress thread %s, GLIBC_TUNABLES=%s\n",
                n, comm.num_nodes(), comm.shm_enabled() ? "on" : "off", o.shm_chunk_bytes >> 10, o.shm_min_all_reduce,
                o.shm_min_reduce_scatter, o.shm_min_all_gather, band(o.plain_all_reduce).c_str(),
                band(o.plain_reduce_scatter).c_str(), band(o.plain_all_gather).c_str(), band(o.plain_all_gather_in_place).c_str(), band(o.plain_all_reduce_oversubscribed).c_str(),
                band(o.plain_all_gather_oversubscribed).c_str(),
                comm.oversubscribed() ? "oversubscribed: those bands only" : "used",
                comm.uses_progress_thread() ? "on" : "off", tun ? tun : "(unset)");
    std::printf("# %d cpus (%.1f ranks per core), in-cache memcpy %.1f GB/s, load average %s\n", cores, per_core, cache_gbs,
                loadavg().c_str());
    std::printf("%-14s %6s %10s %8s %8s %7s %10s %8s %7s %9s %9s %8s\n", "collective", "size", "time_us", "algbw", "busbw",
                "#wrong", "mpi_us", "mpi_bus", "ratio", "best_rat", "memcpy", "limit_x");
    std::printf("%-14s %6s %10s %8s %8s %7s %10s %8s %7s %9s %9s %8s\n", "", "", "", "GB/s", "GB/s", "", "", "GB/s", "x", "x",
                "GB/s", "x");
  }

  ds::bench::Report report("comm_bench");
  report.min_ratio(min_ratio);
  std::vector<double> ratios;
  long long all_wrong = 0, all_checked = 0;
  nlohmann::json rows = nlohmann::json::array();
  const char* names[] = {"all_reduce", "reduce_scatter", in_place ? "all_gather_ip" : "all_gather"};
  for (std::size_t bytes = min_b; bytes <= max_b; bytes *= 2) {
    const std::size_t elems = bytes / 4;
    if (elems % n) continue;
    // memcpy bandwidth at this size (read + write of `bytes`, counted once as nccl-tests' algbw);
    // median of 5 for the column, the fastest rank's fastest repeat for limit_x (an upper bound).
    double tm_best = 0;
    double tm = timed(MPI_COMM_SELF, 1, 5, nullptr, [&] { std::memcpy(S, P, bytes); }, &tm_best);
    MPI_Allreduce(MPI_IN_PLACE, &tm_best, 1, MPI_DOUBLE, MPI_MIN, ctx.mpi_comm);
    const double memcpy_gbs = bytes / tm / 1e9, memcpy_best_gbs = bytes / tm_best / 1e9;
    for (int c = 0; c < 3; ++c) {
      if (!only.empty() && only != names[c] && !(c == 2 && only == "all_gather")) continue;
      const std::size_t blk = elems / n;
      std::function<void()> prepare, ours, raw;
      double factor = double(n - 1) / n;
      // Minimum bytes (read + written) per rank for a shared-memory algorithm with private
      // caller buffers: through the caller's buffers (buf) and through the window (win).
      const double S = double(bytes), q = double(n - 1) / n;
      const double buf_bytes = c == 0 ? 2 * S : c == 2 && in_place ? S : S + S / n;
      const double win_bytes = c == 0 ? 3 * q * S + S / n : c == 1 ? 2 * q * S : S;
      if (c == 0) {
        factor *= 2;
        prepare = [&] { std::memcpy(W, P, bytes); };
        ours = [&] { comm.all_reduce({W, elems, ds::DType::F32}, ds::ReduceOp::Sum); };
        raw = [&] { MPI_Allreduce(MPI_IN_PLACE, W, int(elems), MPI_FLOAT, MPI_SUM, ctx.mpi_comm); };
      } else if (c == 1) {
        ours = [&] { comm.reduce_scatter({P, elems, ds::DType::F32}, {W, blk, ds::DType::F32}, ds::ReduceOp::Sum); };
        raw = [&] { MPI_Reduce_scatter_block(P, W, int(blk), MPI_FLOAT, MPI_SUM, ctx.mpi_comm); };
      } else if (!in_place) {
        ours = [&] { comm.all_gather({P, blk, ds::DType::F32}, {W, elems, ds::DType::F32}); };
        raw = [&] { MPI_Allgather(P, int(blk), MPI_FLOAT, W, int(blk), MPI_FLOAT, ctx.mpi_comm); };
      } else {
        prepare = [&] { std::memcpy(W + r * blk, P, blk * 4); };
        ours = [&] { comm.all_gather({W + r * blk, blk, ds::DType::F32}, {W, elems, ds::DType::F32}); };
        raw = [&] { MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, W, int(blk), MPI_FLOAT, ctx.mpi_comm); };
      }
      // Repeats from a first estimate, so each size costs about `budget` seconds.
      const double t1 = timed(ctx.mpi_comm, 0, 1, prepare, raw) + timed(ctx.mpi_comm, 0, 1, prepare, ours);
      int reps = std::clamp(int(budget / std::max(t1, 1e-6)), 3, 50);
      MPI_Bcast(&reps, 1, MPI_INT, 0, ctx.mpi_comm);
      const PairTimes pt = timed_pair(ctx.mpi_comm, warmup, reps, prepare, raw, ours);
      const double t_mpi = pt.raw, t_ours = pt.ours, best_mpi = pt.best_raw, best_ours = pt.best_ours;
      const double t_bound = (buf_bytes / (2 * memcpy_best_gbs) + win_bytes / (2 * cache_gbs)) / 1e9 * per_core;
      // correctness of our result: one more untimed run of ours, its output in W
      if (prepare) prepare();
      ours();
      long long wrong = 0;
      if (c == 0) {
        for (std::size_t i = 0; i < elems; ++i) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, i);
          wrong += W[i] != s;
        }
      } else if (c == 1) {
        for (std::size_t i = 0; i < blk; ++i) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, r * blk + i);
          wrong += W[i] != s;
        }
      } else {
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < blk; ++i) wrong += W[q * blk + i] != value(q, i);
      }
      long long total_wrong = 0;
      MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, ctx.mpi_comm);
      all_wrong += total_wrong;
      all_checked += c == 1 ? (long long)elems : (long long)elems * n;  // output elements over all ranks
      ratios.push_back(t_mpi / t_ours);
      rows.push_back({{"collective", names[c]}, {"bytes", bytes}, {"time_us", t_ours * 1e6}, {"mpi_us", t_mpi * 1e6},
                      {"busbw_gbs", bytes / t_ours / 1e9 * factor}, {"mpi_busbw_gbs", bytes / t_mpi / 1e9 * factor},
                      {"ratio", t_mpi / t_ours}, {"best_ratio", best_mpi / best_ours}, {"memcpy_gbs", memcpy_gbs},
                      {"limit_x", t_mpi / t_bound}, {"wrong", total_wrong}});
      if (r == 0) {
        const double alg = bytes / t_ours / 1e9, alg_mpi = bytes / t_mpi / 1e9;
        std::printf("%-14s %6s %10.1f %8.2f %8.2f %7lld %10.1f %8.2f %7.2f %9.2f %9.2f %8.2f\n", names[c],
                    human(bytes).c_str(), t_ours * 1e6, alg, alg * factor, total_wrong, t_mpi * 1e6, alg_mpi * factor,
                    t_mpi / t_ours, best_mpi / best_ours, memcpy_gbs, t_mpi / t_bound);
        std::fflush(stdout);
      }
    }
  }
  const auto& o = comm.options();
  report["ranks"] = n;
  report["nodes"] = comm.num_nodes();
  report["in_place"] = in_place;
  report["options"] = {{"shm", comm.shm_enabled()}, {"shm_chunk_bytes", o.shm_chunk_bytes},
                       {"shm_oneshot_max", o.shm_oneshot_max}, {"shm_min_all_reduce", o.shm_min_all_reduce},
                       {"shm_min_reduce_scatter", o.shm_min_reduce_scatter}, {"shm_min_all_gather", o.shm_min_all_gather},
                       {"plain_all_reduce", band_str(o.plain_all_reduce)}, {"plain_reduce_scatter", band_str(o.plain_reduce_scatter)},
                       {"plain_all_gather", band_str(o.plain_all_gather)},
                       {"plain_all_gather_in_place", band_str(o.plain_all_gather_in_place)},
                       {"plain_all_reduce_oversubscribed", band_str(o.plain_all_reduce_oversubscribed)},
                       {"plain_all_gather_oversubscribed", band_str(o.plain_all_gather_oversubscribed)},
                       {"oversubscribed", comm.oversubscribed()}, {"barrier_spins", o.barrier_spins},
                       {"progress_thread", comm.uses_progress_thread()}};
  report["rows"] = rows;
  report.check("collective outputs equal the expected sums / gathers", all_wrong == 0,
               std::to_string(all_wrong) + " wrong of " + std::to_string(all_checked) + " output elements in " +
                   std::to_string(rows.size()) + " rows");
  report.headline("raw MPI time / ours, median over " + std::to_string(ratios.size()) + " rows", ds::bench::median(ratios));
  int code = report.finish(r == 0);
  MPI_Bcast(&code, 1, MPI_INT, 0, ctx.mpi_comm);
  comm_owner.reset();
  ds::finalize_distributed(ctx);
  return code;
}
