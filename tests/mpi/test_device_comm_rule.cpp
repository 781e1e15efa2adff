// The device communicator rule (ds/mpi/device_comm.h) on the CPU: the counts are passed in, so
// every branch runs without a GPU. auto: NCCL with a GPU per local rank and NCCL in the build,
// else staged; "nccl" that cannot work is refused naming the key; "staged" always; ranks that
// outnumber the GPUs wrap onto them.
#include <gtest/gtest.h>

#include <string>

#include "ds/core/error.h"
#include "ds/mpi/comm_backends.h"
#include "ds/mpi/device_comm.h"

namespace {

using ds::choose_device_backend;
using ds::DeviceCommInputs;

DeviceCommInputs counts(int local_ranks, int visible, bool nccl) { return {local_ranks, visible, nccl}; }

std::string error_of(std::string_view requested, const DeviceCommInputs& in) {
  try {
    choose_device_backend(requested, in, "ds.json: communication.device_backend");
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

TEST(DeviceCommRule, AutoTakesNcclWithAGpuPerRank) {
  for (auto [ranks, gpus] : {std::pair{1, 1}, {2, 2}, {4, 8}, {8, 8}}) {
    const auto c = choose_device_backend("auto", counts(ranks, gpus, true));
    EXPECT_EQ(c.backend, "nccl") << ranks << " ranks, " << gpus << " GPUs";
  }
  EXPECT_EQ(choose_device_backend("auto", counts(2, 2, true)).reason, "auto: a GPU per rank (2 ranks on a node, 2 GPUs)");
}

TEST(DeviceCommRule, AutoTakesStagedWhenRanksShareAGpu) {
  for (auto [ranks, gpus] : {std::pair{2, 1}, {4, 1}, {8, 4}, {3, 2}}) {
    const auto c = choose_device_backend("auto", counts(ranks, gpus, true));
    EXPECT_EQ(c.backend, "staged") << ranks << " ranks, " << gpus << " GPUs";
  }
  EXPECT_EQ(choose_device_backend("auto", counts(2, 1, true)).reason,
            "auto: 2 ranks on one node share 1 GPU, NCCL needs a GPU per rank");
  // No GPU at all: staged too (StagedComm then says that no device is visible).
  EXPECT_EQ(choose_device_backend("auto", counts(2, 0, true)).backend, "staged");
  EXPECT_EQ(choose_device_backend("auto", counts(2, 0, true)).reason, "auto: no GPU visible to 2 ranks on one node");
}

TEST(DeviceCommRule, AutoTakesStagedWithoutNccl) {
  const auto c = choose_device_backend("auto", counts(2, 2, false));
  EXPECT_EQ(c.backend, "staged");
  EXPECT_EQ(c.reason, "auto: dstrain was built without NCCL");
}

TEST(DeviceCommRule, ForcedBackends) {
  EXPECT_EQ(choose_device_backend("staged", counts(1, 8, true)).backend, "staged");
  EXPECT_EQ(choose_device_backend("staged", counts(4, 1, false)).backend, "staged");
  EXPECT_EQ(choose_device_backend("nccl", counts(2, 2, true)).backend, "nccl");
  EXPECT_EQ(choose_device_backend("nccl", counts(2, 2, true), "ds.json: communication.device_backend").reason,
            "ds.json: communication.device_backend \"nccl\"");
}

TEST(DeviceCommRule, NcclThatCannotWorkIsRefusedNamingTheKey) {
  EXPECT_HAS(error_of("nccl", counts(2, 1, true)),
             "ds.json: communication.device_backend \"nccl\": 2 ranks on one node see 1 GPU and NCCL needs a GPU per "
             "rank; use \"auto\" or \"staged\" to share the GPUs");
  EXPECT_HAS(error_of("nccl", counts(2, 2, false)),
             "ds.json: communication.device_backend \"nccl\": dstrain was built without NCCL (DS_WITH_NCCL); use "
             "\"auto\" or \"staged\"");
  EXPECT_HAS(error_of("mpi", counts(1, 1, true)),
             "ds.json: communication.device_backend: unknown device backend 'mpi' (expected \"auto\", \"nccl\" or "
             "\"staged\")");
}

TEST(DeviceCommRule, SharedDeviceWrapsOntoTheVisibleGpus) {
  EXPECT_EQ(ds::shared_device(0, 1), 0);
  EXPECT_EQ(ds::shared_device(1, 1), 0);
  EXPECT_EQ(ds::shared_device(3, 2), 1);
  EXPECT_EQ(ds::shared_device(2, 4), 2);  // exists: unchanged
  EXPECT_EQ(ds::shared_device(3, 0), 3);  // no GPU: nothing to wrap onto
}

// The back-end table is what the factory and the rule accept and list: every back end, the
// device-memory ones for device_backend, "auto" a choice but no back end.
TEST(CommBackends, ChoicesComeFromTheTable) {
  EXPECT_EQ(ds::comm_backend_choices(false, false), "auto, mpi, nccl or staged");
  EXPECT_EQ(ds::comm_backend_choices(true, true), "\"auto\", \"nccl\" or \"staged\"");
  ASSERT_NE(ds::find_comm_backend("staged"), nullptr);
  EXPECT_TRUE(ds::find_comm_backend("staged")->device_memory);
  EXPECT_FALSE(ds::find_comm_backend("mpi")->device_memory);
  EXPECT_EQ(ds::find_comm_backend("auto"), nullptr);
  for (const ds::CommBackend& b : ds::comm_backends())
    if (b.device_memory) EXPECT_NO_THROW(choose_device_backend(b.name, counts(1, 1, true), "key")) << b.name;
}

}  // namespace
