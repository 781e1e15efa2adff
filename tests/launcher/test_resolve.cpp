// Include/exclude grammar and resolution, num_nodes/num_gpus, the no-hostfile and
// CUDA_VISIBLE_DEVICES rules, Slurm allocations (DeepSpeed's launcher/runner.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "../common/temp_dir.h"
#include "ds/core/error.h"
#include "ds/launch/filter.h"
#include "ds/launch/resolve.h"
#include "ds/launch/world_info.h"

using namespace ds::launch;

namespace {
Pool two4() { return {{"worker-0", 4}, {"worker-1", 4}}; }
std::string str(const WorldInfo& w) { return world_info_json(w); }

struct TempHostfile {
  std::string path;
  explicit TempHostfile(const std::string& text) {
    char buf[] = "/tmp/ds_hostfile_XXXXXX";
    int fd = mkstemp(buf);
    path = buf;
    std::FILE* f = fdopen(fd, "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  ~TempHostfile() { std::remove(path.c_str()); }
};

LocalDevices gpus(int n) { return {n, true}; }
LocalDevices cpus(int n) { return {n, false}; }
}  // namespace

TEST(Filter, ParseMergeDedupSort) {
  EXPECT_EQ(str(parse_node_filter("worker-2:0@worker-3:0,1", "-i")),
            R"({"worker-2": [0], "worker-3": [0, 1]})");
  EXPECT_EQ(str(parse_node_filter("w:3,1", "-i")), R"({"w": [1, 3]})");
  EXPECT_EQ(str(parse_node_filter("w:1,1", "-i")), R"({"w": [1]})");
  EXPECT_EQ(str(parse_node_filter("w:1@w:0,1", "-i")), R"({"w": [0, 1]})");
  EXPECT_EQ(str(parse_node_filter("w@w:2", "-i")), R"({"w": [2]})");
  EXPECT_EQ(str(parse_node_filter("w", "-i")), R"({"w": []})");
  EXPECT_EQ(str(parse_node_filter("w: 1,-1", "-i")), R"({"w": [-1, 1]})");
  EXPECT_EQ(str(parse_node_filter("a@", "-i")), R"({"a": [], "": []})");
  EXPECT_NE(error_of([] { parse_node_filter("w:1:2", "-i"); }).find("more than one ':'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_node_filter("w:1,,2", "-i"); }).find("bad slot ''"), std::string::npos);
  EXPECT_NE(error_of([] { parse_node_filter("w:x", "-i"); }).find("bad slot 'x'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_node_filter("w:", "-i"); }).find("bad slot"), std::string::npos);
}

TEST(Filter, SpecWorkedExamples) {
  EXPECT_EQ(str(apply_filters(two4(), "worker-1:0,3", "")), R"({"worker-1": [0, 3]})");
  EXPECT_EQ(str(apply_filters(two4(), "", "worker-1")), R"({"worker-0": [0, 1, 2, 3]})");
  EXPECT_EQ(str(apply_filters(two4(), "", "worker-0:0,1@worker-1:3")),
            R"({"worker-0": [2, 3], "worker-1": [0, 1, 2]})");
  // DeepSpeed PR #8239: a bare host in --include takes the whole host (master drops it).
  EXPECT_EQ(str(apply_filters(two4(), "worker-0@worker-1:0,2", "")),
            R"({"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]})");
  EXPECT_EQ(str(apply_filters(two4(), "worker-0", "")), R"({"worker-0": [0, 1, 2, 3]})");
  EXPECT_EQ(str(apply_filters(two4(), "worker-0:1,1", "")), R"({"worker-0": [1]})");
  EXPECT_EQ(str(apply_filters(two4(), "worker-0:1@worker-0:0,1", "")), R"({"worker-0": [0, 1]})");
  EXPECT_EQ(str(apply_filters(two4(), "worker-0:3,1", "")), R"({"worker-0": [1, 3]})");
  // Hostfile order wins over filter order.
  EXPECT_EQ(str(apply_filters(two4(), "worker-1:0@worker-0:0", "")),
            R"({"worker-0": [0], "worker-1": [0]})");
  Pool three = {{"worker-1", 4}, {"worker-2", 4}, {"worker-3", 4}};
  EXPECT_EQ(str(apply_filters(three, "", "worker-2:0@worker-3:0,1")),
            R"({"worker-1": [0, 1, 2, 3], "worker-2": [1, 2, 3], "worker-3": [2, 3]})");
}

TEST(Filter, Errors) {
  auto e = [](const char* inc, const char* exc) { return error_of([&] { apply_filters(two4(), inc, exc); }); };
  EXPECT_NE(e("worker-0", "worker-1").find("mutually exclusive"), std::string::npos);
  EXPECT_NE(e("jeff", "").find("host 'jeff' not found"), std::string::npos);
  EXPECT_NE(e("", "jeff").find("host 'jeff' not found"), std::string::npos);
  EXPECT_NE(e("worker-1:4", "").find("no slot 4 on host 'worker-1'"), std::string::npos);
  EXPECT_NE(e("", "worker-1:4").find("no slot 4"), std::string::npos);
  EXPECT_NE(e("worker-1:-1", "").find("no slot -1"), std::string::npos);
  EXPECT_NE(e("", "worker-1@worker-0:1@5").find("host '5' not found"), std::string::npos);
  EXPECT_NE(e("", "worker-0@worker-1").find("leaves no resources"), std::string::npos);
  EXPECT_NE(e("worker-0@", "").find("host '' not found"), std::string::npos);
}

// Filters match host names without regard to case, like the hostfile's duplicate check;
// world_info keeps the hostfile's spelling.
TEST(Filter, HostNamesIgnoreCase) {
  Pool p = {{"Worker-0", 4}, {"worker-1", 4}};
  EXPECT_EQ(str(apply_filters(p, "WORKER-0:1@Worker-1:0", "")), R"({"Worker-0": [1], "worker-1": [0]})");
  EXPECT_EQ(str(apply_filters(p, "worker-0", "")), R"({"Worker-0": [0, 1, 2, 3]})");
  EXPECT_EQ(str(apply_filters(p, "", "WORKER-1@worker-0:0,1")), R"({"Worker-0": [2, 3]})");
  // Pieces naming one host in different case are merged, as for the same spelling.
  EXPECT_EQ(str(apply_filters(p, "worker-1:3@WORKER-1:0", "")), R"({"worker-1": [0, 3]})");
  EXPECT_EQ(str(parse_node_filter("w:1@W:0", "-i")), R"({"w": [0, 1]})");
  EXPECT_NE(error_of([&] { apply_filters(p, "WORKER-1:4", ""); }).find("no slot 4 on host 'WORKER-1'"),
            std::string::npos);
  EXPECT_TRUE(same_host("Node-A.example", "node-a.EXAMPLE"));
  EXPECT_FALSE(same_host("node-a", "node-b"));
  EXPECT_FALSE(same_host("node", "node-"));
}

TEST(Filter, ZeroSlotHosts) {
  Pool p = {{"a", 0}, {"b", 2}};
  EXPECT_EQ(str(apply_filters(p, "", "")), R"({"a": [], "b": [0, 1]})");
  EXPECT_EQ(str(apply_filters(p, "", "b:0")), R"({"b": [1]})");
}

TEST(WorldInfo, EncodingAndPlacement) {
  WorldInfo w = {{"a", {1, 3}}, {"b", {0, 1, 2}}};
  std::string j = world_info_json(w);
  EXPECT_EQ(j, R"({"a": [1, 3], "b": [0, 1, 2]})");
  std::string b = base64_urlsafe_encode(j);
  EXPECT_EQ(base64_urlsafe_decode(b), j);
  EXPECT_EQ(str(parse_world_info_json(base64_urlsafe_decode(b))), j);
  EXPECT_EQ(str(parse_world_info_json(R"({"b":[0],"a":[2,1]})")), R"({"b": [0], "a": [2, 1]})");
  EXPECT_EQ(base64_urlsafe_encode("\xfb\xff"), "-_8=");
  EXPECT_EQ(base64_urlsafe_encode("a"), "YQ==");
  EXPECT_THROW(base64_urlsafe_decode("a!b="), ds::Error);
  EXPECT_THROW(parse_world_info_json("[1]"), ds::Error);
  EXPECT_THROW(parse_world_info_json(R"({"a": [-1]})"), ds::Error);
  EXPECT_EQ(world_size(w), 5);
  RankPlace p = place_rank(w, 3);
  EXPECT_EQ(p.node, 1);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_size, 3);
  EXPECT_EQ(place_rank(w, 1).local_rank, 1);
  EXPECT_THROW(place_rank(w, 5), ds::Error);
  // Uneven hosts: LOCAL_RANK is the index in the host's list (DeepSpeed's RANK mod n is wrong).
  WorldInfo uneven = {{"a", {0, 1, 2}}, {"b", {0, 1}}};
  EXPECT_EQ(place_rank(uneven, 3).local_rank, 0);
  EXPECT_EQ(place_rank(uneven, 4).local_rank, 1);
}

TEST(Resolve, HostfileBasics) {
  TempHostfile hf("worker-0 slots=4\nworker-1 slots=4\n");
  ResolveOptions o;
  o.hostfile = hf.path;
  Resolution r = resolve(o, {}, [] { return gpus(8); });
  EXPECT_EQ(str(r.world), R"({"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]})");
  EXPECT_EQ(r.master_addr, "worker-0");
  EXPECT_EQ(r.master_port, 29500);
  EXPECT_TRUE(r.multi_node);
  EXPECT_EQ(r.source, PoolSource::Hostfile);
  o.master_addr = "10.1.2.3";
  o.num_nodes = 1;
  r = resolve(o, {}, [] { return gpus(8); });
  EXPECT_EQ(str(r.world), R"({"worker-0": [0, 1, 2, 3]})");
  EXPECT_EQ(r.master_addr, "10.1.2.3");
  EXPECT_FALSE(r.multi_node);
  o.force_multi = true;
  EXPECT_TRUE(resolve(o, {}, [] { return gpus(8); }).multi_node);
  o = ResolveOptions{};
  o.hostfile = hf.path;
  o.num_nodes = 5;  // more than available: not an error
  EXPECT_EQ(resolve(o, {}, [] { return gpus(8); }).world.size(), 2u);
  o.num_nodes = 0;  // no limit
  EXPECT_EQ(resolve(o, {}, [] { return gpus(8); }).world.size(), 2u);
  o.num_nodes = -1;
  o.num_gpus = 2;
  EXPECT_EQ(str(resolve(o, {}, [] { return gpus(8); }).world), R"({"worker-0": [0, 1], "worker-1": [0, 1]})");
  o.num_gpus = 5;  // fix: more than a host's slots is an error
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(8); }); }).find("exceeds the 4 slots"), std::string::npos);
  // CUDA_VISIBLE_DEVICES is not consulted with a hostfile.
  o.num_gpus = -1;
  r = resolve(o, {{"CUDA_VISIBLE_DEVICES", "1"}}, [] { return gpus(8); });
  EXPECT_FALSE(r.unset_cuda_visible);
  EXPECT_EQ(world_size(r.world), 8);
}

