// comms_logger (ds/mpi/comms_logger.h) in one process: nccl-tests' bandwidth formulas,
// DeepSpeed's size text, trimmed mean and summary layout, the prof_ops filter, and the
// recording communicator over a stand-in backend whose non-blocking operations complete
// only when the test says so (recorded at completion, once; a dropped handle too).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/mpi/comms_logger.h"

namespace {

using ds::CommOp;
using ds::CommsLog;
using ds::CommsLoggerOptions;

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

TEST(CommsLogger, BandwidthFormulas) {
  // 1 GB in 1 s over 4 ranks: algbw 8 Gbps; busbw x 2(n-1)/n, (n-1)/n, 1.
  const std::size_t gb = 1000000000;
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllReduce, gb, 1.0, 4).algbw_gbps, 8.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllReduce, gb, 1.0, 4).busbw_gbps, 12.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::ReduceScatter, gb, 1.0, 4).busbw_gbps, 6.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllGather, gb, 0.5, 4).busbw_gbps, 12.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::Broadcast, gb, 2.0, 4).busbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllReduce, gb, 1.0, 2).busbw_gbps, 8.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllReduce, gb, 1.0, 1).busbw_gbps, 0.0);  // nothing crosses
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::Barrier, 0, 1e-3, 4).algbw_gbps, 0.0);
  EXPECT_DOUBLE_EQ(ds::comm_bandwidth(CommOp::AllReduce, gb, 0.0, 4).algbw_gbps, 0.0);  // no division by 0
}

TEST(CommsLogger, SizeTextAsDeepSpeed) {
  EXPECT_EQ(ds::comm_size_text(0), "0B");
  EXPECT_EQ(ds::comm_size_text(4), "4.0 B");
  EXPECT_EQ(ds::comm_size_text(1536), "1.5 KB");
  EXPECT_EQ(ds::comm_size_text(2048), "2.0 KB");
  EXPECT_EQ(ds::comm_size_text(3 * 1048576 + 262144), "3.25 MB");
  EXPECT_EQ(ds::comm_size_text(1048575), "1024.0 KB");  // rounds after picking the unit, as DeepSpeed
  EXPECT_EQ(ds::comm_size_text(1234567), "1.18 MB");
}

TEST(CommsLogger, TrimmedMeanDropsATenthAtEachEnd) {
  EXPECT_DOUBLE_EQ(ds::trimmed_mean({1, 1, 1, 1, 1, 1, 1, 1, 1, 100}), 1.0);    // k = 1
  EXPECT_DOUBLE_EQ(ds::trimmed_mean({1, 2, 3, 4, 100}), 22.0);                  // k = round(0.5) = 0
  std::vector<double> fifteen(15, 2.0);
  fifteen[0] = fifteen[1] = 1000;  // k = round(1.5) = 2 (halves to even, as Python)
  EXPECT_DOUBLE_EQ(ds::trimmed_mean(fifteen), 2.0);
  EXPECT_DOUBLE_EQ(ds::trimmed_mean({}), 0.0);
}

TEST(CommsLogger, SummaryTableAggregatesPerOpAndSize) {
  CommsLog log({}, 0, 2);
  EXPECT_EQ(log.summary(), "");
  // 1 MB all_reduce x3 (2 ms each), one 4 KB all_reduce, one broadcast; sizes print sorted.
  for (int i = 0; i < 3; ++i) log.record(CommOp::AllReduce, 1000000, 2e-3, nullptr);
  log.record(CommOp::AllReduce, 4096, 1e-3, nullptr);
  log.record(CommOp::Broadcast, 8, 0.5e-3, nullptr);
  const std::string expected =
      "Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     "
      "algbw_avg (Gbps)    busbw_avg (Gbps)\n"
      "all_reduce\n"
      "                    4.0 KB              1                   1.00                1.00                "
      "0.03                0.03\n"
      "                    976.56 KB           3                   6.00                2.00                "
      "4.00                4.00\n"
      "broadcast\n"
      "                    8.0 B               1                   0.50                0.50                "
      "0.00                0.00\n";
  EXPECT_EQ(log.summary(), expected);
  ASSERT_NE(log.sizes("all_reduce"), nullptr);
  EXPECT_EQ(log.sizes("all_reduce")->at(1000000).latencies_s.size(), 3u);
}

