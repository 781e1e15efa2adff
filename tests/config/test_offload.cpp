// zero_optimization.offload_optimizer / offload_param (and the deprecated cpu_offload /
// cpu_offload_param) and the aio section: what is read into OffloadConfig and AioConfig, the
// stage and path rules, and the messages naming the keys.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/config/validate.h"
#include "ds/core/error.h"
#include "parse_test_util.h"

namespace {

using namespace ds::config;

using config_test::error_of;
using config_test::parse;

// {"zero_optimization": {"stage": S, <zero>}} with <top> beside it.
std::string zero(int stage, const std::string& keys, const std::string& top = "") {
  return "{\"zero_optimization\": {\"stage\": " + std::to_string(stage) + (keys.empty() ? "" : ", " + keys) + "}" +
         (top.empty() ? "" : ", " + top) + "}";
}

TEST(ConfigOffload, DefaultsAreDeepSpeeds) {
  const DsConfig c = parse("{}");
  const OffloadConfig& o = c.zero_optimization.offload_optimizer;
  const OffloadConfig& p = c.zero_optimization.offload_param;
  EXPECT_EQ(o.device, "none");
  EXPECT_FALSE(o.enabled());
  EXPECT_EQ(o.buffer_count, 4);
  EXPECT_TRUE(o.pin_memory);
  EXPECT_EQ(o.ratio, 1.0);
  EXPECT_EQ(p.device, "none");
  EXPECT_EQ(p.buffer_count, 5);
  EXPECT_EQ(p.buffer_size, 100000000);
  EXPECT_EQ(p.max_in_cpu, 1000000000);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.thread_count, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
}

TEST(ConfigOffload, NvmeConfigFillsEveryField) {
  std::vector<std::string> w;
  const DsConfig c = parse(R"({
    "zero_optimization": {"stage": 3, "sub_group_size": 1e8,
      "offload_optimizer": {"device": "NVMe", "nvme_path": "/local_nvme", "buffer_count": 6, "pin_memory": false,
                            "pipeline_read": true, "pipeline_write": true, "fast_init": true, "ratio": 1,
                            "super_offload": false, "cpuadam_cores_perc": 0.8, "convert_grad_on_cpu": true},
      "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_count": 3, "buffer_size": 2e7,
                        "max_in_cpu": 5e8, "pin_memory": false}},
    "aio": {"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 4, "single_submit": true,
            "overlap_events": false, "use_gds": false}
  })", &w);
  // Read into the struct; the keys dstrain does not act on warn (tested below).
  EXPECT_EQ(w.size(), 4u);
  const OffloadConfig& o = c.zero_optimization.offload_optimizer;
  EXPECT_EQ(o.device, "nvme");  // lower-cased
  EXPECT_TRUE(o.nvme());
  EXPECT_EQ(o.nvme_path, "/local_nvme");
  EXPECT_EQ(o.buffer_count, 6);
  EXPECT_FALSE(o.pin_memory);
  EXPECT_TRUE(o.pipeline_read);
  EXPECT_TRUE(o.pipeline_write);
  EXPECT_TRUE(o.fast_init);
  EXPECT_EQ(o.ratio, 1.0);
  const OffloadConfig& p = c.zero_optimization.offload_param;
  EXPECT_EQ(p.device, "nvme");
  EXPECT_EQ(p.nvme_path, "/p");
  EXPECT_EQ(p.buffer_count, 3);
  EXPECT_EQ(p.buffer_size, 20000000);
  EXPECT_EQ(p.max_in_cpu, 500000000);
  EXPECT_FALSE(p.pin_memory);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 16);
  EXPECT_EQ(c.aio.thread_count, 4);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);

  // The resolved JSON has the sections and reads back to the same config.
  const nlohmann::json j = to_json(c);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["nvme_path"], "/local_nvme");
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["max_in_cpu"], 500000000);
  EXPECT_EQ(j["aio"]["intra_op_parallelism"], 4);
  EXPECT_EQ(to_json(parse(j.dump())), j);
  EXPECT_EQ(to_json(parse(to_json(parse("{}")).dump())), to_json(parse("{}")));
}

