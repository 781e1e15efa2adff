// Rank discovery from environment maps: every launcher family, the precedence rules, the
// errors that name variables, the MPI cross-check and the JSON form.
#include <gtest/gtest.h>

#include <string>

#include "ds/core/error.h"
#include "ds/launch/backend.h"
#include "ds/mpi/discovery.h"
#include "ds/mpi/init.h"

using ds::EnvMap;
using ds::LaunchSource;

namespace {

std::string error_of(const EnvMap& env) {
  try {
    ds::discover_environment(env);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(env, ...)                                   \
  do {                                                               \
    std::string what_ = error_of(env);                               \
    ASSERT_FALSE(what_.empty()) << "no error";                       \
    for (const char* n_ : {__VA_ARGS__}) EXPECT_NE(what_.find(n_), std::string::npos) << what_ << " lacks " << n_; \
  } while (0)

}  // namespace

TEST(Discovery, Singleton) {
  auto d = ds::discover_environment(EnvMap{});
  EXPECT_EQ(d.source, LaunchSource::Singleton);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_size, 1);
  EXPECT_EQ(d.node_rank, 0);
  EXPECT_FALSE(d.master_addr);
  EXPECT_FALSE(d.master_port);
}

TEST(Discovery, ExplicitTorchrun) {
  EnvMap env{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
             {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
             // explicit beats everything, including MPI and Slurm variables
             {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"SLURM_PROCID", "0"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::Explicit);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 8);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_size, 4);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.master_addr, "10.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
}

TEST(Discovery, ExplicitDeepSpeedLaunchNames) {
  EnvMap env{{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_SIZE", "2"},
             {"CROSS_RANK", "1"}, {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "1234"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.local_size, 2);
  EXPECT_EQ(d.node_rank, 1);
}

TEST(Discovery, PartialExplicitSetNeverWins) {
  // RANK + WORLD_SIZE without MASTER_*: DeepSpeed ignores (overwrites) a partial set.
  EnvMap env{{"RANK", "3"}, {"WORLD_SIZE", "9"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::OpenMPI);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.world_size, 2);
}

TEST(Discovery, ExplicitLocalRankMustMatchOmpi) {
  EnvMap env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  EXPECT_ERROR_HAS(env, "LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_RANK=1");
}

TEST(Discovery, AzureMLSingleNode) {
  EnvMap env{{"AZUREML_EXPERIMENT_ID", "x"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"AZ_BATCHAI_MPI_MASTER_NODE", "10.1.2.3"}, {"MASTER_PORT", "1111"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::AzureML);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.master_addr, "10.1.2.3");
  EXPECT_EQ(d.master_port, 54965);  // forced, overriding MASTER_PORT
  EXPECT_EQ(d.node_rank, 0);
}

TEST(Discovery, AzureMLMultiNode) {
  EnvMap env{{"AZUREML_EXPERIMENT_ID", "x"}, {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
             {"AZ_BATCH_MASTER_NODE", "10.9.8.7:6000"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.master_addr, "10.9.8.7");
  EXPECT_EQ(d.master_port, 6105);  // the port inside AZ_BATCH_MASTER_NODE is ignored
  env["MASTER_PORT"] = "7000";
  EXPECT_EQ(ds::discover_environment(env).master_port, 7000);
}

TEST(Discovery, AzureMLIgnoredUnderDLTS) {
  EnvMap env{{"AZUREML_EXPERIMENT_ID", "x"}, {"DLTS_JOB_ID", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  EXPECT_EQ(ds::discover_environment(env).source, LaunchSource::OpenMPI);
}

TEST(Discovery, AzureMLMissingVariables) {
  EXPECT_ERROR_HAS((EnvMap{{"AZUREML_EXPERIMENT_ID", "x"}}), "OMPI_COMM_WORLD_RANK");
  EXPECT_ERROR_HAS((EnvMap{{"AZUREML_EXPERIMENT_ID", "x"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                   "AZ_BATCH_MASTER_NODE");
}

TEST(Discovery, SageMaker) {
  EnvMap env{{"SM_TRAINING_ENV", "{}"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"MASTER_ADDR", "algo-1"}, {"MASTER_PORT", "7777"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::SageMaker);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.local_size, 2);
  EXPECT_EQ(d.master_addr, "algo-1");
  EXPECT_EQ(d.master_port, 7777);
  env.erase("MASTER_ADDR");
  EXPECT_ERROR_HAS(env, "SM_TRAINING_ENV", "MASTER_ADDR");
}

TEST(Discovery, OpenMPI) {
  EnvMap env{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_RANK", "2"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::OpenMPI);
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_size, 2);
  EXPECT_FALSE(d.node_rank);  // Open MPI does not export a node index
  EXPECT_FALSE(d.master_addr);
}

TEST(Discovery, OpenMPIInsideSbatchBeatsSlurm) {
  // mpirun inside sbatch: every rank sees SLURM_PROCID=0 and SLURM_LOCALID=0.
  EnvMap env{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"PMIX_RANK", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
             {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "node[07-08]"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::OpenMPI);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.local_rank, 3);
  EXPECT_EQ(d.node_rank, 0);  // local size == world size: one node
  EXPECT_EQ(d.master_addr, "node07");
}

TEST(Discovery, OpenMPIPmixDisagreement) {
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "0"}}),
                   "OMPI_COMM_WORLD_RANK=1", "PMIX_RANK=0");
}

TEST(Discovery, MVAPICH2) {
  EnvMap env{{"MV2_COMM_WORLD_RANK", "1"}, {"MV2_COMM_WORLD_SIZE", "3"}, {"MV2_COMM_WORLD_LOCAL_RANK", "1"},
             {"MV2_COMM_WORLD_LOCAL_SIZE", "3"}, {"SLURM_PROCID", "0"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::MVAPICH2);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.world_size, 3);
  EXPECT_EQ(d.local_size, 3);
}

TEST(Discovery, PmiHydra) {
  EnvMap env{{"PMI_RANK", "5"}, {"PMI_SIZE", "6"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "3"},
             {"SLURM_PROCID", "0"}, {"MASTER_ADDR", "hostA"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::PMI);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 6);
  EXPECT_EQ(d.local_rank, 2);
  EXPECT_EQ(d.local_size, 3);
  EXPECT_EQ(d.master_addr, "hostA");
  EXPECT_FALSE(d.master_port);
}

TEST(Discovery, PmiCrayPals) {
  EnvMap env{{"PALS_RANKID", "3"}, {"PALS_LOCAL_RANKID", "1"}, {"PALS_NODEID", "1"}, {"WORLD_SIZE", "4"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::PMI);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.node_rank, 1);
}

TEST(Discovery, PmiAgreementRules) {
  EXPECT_ERROR_HAS((EnvMap{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"PMIX_RANK", "0"}}), "PMI_RANK=1", "PMIX_RANK=0");
  EXPECT_ERROR_HAS((EnvMap{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"PALS_RANKID", "0"}}), "PMI_RANK", "PALS_RANKID");
  EXPECT_ERROR_HAS((EnvMap{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"PALS_LOCAL_RANKID", "0"}}),
                   "MPI_LOCALRANKID", "PALS_LOCAL_RANKID");
}

TEST(Discovery, PmixWithSlurm) {
  // srun --mpi=pmix: PMIX_RANK agrees with SLURM_PROCID, so the Slurm fields describe the task.
  EnvMap env{{"PMIX_RANK", "3"}, {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
             {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
             {"SLURM_STEP_NODELIST", "gpu[1-2]"}, {"SLURM_STEP_NUM_NODES", "2"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::PMIx);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_size, 2);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.master_addr, "gpu1");
}

TEST(Discovery, PmixAlone) {
  EnvMap env{{"PMIX_RANK", "2"}, {"PMIX_NAMESPACE", "prterun-x"}, {"SLURM_PROCID", "0"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::PMIx);
  EXPECT_EQ(d.rank, 2);
  EXPECT_FALSE(d.world_size);  // PMIx does not export the size
  EXPECT_FALSE(d.local_rank);
}

TEST(Discovery, SlurmSrun) {
  // rank 4 of srun -N 3 -n 5 over node[01-02,07] with task counts 2(x2),1
  EnvMap env{{"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"}, {"SLURM_NTASKS", "5"},
             {"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"},
             {"SLURM_STEP_NODELIST", "node[01-02,07]"}, {"SLURM_JOB_NODELIST", "node[01-02,07]"},
             {"SLURM_STEP_NUM_NODES", "3"}, {"SLURM_NNODES", "3"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.source, LaunchSource::Slurm);
  EXPECT_EQ(d.rank, 4);
  EXPECT_EQ(d.world_size, 5);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_size, 1);
  EXPECT_EQ(d.node_rank, 2);
  EXPECT_EQ(d.master_addr, "node01");  // first host of the expanded step node list
  EXPECT_FALSE(d.master_port);
  env["MASTER_PORT"] = "29501";
  env["MASTER_ADDR"] = "explicit-host";
  d = ds::discover_environment(env);
  EXPECT_EQ(d.master_addr, "explicit-host");
  EXPECT_EQ(d.master_port, 29501);
}

TEST(Discovery, SlurmJobNodelistFallbackAndPadding) {
  EnvMap env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "rack[1-2]-n[098-101],gpu5"},
             {"SLURM_TASKS_PER_NODE", "2"}};
  auto d = ds::discover_environment(env);
  EXPECT_EQ(d.master_addr, "rack1-n098");
  EXPECT_EQ(d.local_size, 2);
  EXPECT_EQ(d.node_rank, 0);
  EXPECT_EQ(d.world_size_var, "SLURM_NTASKS");
  env.erase("SLURM_NTASKS");
  env["SLURM_NPROCS"] = "2";
  EXPECT_EQ(ds::discover_environment(env).world_size, 2);
}

TEST(Discovery, SlurmErrors) {
  EnvMap base{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};
  auto bad = base;
  bad["SLURM_JOB_NODELIST"] = "node[4-2]";
  EXPECT_ERROR_HAS(bad, "SLURM_JOB_NODELIST", "node[4-2]");
  bad = base;
  bad["SLURM_STEP_NODELIST"] = "node[1-2]-ib";
  EXPECT_ERROR_HAS(bad, "SLURM_STEP_NODELIST");
  bad = base;
  bad["SLURM_NODEID"] = "3";
  bad["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  EXPECT_ERROR_HAS(bad, "SLURM_NODEID=3", "SLURM_STEP_TASKS_PER_NODE");
  bad = base;
  bad["SLURM_TASKS_PER_NODE"] = "2(x";
  EXPECT_ERROR_HAS(bad, "SLURM_TASKS_PER_NODE");
  bad = base;
  bad["SLURM_STEP_NODELIST"] = "n[1-3]";
  bad["SLURM_STEP_NUM_NODES"] = "2";
  EXPECT_ERROR_HAS(bad, "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES=2");
  bad = base;
  bad["SLURM_PROCID"] = "2";
  EXPECT_ERROR_HAS(bad, "SLURM_PROCID=2", "SLURM_NTASKS=2");
}

TEST(Discovery, MalformedNumbers) {
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "abc"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK", "abc");
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK", "negative");
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "1x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK");
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}), "OMPI_COMM_WORLD_RANK=4",
                   "OMPI_COMM_WORLD_SIZE=4");
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}), "OMPI_COMM_WORLD_SIZE=0");
  EXPECT_ERROR_HAS((EnvMap{{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE", "not set");
  EXPECT_ERROR_HAS((EnvMap{{"MV2_COMM_WORLD_RANK", "0"}, {"MV2_COMM_WORLD_SIZE", "2"}, {"MV2_COMM_WORLD_LOCAL_RANK", "2"},
                           {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}}),
                   "local rank");
  EXPECT_ERROR_HAS((EnvMap{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
                   "MASTER_PORT");
  EXPECT_NO_THROW(ds::discover_environment(EnvMap{{"OMPI_COMM_WORLD_RANK", " 1 "}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
}

TEST(Discovery, CheckAgainstMpi) {
  ds::EnvDiscovery d = ds::discover_environment(EnvMap{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_NO_THROW(ds::check_against_mpi(d, 1, 4));
  try {
    ds::check_against_mpi(d, 1, 2);
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_SIZE=4 but MPI_Comm_size=2"), std::string::npos) << e.what();
  }
  try {
    ds::check_against_mpi(d, 0, 4);
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK=1 but MPI_Comm_rank=0"), std::string::npos) << e.what();
  }
  // The singleton environment says nothing, so any MPI layout is fine.
  EXPECT_NO_THROW(ds::check_against_mpi(ds::discover_environment(EnvMap{}), 3, 8));
  ds::EnvDiscovery s = ds::discover_environment(EnvMap{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_THROW(ds::check_against_mpi(s, 0, 1), ds::Error);
}

TEST(Discovery, Json) {
  auto d = ds::discover_environment(EnvMap{{"PMIX_RANK", "2"}, {"MASTER_ADDR", "a\"b"}});
  EXPECT_EQ(ds::discovery_to_json(d),
            "{\"rank\":2,\"world_size\":null,\"local_rank\":null,\"local_size\":null,\"node_rank\":null,"
            "\"master_addr\":\"a\\\"b\",\"master_port\":null,\"source\":\"pmix\"}");
}

TEST(Discovery, SourceNames) {
  const char* names[] = {"explicit", "azureml", "sagemaker", "openmpi", "mvapich2", "pmi", "pmix", "slurm", "singleton"};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(ds::launch_source_name(static_cast<LaunchSource>(i)), names[i]);
}

TEST(Discovery, DeviceChoice) {
  EXPECT_EQ(ds::choose_device(3, EnvMap{}), 3);
  EXPECT_EQ(ds::choose_device(3, EnvMap{{"CUDA_VISIBLE_DEVICES", "1,3"}}), 1);
  EXPECT_EQ(ds::choose_device(1, EnvMap{{"CUDA_VISIBLE_DEVICES", "5"}}), 0);
}

// The launcher and discovery share one list of rank variables (ds/launch/backend.h): what
// every back end's ranks get is what discovery reads.
TEST(Discovery, EveryLauncherBackEndsRankVariables) {
  for (const ds::launch::Backend& b : ds::launch::backends()) {
    const ds::launch::RankVars& v = *b.rank_vars;
    EnvMap env{{v.rank, "1"}, {v.size, "2"}, {v.local_rank, "1"}};
    const auto d = ds::discover_environment(env);
    EXPECT_EQ(d.rank, 1) << b.name;
    EXPECT_EQ(d.world_size, 2) << b.name;
    EXPECT_EQ(d.local_rank, 1) << b.name;
    EXPECT_EQ(d.rank_var, v.rank) << b.name;
    EXPECT_EQ(d.world_size_var, v.size) << b.name;
  }
}