TEST(CommsLogger, VerboseLineAsDeepSpeed) {
  EXPECT_EQ(CommsLog::op_line("all_reduce", 1000000, 2e-3, ds::comm_bandwidth(CommOp::AllReduce, 1000000, 2e-3, 2)),
            "comm op: all_reduce | time (ms): 2.00 | msg size: 976.56 KB | algbw (Gbps): 4.00 | busbw (Gbps): 4.00");
}

TEST(CommsLogger, ProfOpsSelectsKindsWhenProfAllIsOff) {
  CommsLoggerOptions o;
  o.prof_all = false;
  o.prof_ops = {"all_gather_into_tensor", "broadcast"};  // DeepSpeed's spelling of all_gather
  CommsLog log(o, 0, 2);
  EXPECT_TRUE(log.wants(CommOp::AllGather));
  EXPECT_TRUE(log.wants(CommOp::Broadcast));
  EXPECT_FALSE(log.wants(CommOp::AllReduce));
  EXPECT_FALSE(log.wants(CommOp::Barrier));
  o.prof_all = true;
  EXPECT_TRUE(CommsLog(o, 0, 2).wants(CommOp::AllReduce));
  o.prof_ops = {"allreduce"};
  try {
    CommsLog bad(o, 0, 2, "ds.json: comms_logger.prof_ops");
    FAIL() << "an unknown op was accepted";
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "ds.json: comms_logger.prof_ops: unknown collective \"allreduce\"; expected all_reduce, "
                         "reduce_scatter, all_gather, broadcast or barrier");
  }
}

// A backend that moves nothing: its non-blocking operations complete when `release` is set.
struct FakeHandle : ds::CommHandle {
  explicit FakeHandle(const bool* release) : release(release) {}
  void wait() override {}
  bool test() override { return *release; }
  const bool* release;
};

struct FakeComm : ds::Communicator {
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string_view backend() const override { return "fake"; }
  void all_reduce(ds::TensorView, ds::ReduceOp) override { ++calls; }
  ds::CommWork iall_reduce(ds::TensorView, ds::ReduceOp) override { return work(); }
  void reduce_scatter(ds::TensorView, ds::TensorView, ds::ReduceOp) override { ++calls; }
  ds::CommWork ireduce_scatter(ds::TensorView, ds::TensorView, ds::ReduceOp) override { return work(); }
  void all_gather(ds::TensorView, ds::TensorView) override { ++calls; }
  ds::CommWork iall_gather(ds::TensorView, ds::TensorView) override { return work(); }
  void broadcast(ds::TensorView, int) override { ++calls; }
  void barrier() override { ++calls; }
  ds::CommWork work() {
    ++calls;
    return std::make_unique<FakeHandle>(&release);
  }
  int calls = 0;
  bool release = false;
};

std::size_t count_of(const CommsLog& log, const std::string& name, std::size_t bytes) {
  const auto* sizes = log.sizes(name);
  if (!sizes || !sizes->count(bytes)) return 0;
  return sizes->at(bytes).latencies_s.size();
}