TEST(ConfigOffload, CpuAtEveryStageThatTakesIt) {
  for (int stage : {1, 2, 3}) {
    EXPECT_EQ(parse(zero(stage, R"("offload_optimizer": {"device": "cpu"})")).zero_optimization.offload_optimizer.device,
              "cpu");
  }
  EXPECT_EQ(parse(zero(3, R"("offload_param": {"device": "CPU"})")).zero_optimization.offload_param.device, "cpu");
  // nvme_path beside none or cpu: accepted and kept (DeepSpeed ignores it).
  EXPECT_EQ(parse(zero(2, R"("offload_optimizer": {"device": "cpu", "nvme_path": "/x"})"))
                .zero_optimization.offload_optimizer.nvme_path, "/x");
  EXPECT_EQ(parse(zero(0, R"("offload_optimizer": {"device": "none", "nvme_path": ""}, "offload_param": null)"))
                .zero_optimization.offload_optimizer.device, "none");
  EXPECT_HAS(error_of(zero(1, R"("offload_optimizer": {"device": "gpu"})")),
             "zero_optimization.offload_optimizer.device: expected \"none\", \"cpu\" or \"nvme\", got \"gpu\"");
}

TEST(ConfigOffload, StageRulesNameBothKeys) {
  // offload_param below stage 3: ignored, as DeepSpeed does, with a warning (its own test
  // configs set it at stage 0).
  std::vector<std::string> w;
  const auto ignored = config_test::parse(
      "{\"zero_optimization\": {\"stage\": 2,\n \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/p\"}}}", &w);
  EXPECT_EQ(ignored.zero_optimization.offload_param.device, "none");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "ds.json:2:2: zero_optimization.offload_param (device \"nvme\") is ignored below stage 3 (stage is 2)");
  EXPECT_HAS(error_of(zero(0, R"("offload_optimizer": {"device": "cpu"})")),
             "zero_optimization.offload_optimizer.device \"cpu\" needs zero_optimization.stage >= 1 (stage is 0)");
  // A config built in code is held to the same rules (the engine's validate()).
  DsConfig c;
  c.source = "<code>";
  c.zero_optimization.stage = 1;
  c.zero_optimization.offload_param.device = "cpu";
  try {
    validate(c);
    ADD_FAILURE() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "<code>: zero_optimization.offload_param.device \"cpu\" needs zero_optimization.stage 3 (stage is 1)");
  }
}

TEST(ConfigOffload, NvmeNeedsAPath) {
  EXPECT_HAS(error_of("{\"zero_optimization\": {\"stage\": 3,\n \"offload_optimizer\": {\"device\": \"nvme\"}}}"),
            "ds.json:2:24: zero_optimization.offload_optimizer.nvme_path is required with device \"nvme\" "
            "(the directory of the swap files)");
  EXPECT_HAS(error_of(zero(3, R"("offload_param": {"device": "nvme", "nvme_path": ""})")),
             "zero_optimization.offload_param.nvme_path is required with device \"nvme\"");
  EXPECT_HAS(error_of(zero(1, R"("offload_optimizer": {"device": "nvme", "nvme_path": null})")),
             "zero_optimization.offload_optimizer.nvme_path is required with device \"nvme\"");
  EXPECT_HAS(error_of(zero(1, R"("offload_optimizer": {"device": "nvme", "nvme_path": 3})")),
             "zero_optimization.offload_optimizer.nvme_path: expected a string, got 3");
  EXPECT_TRUE(parse(zero(1, R"("offload_optimizer": {"device": "nvme", "nvme_path": "/n"})"))
                  .zero_optimization.offload_optimizer.nvme());
}

TEST(ConfigOffload, OnlyWholeOffloadAndNoSuperOffload) {
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})")),
             "zero_optimization.offload_optimizer.ratio: 0.5 is not supported: dstrain offloads the whole optimizer "
             "state (partial offload is not implemented); remove ratio or set it to 1");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"device": "cpu", "ratio": 0})")),
             "zero_optimization.offload_optimizer.ratio: expected a number in (0, 1], got 0");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"device": "cpu", "ratio": 1.5})")),
             "zero_optimization.offload_optimizer.ratio: expected a number in (0, 1], got 1.5");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"device": "cpu", "super_offload": true})")),
             "zero_optimization.offload_optimizer.super_offload: true is not supported: it is DeepSpeed's mode for "
             "GH200 superchips; remove super_offload");
  std::vector<std::string> w;
  parse(zero(3, R"("offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": 0.5})"), &w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.offload_optimizer.cpuadam_cores_perc 0.5 has no effect: the CPU optimizer uses "
                   "the OpenMP threads of the rank (OMP_NUM_THREADS)");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"cpuadam_cores_perc": 0})")),
             "zero_optimization.offload_optimizer.cpuadam_cores_perc: expected a number in (0, 1], got 0");
}