TEST(Resolve, ConflictsAndErrors) {
  TempHostfile hf("worker-0 slots=4\nworker-1 slots=4\n");
  ResolveOptions o;
  o.hostfile = hf.path;
  o.include = "worker-0";
  o.num_nodes = 0;  // DeepSpeed's >= 0: an explicit 0 conflicts too
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("cannot combine"), std::string::npos);
  o.num_nodes = -1;
  o.num_gpus = 1;
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("cannot combine"), std::string::npos);
  o = ResolveOptions{};
  o.hostfile = hf.path;
  o.master_port = 70000;
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("--master_port"), std::string::npos);
  o.master_port = 29500;
  o.master_addr = "a b";
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("--master_addr 'a b'"), std::string::npos);
  o.master_addr = "fe80::1";
  EXPECT_EQ(resolve(o, {}, [] { return gpus(1); }).master_addr, "fe80::1");
  TempHostfile empty("# nothing\n");
  o = ResolveOptions{};
  o.hostfile = empty.path;
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("empty"), std::string::npos);
  TempHostfile zero("a slots=0\n");
  o.hostfile = zero.path;
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(1); }); }).find("no slots"), std::string::npos);
}

TEST(Resolve, NoHostfileSingleMachine) {
  ResolveOptions o;
  o.hostfile = "/nonexistent/hostfile";
  o.master_addr = "10.9.9.9";
  Resolution r = resolve(o, {}, [] { return gpus(4); });
  EXPECT_EQ(str(r.world), R"({"localhost": [0, 1, 2, 3]})");
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_FALSE(r.multi_node);
  EXPECT_EQ(r.source, PoolSource::Local);
  EXPECT_EQ(error_of([&] { resolve(o, {}, [] { return gpus(0); }); }).find("no local devices") == std::string::npos, false);
  o.num_nodes = 2;
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(4); }); }).find("no hostfile"), std::string::npos);
  o.num_nodes = -1;
  o.include = "localhost:1,3";
  EXPECT_EQ(str(resolve(o, {}, [] { return gpus(4); }).world), R"({"localhost": [1, 3]})");
  o.include = "worker-0";
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(4); }); }).find("not found"), std::string::npos);
  // CPU ranks: --num_gpus sets the local rank count.
  o.include.clear();
  o.num_gpus = 4;
  EXPECT_EQ(str(resolve(o, {}, [] { return cpus(1); }).world), R"({"localhost": [0, 1, 2, 3]})");
  EXPECT_NE(error_of([&] { resolve(o, {}, [] { return gpus(2); }); }).find("exceeds"), std::string::npos);
}

