// DeepSpeed's comms_logger: per collective kind and message size, the count, total and mean
// latency, algorithmic and bus bandwidth of every operation a communicator ran, printed as
// DeepSpeed's log_summary() table; `verbose` prints each operation as it completes.
//
// Recording sits in a Communicator that wraps another (make_recording_communicator): the
// engine wraps its communicators only when comms_logger.enabled, so a job without it runs
// the backends as they are (no clock reads, no allocation). Non-blocking operations are timed
// from the call that issued them to the wait()/test() that saw them complete, so a bucket's
// latency overlapped with backward includes the compute it overlapped.
//
// Bandwidths follow nccl-tests (doc/PERFORMANCE.md) with S the whole collective's bytes
// (all_reduce and broadcast: the buffer; reduce_scatter: the send buffer; all_gather: the
// receive buffer): algbw = S / time, busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n
// (reduce_scatter, all_gather), 1 (broadcast). In Gbps (1e9 bits per second), as DeepSpeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/mpi/communicator.h"

namespace ds {

// The kinds recorded, one row each; the names are what prof_ops takes and the summary prints.
enum class CommOp { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };
inline constexpr int kCommOpCount = 5;

struct CommOpRow {
  CommOp op;
  std::string_view name;
  // busbw / algbw for n ranks: nccl-tests' factor for this kind.
  double (*bus_factor)(int n);
};

std::span<const CommOpRow> comm_op_rows();
std::string_view comm_op_name(CommOp op);
// The row named `name` (DeepSpeed's spellings all_gather_into_tensor and
// reduce_scatter_tensor included); nullptr when none.
const CommOpRow* find_comm_op(std::string_view name);
// "all_reduce, reduce_scatter, ... or barrier", for errors.
std::string comm_op_choices();

// Algorithmic and bus bandwidth in Gbps of one `op` moving `bytes` in `seconds` over `n` ranks
// (0 when seconds <= 0).
struct Bandwidth {
  double algbw_gbps = 0;
  double busbw_gbps = 0;
};
Bandwidth comm_bandwidth(CommOp op, std::size_t bytes, double seconds, int n);

// DeepSpeed's convert_size: 0B, 512.0 B, 1.5 KB, 678.86 MB (powers of 1024, two decimals).
std::string comm_size_text(std::size_t bytes);
// DeepSpeed's trim_mean(values, 0.1): the mean after dropping round(n/10) values at each end.
double trimmed_mean(std::vector<double> values, double trim_fraction = 0.1);

struct CommsLoggerOptions {
  bool verbose = false;   // print each operation as it completes (rank 0)
  bool prof_all = true;   // record every kind; false: only prof_ops
  std::vector<std::string> prof_ops;  // names from comm_op_rows()
  bool debug = false;     // the summary's op names carry the caller (CommCallerScope)
};

// The records of one job: every communicator the engine wraps shares one log. Thread-safe
// (the engine's communicators may run on different threads).
class CommsLog {
 public:
  // Throws ds::Error naming `key` and the choices for a prof_ops name that is not a kind.
  CommsLog(CommsLoggerOptions options, int rank, int world_size, std::string_view key = "comms_logger.prof_ops");

  bool wants(CommOp op) const { return wanted_[static_cast<int>(op)]; }
  // One completed operation: `caller` is the CommCallerScope label at issue (nullptr: none).
  void record(CommOp op, std::size_t bytes, double seconds, const char* caller);

  // DeepSpeed's log_summary() table of this rank's records ("" when nothing was recorded).
  std::string summary() const;
  // The verbose line of one operation (DeepSpeed's format).
  static std::string op_line(std::string_view record_name, std::size_t bytes, double seconds, Bandwidth bw);

  struct Entry {
    std::vector<double> latencies_s;  // one per operation, in order
    std::vector<Bandwidth> bandwidths;
  };
  // record name -> message bytes -> entries; record names in first-seen order. For tests and
  // reports once the recorded operations completed: what they return is read without the lock.
  const std::vector<std::string>& record_names() const { return names_; }
  const std::map<std::size_t, Entry>* sizes(const std::string& record_name) const;

 private:
  CommsLoggerOptions options_;
  int rank_, world_size_;
  bool wanted_[kCommOpCount] = {};
  mutable std::mutex mutex_;
  std::vector<std::string> names_;
  std::map<std::string, std::map<std::size_t, Entry>> records_;
};

// The caller label comms_logger.debug adds to a record's name, per thread: the engine names
// the step that issues its collectives (`CommCallerScope scope("reduce_gradients")`). A
// thread-local pointer store, so it costs nothing measurable when no logger is on.
class CommCallerScope {
 public:
  explicit CommCallerScope(const char* caller);
  ~CommCallerScope();
  CommCallerScope(const CommCallerScope&) = delete;
  CommCallerScope& operator=(const CommCallerScope&) = delete;
  static const char* current();

 private:
  const char* previous_;
};

// A communicator that runs every operation on `inner` and records it in `log`.
std::shared_ptr<Communicator> make_recording_communicator(std::shared_ptr<Communicator> inner,
                                                          std::shared_ptr<CommsLog> log);

}  // namespace ds