TEST(ConfigOffload, BufferSizesAndTypes) {
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"device": "cpu", "buffer_count": 1})")),
             "zero_optimization.offload_optimizer.buffer_count: expected an integer in [2, 1048576], got 1");
  EXPECT_EQ(parse(zero(3, R"("offload_param": {"device": "cpu", "buffer_count": 1})")).zero_optimization.offload_param.buffer_count, 1);
  EXPECT_HAS(error_of(zero(3, R"("offload_param": {"buffer_count": 0})")),
             "zero_optimization.offload_param.buffer_count: expected an integer in [1, 1048576], got 0");
  EXPECT_HAS(error_of(zero(3, R"("offload_param": {"buffer_size": 0})")),
             "zero_optimization.offload_param.buffer_size: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of(zero(3, R"("offload_param": {"max_in_cpu": 1.5})")),
             "zero_optimization.offload_param.max_in_cpu: expected an integer >= 1, got 1.5");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"pin_memory": "yes"})")),
             "zero_optimization.offload_optimizer.pin_memory: expected true or false, got \"yes\"");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"pipeline_write": 1})")),
             "zero_optimization.offload_optimizer.pipeline_write: expected true or false, got 1");
  // Each section has DeepSpeed's keys of that section only.
  EXPECT_HAS(error_of(zero(3, R"("offload_param": {"ratio": 1})")),
             "zero_optimization.offload_param.ratio: unknown key in zero_optimization.offload_param (\"ratio\" belongs "
             "in zero_optimization.offload_optimizer)");
  EXPECT_HAS(error_of(zero(3, R"("offload_optimizer": {"buffer_cont": 4})")), "(did you mean \"buffer_count\"?)");
}

TEST(ConfigOffload, DeprecatedCpuOffloadIsRemapped) {
  std::vector<std::string> w;
  const DsConfig c = parse(zero(2, R"("cpu_offload": true)"), &w);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.cpu_offload is deprecated; write \"offload_optimizer\": {\"device\": \"cpu\"} "
                   "(the value is used)");
  w.clear();
  EXPECT_EQ(parse(zero(3, R"("cpu_offload_param": true)"), &w).zero_optimization.offload_param.device, "cpu");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.cpu_offload_param is deprecated; write \"offload_param\": {\"device\": \"cpu\"}");
  w.clear();
  EXPECT_FALSE(parse(zero(3, R"("cpu_offload": false)"), &w).zero_optimization.offload_optimizer.enabled());
  ASSERT_EQ(w.size(), 1u);
  EXPECT_HAS(w[0], "zero_optimization.cpu_offload is deprecated (replaced by offload_optimizer); false is the default: "
                   "remove it");

  EXPECT_HAS(error_of(zero(2, R"("offload_optimizer": {"device": "cpu"}, "cpu_offload": true)")),
             "zero_optimization.cpu_offload: the deprecated form of zero_optimization.offload_optimizer, which is also "
             "given (DeepSpeed asserts this): remove cpu_offload");
  EXPECT_HAS(error_of(zero(3, R"("cpu_offload_param": false, "offload_param": {"device": "none"})")),
             "zero_optimization.cpu_offload_param: the deprecated form of zero_optimization.offload_param, which is "
             "also given");
  // The stage rule names the key that was written.
  EXPECT_HAS(error_of(zero(0, R"("cpu_offload": true)")),
             "zero_optimization.cpu_offload true needs zero_optimization.stage >= 1 (stage is 0)");
  std::vector<std::string> w2;
  config_test::parse(zero(2, R"("cpu_offload_param": true)"), &w2);
  ASSERT_EQ(w2.size(), 2u);  // the deprecated form, then the stage
  EXPECT_HAS(w2[1], "zero_optimization.cpu_offload_param (device \"cpu\") is ignored below stage 3 (stage is 2)");
}

