// ds/core/proc_status.h: the "<key>:" lines of /proc/self/status, and the peak resident memory
// (VmHWM) the training summary and the ZeRO benchmark report.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "ds/core/proc_status.h"

namespace {

std::optional<double> value_in(const char* text, const char* key) {
  std::istringstream in(text);
  return ds::proc_status_value(in, key);
}

}  // namespace

TEST(ProcStatus, ReadsTheKeysLine) {
  const char* status = "Name:\tds_train\nVmPeak:\t  900 kB\nVmHWM:\t  2048 kB\nVmRSS:\t  1536 kB\n";
  EXPECT_EQ(value_in(status, "VmHWM"), 2048.0);
  EXPECT_EQ(value_in(status, "VmRSS"), 1536.0);
  EXPECT_EQ(value_in(status, "VmPeak"), 900.0);
}

TEST(ProcStatus, MissingKeyOrNoNumberIsNullopt) {
  EXPECT_EQ(value_in("VmRSS:\t1 kB\n", "VmHWM"), std::nullopt);
  EXPECT_EQ(value_in("VmHWMX:\t1 kB\n", "VmHWM"), std::nullopt);  // a longer key is another key
  EXPECT_EQ(value_in("VmHWM:\tkB\n", "VmHWM"), std::nullopt);
  EXPECT_EQ(value_in("", "VmHWM"), std::nullopt);
}

TEST(ProcStatus, PeakResidentKeepsTheHighestResidentSetInMiB) {
  if (!std::ifstream("/proc/self/status")) GTEST_SKIP() << "no /proc/self/status";
  const auto before = ds::peak_resident_mib();
  ASSERT_TRUE(before.has_value());
  ASSERT_GT(*before, 0.0);
  ASSERT_LT(*before, 4096.0) << "implausible for this test process (kB read as MiB?)";
  // A block 64 MiB larger than the peak so far, every page written, then freed: the resident
  // set falls back, its peak stays at least the block (and not 1024 times it: MiB, not kB).
  const std::size_t mib = std::size_t(*before) + 64;
  {
    std::unique_ptr<char[]> block(new char[mib << 20]);
    std::memset(block.get(), 1, mib << 20);
    asm volatile("" : : "r"(block.get()) : "memory");  // the pages are written before it is freed
  }
  const auto after = ds::peak_resident_mib();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(*after, *before + 60.0) << "a " << mib << " MiB block was resident";
  EXPECT_LE(*after, *before + double(mib) + 16.0) << "a " << mib << " MiB block was resident";
}
