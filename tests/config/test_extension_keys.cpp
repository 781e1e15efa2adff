// dstrain's config keys for knobs that were environment variables: checkpoint.io_threads,
// communication.{shared_memory, progress_thread, device_backend}, kernels.{attention, attention_block,
// cpu_bf16_gemm}. Defaults, strict values, and the to_json round trip.
#include <gtest/gtest.h>

#include <string>

#include "ds/config/parse.h"
#include "ds/mpi/comm_backends.h"
#include "parse_test_util.h"

namespace {

using namespace ds::config;

using config_test::error_of;
using config_test::parse;

TEST(ConfigExtensionKeys, Defaults) {
  const DsConfig c = parse("{}");
  EXPECT_EQ(c.checkpoint.io_threads, 0);
  EXPECT_TRUE(c.communication.shared_memory);
  EXPECT_TRUE(c.communication.progress_thread);
  EXPECT_EQ(c.communication.device_backend, "auto");
  EXPECT_EQ(c.kernels.attention, "auto");
  EXPECT_EQ(c.kernels.attention_block, 256);
  EXPECT_EQ(c.kernels.cpu_bf16_gemm, "auto");
  const auto j = to_json(c);
  EXPECT_EQ(j["checkpoint"]["io_threads"], 0);
  EXPECT_EQ(j["communication"],
            (nlohmann::json{{"timeout", 1800.0}, {"shared_memory", true}, {"progress_thread", true},
                            {"device_backend", "auto"}}));
  EXPECT_EQ(j["kernels"], (nlohmann::json{{"attention", "auto"}, {"attention_block", 256}, {"cpu_bf16_gemm", "auto"}}));
}

TEST(ConfigExtensionKeys, ValuesAndRoundTrip) {
  const DsConfig c = parse(R"({"checkpoint": {"io_threads": 64},
      "communication": {"shared_memory": false, "progress_thread": false, "device_backend": "Staged"},
      "kernels": {"attention": "Flash", "attention_block": 64, "cpu_bf16_gemm": "off"}})");
  EXPECT_EQ(c.checkpoint.io_threads, 64);
  EXPECT_FALSE(c.communication.shared_memory);
  EXPECT_FALSE(c.communication.progress_thread);
  EXPECT_EQ(c.communication.device_backend, "staged");
  EXPECT_EQ(c.kernels.attention, "flash");
  EXPECT_EQ(c.kernels.attention_block, 64);
  EXPECT_EQ(c.kernels.cpu_bf16_gemm, "off");
  const DsConfig again = parse(to_json(c).dump());
  EXPECT_EQ(to_json(again), to_json(c));
  EXPECT_EQ(again.kernels.attention, "flash");
  EXPECT_EQ(again.checkpoint.io_threads, 64);
  EXPECT_FALSE(again.communication.shared_memory);
  EXPECT_EQ(again.communication.device_backend, "staged");
  EXPECT_EQ(parse(R"({"communication": {"device_backend": "nccl"}})").communication.device_backend, "nccl");
  EXPECT_EQ(parse(R"({"kernels": {"attention": "materialized", "cpu_bf16_gemm": "on"}})").kernels.cpu_bf16_gemm, "on");
  EXPECT_EQ(parse(R"({"kernels": {"attention": "auto"}, "communication": null})").kernels.attention, "auto");
}

TEST(ConfigExtensionKeys, StrictValues) {
  EXPECT_HAS(error_of(R"({"checkpoint": {"io_threads": 65}})"),
             "ds.json:1:17: checkpoint.io_threads: expected an integer in [0, 64], got 65");
  EXPECT_HAS(error_of(R"({"checkpoint": {"io_threads": -1}})"), "checkpoint.io_threads: expected an integer in [0, 64], got -1");
  EXPECT_HAS(error_of(R"({"communication": {"shared_memory": 1}})"),
             "communication.shared_memory: expected true or false, got 1");
  EXPECT_HAS(error_of(R"({"communication": {"progres_thread": true}})"),
             "communication.progres_thread: unknown key in communication (did you mean \"progress_thread\"?)");
  EXPECT_HAS(error_of(R"({"communication": {"device_backend": "mpi"}})"),
             "communication.device_backend: expected \"auto\", \"nccl\" or \"staged\", got \"mpi\"");
  EXPECT_HAS(error_of(R"({"kernels": {"attention": "fast"}})"),
             "kernels.attention: expected \"auto\", \"materialized\" or \"flash\", got \"fast\"");
  EXPECT_HAS(error_of(R"({"kernels": {"attention_block": 0}})"), "kernels.attention_block: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of(R"({"kernels": {"cpu_bf16_gemm": true}})"),
             "kernels.cpu_bf16_gemm: expected \"auto\", \"on\" or \"off\", got true");
  EXPECT_HAS(error_of(R"({"kernels": 3})"), "kernels: expected an object, got 3");
}

// device_backend's choices are the communicator table's device-memory rows: each is accepted,
// the others refused with the list the communicator library gives.
TEST(ConfigExtensionKeys, DeviceBackendChoicesComeFromTheCommTable) {
  for (const ds::CommBackend& b : ds::comm_backends()) {
    const std::string json = R"({"communication": {"device_backend": ")" + std::string(b.name) + "\"}}";
    if (b.device_memory) {
      EXPECT_EQ(parse(json).communication.device_backend, b.name);
    } else {
      EXPECT_HAS(error_of(json), "communication.device_backend: expected " + ds::comm_backend_choices(true, true) +
                                     ", got \"" + std::string(b.name) + "\"");
    }
  }
}

}  // namespace