TEST(ConfigOffload, AioKeys) {
  EXPECT_EQ(parse(R"({"aio": {"thread_count": 3}})").aio.thread_count, 3);  // the older name
  EXPECT_EQ(parse(R"({"aio": null})").aio.queue_depth, 8);
  EXPECT_EQ(parse(R"({"aio": {"block_size": 4096, "queue_depth": 64, "intra_op_parallelism": 64}})").aio.block_size, 4096);
  EXPECT_HAS(error_of("{\"aio\": {\"intra_op_parallelism\": 2,\n \"thread_count\": 2}}"),
             "ds.json:2:2: aio.thread_count: both aio.intra_op_parallelism and aio.thread_count are given; they are two "
             "names of one setting: write one of them");
  EXPECT_HAS(error_of(R"({"aio": {"block_size": 1000}})"), "aio.block_size: expected an integer in [4096, 1073741824], got 1000");
  EXPECT_HAS(error_of(R"({"aio": {"block_size": 6000}})"),
             "aio.block_size: expected a multiple of 4096 (O_DIRECT requests are whole 4 KiB blocks), got 6000");
  EXPECT_HAS(error_of(R"({"aio": {"queue_depth": 0}})"), "aio.queue_depth: expected an integer in [1, 64], got 0");
  EXPECT_HAS(error_of(R"({"aio": {"queue_depth": 65}})"), "aio.queue_depth: expected an integer in [1, 64], got 65");
  EXPECT_HAS(error_of(R"({"aio": {"intra_op_parallelism": 100}})"),
             "aio.intra_op_parallelism: expected an integer in [1, 64], got 100");
  EXPECT_HAS(error_of(R"({"aio": {"single_submit": "no"}})"), "aio.single_submit: expected true or false");
  EXPECT_HAS(error_of(R"({"aio": {"use_gds": true}})"),
             "aio.use_gds: GPUDirect Storage is not supported; remove aio.use_gds");
  EXPECT_HAS(error_of(R"({"aio": {"queue_dept": 8}})"), "aio.queue_dept: unknown key in aio (did you mean \"queue_depth\"?)");
  EXPECT_HAS(error_of(R"({"aio": 1})"), "aio: expected an object, got 1");
  std::vector<std::string> w;
  parse(R"({"aio": {"single_submit": true, "overlap_events": false}})", &w);
  EXPECT_TRUE(w.empty()) << w.front();
}

// sub_group_size acts with offload_optimizer nvme; without it, at stage 3, a value other
// than the default warns. The offload section may come after it in the file.
TEST(ConfigOffload, SubGroupSizeWarnsOnlyWithoutNvme) {
  std::vector<std::string> w;
  const DsConfig c = parse(zero(3, R"("sub_group_size": 1e8, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"})"), &w);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000);
  EXPECT_TRUE(w.empty()) << w.front();
  parse(zero(1, R"("sub_group_size": 1e8, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"})"), &w);
  parse(zero(2, R"("sub_group_size": 1e8, "offload_optimizer": {"device": "cpu"})"), &w);
  EXPECT_TRUE(w.empty()) << w.front();
  for (const char* device : {"cpu", "none"}) {
    parse(zero(3, std::string(R"("sub_group_size": 1e8, "offload_optimizer": {"device": ")") + device + "\"}"), &w);
  }
  ASSERT_EQ(w.size(), 2u);
  EXPECT_HAS(w[0], "zero_optimization.sub_group_size 100000000 has no effect: it acts only with offload_optimizer "
                   "device \"nvme\" (the elements stepped at once between the swap files); without it dstrain steps "
                   "the rank's whole partition at once");
}

TEST(ConfigOffload, KeysWithoutEffectWarnOnlyWhenTheyWouldChangeSomething) {
  std::vector<std::string> w;
  // DeepSpeed's defaults, or a device that does not use them: silent.
  parse(zero(3, R"("offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 5, "buffer_size": 1e8},
                   "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "fast_init": false})"), &w);
  parse(zero(3, R"("offload_param": {"device": "cpu", "buffer_size": 5e7, "max_in_cpu": 1e6})"), &w);
  EXPECT_TRUE(w.empty()) << w.front();
  parse(zero(3, R"("offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 3, "buffer_size": 5e7,
                   "max_in_cpu": 1e6}, "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "fast_init": true})"), &w);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_HAS(w[0], "zero_optimization.offload_optimizer.fast_init true has no effect: dstrain's swap files start as "
                   "reserved extents that read as zero");
  EXPECT_HAS(w[1], "zero_optimization.offload_param.buffer_count 3 has no effect: dstrain reads each parameter group's "
                   "piece from the swap file straight into the gathered buffer");
  EXPECT_HAS(w[2], "zero_optimization.offload_param.buffer_size 50000000 has no effect");
  EXPECT_HAS(w[3], "zero_optimization.offload_param.max_in_cpu 1000000 has no effect");
}

}  // namespace