// A hostfile the user named must exist; only the default path may be missing.
TEST(Resolve, NamedHostfileMissing) {
  ResolveOptions o;
  o.hostfile = "/nonexistent/my-hostfile";
  o.hostfile_given = true;
  EXPECT_EQ(error_of([&] { resolve(o, {}, [] { return gpus(4); }); })
                .rfind("hostfile '/nonexistent/my-hostfile' does not exist", 0),
            0u);
  // Not even inside a Slurm allocation: the user asked for that file.
  EnvList slurm = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_TASKS_PER_NODE", "2"}};
  EXPECT_NE(error_of([&] { resolve(o, slurm, [] { return gpus(4); }); }).find("does not exist"),
            std::string::npos);
  TempHostfile hf("h slots=2\n");
  o.hostfile = hf.path;
  EXPECT_EQ(str(resolve(o, {}, [] { return gpus(4); }).world), R"({"h": [0, 1]})");
}

TEST(Resolve, CudaVisibleDevicesRule) {
  ResolveOptions o;
  o.hostfile = "/nonexistent/hostfile";
  EnvList env = {{"CUDA_VISIBLE_DEVICES", "0,2"}};
  Resolution r = resolve(o, env, [] { return gpus(4); });
  EXPECT_EQ(str(r.world), R"({"localhost": [0, 2]})");
  EXPECT_TRUE(r.unset_cuda_visible);
  // Ignored (but still removed) when filters or limits are given.
  o.num_gpus = 1;
  r = resolve(o, env, [] { return gpus(4); });
  EXPECT_EQ(str(r.world), R"({"localhost": [0]})");
  EXPECT_TRUE(r.unset_cuda_visible);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("ignoring CUDA_VISIBLE_DEVICES"), std::string::npos);
  // DeepSpeed quirk kept: --num_nodes 1 plus the derived include conflicts.
  o.num_gpus = -1;
  o.num_nodes = 1;
  EXPECT_NE(error_of([&] { resolve(o, env, [] { return gpus(4); }); }).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  o.num_nodes = -1;
  EXPECT_NE(error_of([&] { resolve(o, {{"CUDA_VISIBLE_DEVICES", "7"}}, [] { return gpus(4); }); }).find("no slot 7"),
            std::string::npos);
  EXPECT_FALSE(resolve(o, {{"CUDA_VISIBLE_DEVICES", ""}}, [] { return gpus(2); }).unset_cuda_visible);
}

