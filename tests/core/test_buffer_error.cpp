#include <gtest/gtest.h>

#include <cstdint>

#include "ds/core/buffer.h"
#include "ds/core/error.h"
#include "ds/core/timer.h"

using namespace ds;

TEST(HostBuffer, AlignedZeroedAndMovable) {
  HostBuffer b(1001, DType::F32);
  EXPECT_EQ(b.count(), 1001u);
  EXPECT_EQ(b.bytes(), 4004u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % kHostAlignment, 0u);
  for (float v : b.span<float>()) ASSERT_EQ(v, 0.0f);
  b.as<float>()[5] = 3.0f;
  HostBuffer c = std::move(b);
  EXPECT_EQ(c.as<float>()[5], 3.0f);
  EXPECT_EQ(b.data(), nullptr);
}

TEST(Error, MessageNamesFileLineAndRank) {
  set_process_rank(3);
  try {
    DS_CHECK(1 + 1 == 3, "arithmetic is broken: " << 42);
    FAIL() << "DS_CHECK did not throw";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("arithmetic is broken: 42"), std::string::npos) << w;
    EXPECT_NE(w.find("tests/core/test_buffer_error.cpp:"), std::string::npos) << w;
    EXPECT_NE(w.find("rank 3"), std::string::npos) << w;
  }
  set_process_rank(-1);
}

TEST(DType, ParsesDeepSpeedSpellings) {
  EXPECT_EQ(parse_dtype("FP16"), DType::F16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_THROW(parse_dtype("fp8"), Error);
}

TEST(Timers, AccumulatesIntervals) {
  Timers t;
  t.start("a"); t.stop("a");
  t.start("a"); t.stop("a");
  EXPECT_EQ(t.count("a"), 2);
  EXPECT_GE(t.total_ms("a"), 0.0);
  t.stop("never-started");  // harmless
  EXPECT_EQ(t.count("never-started"), 0);
}
