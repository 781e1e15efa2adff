// The back-end table: every --launcher value has one row with a builder, rank variables and an
// install check; the install check's errors with stand-in PATH lookups and tool output.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "../common/temp_dir.h"
#include "ds/launch/backend.h"
#include "ds/launch/command.h"

using namespace ds::launch;

namespace {
using Names = std::set<std::string>;
auto in(Names names) {
  return [names](const std::string& n) { return names.count(n) > 0; };
}
auto prints(std::string text) {
  return [text](const std::vector<std::string>&) { return text; };
}
}  // namespace

TEST(LaunchBackend, EveryRowIsComplete) {
  std::set<std::string> names;
  for (const Backend& b : backends()) {
    EXPECT_TRUE(names.insert(b.name).second) << b.name << " twice";
    EXPECT_NE(b.build, nullptr) << b.name;
    ASSERT_NE(b.rank_vars, nullptr) << b.name;
    EXPECT_NE(b.check.tool, nullptr) << b.name;
    EXPECT_EQ(&backend(b.id), &b);
    EXPECT_EQ(parse_launcher(b.name), b.id);
    EXPECT_STREQ(launcher_name(b.id), b.name);
    // The rank variables a back end sets are among those the rank shim reads.
    bool found = false;
    for (const RankVars& v : rank_sources()) found = found || &v == b.rank_vars;
    EXPECT_TRUE(found) << b.name;
  }
  EXPECT_EQ(launcher_choices(), "openmpi, mpich, impi, mvapich or slurm");
  EXPECT_STREQ(backend(Launcher::MVAPICH).rank_vars->rank, "MV2_COMM_WORLD_RANK");
  EXPECT_STREQ(backend(Launcher::Slurm).rank_vars->local_rank, "SLURM_LOCALID");
  EXPECT_FALSE(backend(Launcher::Slurm).uses_ssh);
  EXPECT_EQ(backend(Launcher::OpenMPI).no_ssh_port, nullptr);
}

TEST(LaunchBackend, InstallCheck) {
  const Backend& ompi = backend(Launcher::OpenMPI);
  EXPECT_HAS(error_of([&] { check_installed(ompi, in({}), prints("")); }),
             "launcher 'openmpi' not installed (no mpirun in PATH)");
  EXPECT_HAS(error_of([&] { check_installed(ompi, in({"mpirun"}), prints("")); }),
             "launcher 'openmpi' not installed (mpirun is not Open MPI's)");
  EXPECT_EQ(error_of([&] { check_installed(ompi, in({"mpirun", "ompi_info"}), prints("")); }), "(no error)");

  const Backend& impi = backend(Launcher::IMPI);
  EXPECT_HAS(error_of([&] { check_installed(impi, in({"mpirun"}), prints("mpirun (Open MPI) 4.1.4")); }),
             "launcher 'impi' not installed (the mpirun in PATH is not Intel MPI's)");
  std::vector<std::string> ran;
  EXPECT_EQ(error_of([&] {
              check_installed(impi, in({"mpirun"}), [&](const std::vector<std::string>& argv) {
                ran = argv;
                return std::string("Intel(R) MPI Library for Linux* OS, Version 2021.10");
              });
            }),
            "(no error)");
  EXPECT_EQ(ran, (std::vector<std::string>{"mpirun", "--version"}));

  EXPECT_HAS(error_of([&] { check_installed(backend(Launcher::MPICH), in({"mpirun"}), prints("")); }),
             "launcher 'mpich' not installed (no mpichversion in PATH)");
  EXPECT_HAS(error_of([&] { check_installed(backend(Launcher::MVAPICH), in({"mpirun"}), prints("")); }),
             "launcher 'mvapich' not installed (no mpiname in PATH)");
  EXPECT_EQ(error_of([&] { check_installed(backend(Launcher::Slurm), in({"srun"}), prints("")); }), "(no error)");
}