TEST(Resolve, SlurmAllocation) {
  ResolveOptions o;
  o.hostfile = "/nonexistent/hostfile";
  EnvList env = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "node[01-02],gpu5"},
                 {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {"CUDA_VISIBLE_DEVICES", "0"}};
  Resolution r = resolve(o, env, [] { return gpus(8); });
  EXPECT_EQ(str(r.world), R"({"node01": [0, 1], "node02": [0, 1], "gpu5": [0]})");
  EXPECT_EQ(r.source, PoolSource::Slurm);
  EXPECT_EQ(r.master_addr, "node01");
  EXPECT_FALSE(r.unset_cuda_visible);
  EXPECT_TRUE(r.multi_node);
  env = {{"SLURM_JOB_ID", "7"}, {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_CPUS_PER_NODE", "3"}};
  EXPECT_EQ(str(resolve(o, env, [] { return gpus(8); }).world), R"({"n1": [0, 1, 2]})");
  env = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "2"}};
  EXPECT_NE(error_of([&] { resolve(o, env, [] { return gpus(8); }); }).find("gives 1 counts"), std::string::npos);
  env = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[2-1]"}, {"SLURM_TASKS_PER_NODE", "2"}};
  EXPECT_THROW(resolve(o, env, [] { return gpus(8); }), ds::Error);
  // Without SLURM_JOB_ID the node list is not an allocation.
  env = {{"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_EQ(resolve(o, env, [] { return gpus(1); }).source, PoolSource::Local);
  // A hostfile beats the allocation.
  TempHostfile hf("h slots=1\n");
  o.hostfile = hf.path;
  env = {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_TASKS_PER_NODE", "2"}};
  EXPECT_EQ(str(resolve(o, env, [] { return gpus(1); }).world), R"({"h": [0]})");
}