TEST(CommsLogger, RecordingCommunicatorRecordsEveryKindWithItsBytes) {
  auto fake = std::make_shared<FakeComm>();
  auto log = std::make_shared<CommsLog>(CommsLoggerOptions{}, 0, 2);
  auto comm = ds::make_recording_communicator(fake, log);
  std::vector<float> buf(8);
  const ds::TensorView all{buf.data(), 8, ds::DType::F32}, half{buf.data(), 4, ds::DType::F32};
  comm->all_reduce(all, ds::ReduceOp::Sum);
  comm->reduce_scatter(all, half, ds::ReduceOp::Sum);  // the send buffer's bytes
  comm->all_gather(half, all);                          // the receive buffer's bytes
  comm->broadcast(ds::TensorView{buf.data(), 2, ds::DType::F16}, 0);
  comm->barrier();
  EXPECT_EQ(fake->calls, 5);
  EXPECT_EQ(comm->size(), 2);
  EXPECT_EQ(comm->backend(), "fake");
  EXPECT_EQ(count_of(*log, "all_reduce", 32), 1u);
  EXPECT_EQ(count_of(*log, "reduce_scatter", 32), 1u);
  EXPECT_EQ(count_of(*log, "all_gather", 32), 1u);
  EXPECT_EQ(count_of(*log, "broadcast", 4), 1u);
  EXPECT_EQ(count_of(*log, "barrier", 0), 1u);
}

TEST(CommsLogger, NonBlockingOperationsAreRecordedOnceAtCompletion) {
  auto fake = std::make_shared<FakeComm>();
  auto log = std::make_shared<CommsLog>(CommsLoggerOptions{}, 0, 2);
  auto comm = ds::make_recording_communicator(fake, log);
  std::vector<float> buf(8);
  const ds::TensorView all{buf.data(), 8, ds::DType::F32};
  ds::CommWork w = comm->iall_reduce(all, ds::ReduceOp::Sum);
  EXPECT_FALSE(w->test());
  EXPECT_EQ(count_of(*log, "all_reduce", 32), 0u);  // issued, not complete: nothing yet
  fake->release = true;
  EXPECT_TRUE(w->test());
  w->wait();
  EXPECT_TRUE(w->test());
  EXPECT_EQ(count_of(*log, "all_reduce", 32), 1u);
  // A handle dropped without wait() completes in its destructor and is recorded there.
  { ds::CommWork dropped = comm->iall_gather(ds::TensorView{buf.data(), 4, ds::DType::F32}, all); }
  EXPECT_EQ(count_of(*log, "all_gather", 32), 1u);
  // ZeRO's reduce of each block to its rank counts as a reduce_scatter of the whole buffer.
  const std::size_t counts[2] = {3, 5};
  comm->ireduce_scatter_in_place(all, counts, ds::ReduceOp::Sum)->wait();
  EXPECT_EQ(count_of(*log, "reduce_scatter", 32), 1u);
}

TEST(CommsLogger, FilteredKindsRunButAreNotRecorded) {
  auto fake = std::make_shared<FakeComm>();
  CommsLoggerOptions o;
  o.prof_all = false;
  o.prof_ops = {"all_gather"};
  auto log = std::make_shared<CommsLog>(o, 0, 2);
  auto comm = ds::make_recording_communicator(fake, log);
  float x[2] = {};
  comm->all_reduce(ds::TensorView{x, 2, ds::DType::F32}, ds::ReduceOp::Sum);
  comm->iall_reduce(ds::TensorView{x, 2, ds::DType::F32}, ds::ReduceOp::Sum)->wait();
  comm->all_gather(ds::TensorView{x, 1, ds::DType::F32}, ds::TensorView{x, 2, ds::DType::F32});
  EXPECT_EQ(fake->calls, 3);
  EXPECT_EQ(log->record_names(), std::vector<std::string>{"all_gather"});
}

TEST(CommsLogger, DebugNamesTheCaller) {
  auto fake = std::make_shared<FakeComm>();
  CommsLoggerOptions o;
  o.debug = true;
  auto log = std::make_shared<CommsLog>(o, 0, 2);
  auto comm = ds::make_recording_communicator(fake, log);
  float x[2] = {};
  {
    ds::CommCallerScope scope("reduce_gradients");
    comm->all_reduce(ds::TensorView{x, 2, ds::DType::F32}, ds::ReduceOp::Sum);
  }
  EXPECT_EQ(ds::CommCallerScope::current(), nullptr);
  comm->barrier();
  EXPECT_EQ(log->record_names(), (std::vector<std::string>{"all_reduce | [Caller Func: reduce_gradients]", "barrier"}));
}

}  // namespace
