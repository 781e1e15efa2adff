// .deepspeed_env parsing, exports, shell quoting, engine command lines and the rank shim.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../common/no_hang.h"
#include "../common/temp_dir.h"
#include "ds/core/error.h"
#include "ds/launch/command.h"
#include "ds/launch/core_list.h"
#include "ds/launch/env_file.h"
#include "ds/launch/shell.h"
#include "ds/launch/world_info.h"

using namespace ds::launch;
using V = std::vector<std::string>;

namespace {
Resolution res_of(WorldInfo w, bool multi) {
  Resolution r;
  r.world = std::move(w);
  r.master_addr = "h0";
  r.master_port = 1234;
  r.multi_node = multi;
  return r;
}
}  // namespace

TEST(EnvFile, Parse) {
  EnvList e = parse_env_file(
      "# comment\n\nNCCL_IB_DISABLE=1\n  NCCL_SOCKET_IFNAME=eth0\nA=x=y\nB= sp ace \"q\" 'q' $HOME \\n\r\n"
      "C=\n  # indented comment\nNCCL_IB_DISABLE=2\n",
      "f");
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[0], (std::pair<std::string, std::string>{"NCCL_IB_DISABLE", "2"}));  // later wins
  EXPECT_EQ(e[1].second, "eth0");
  EXPECT_EQ(e[2].second, "x=y");
  EXPECT_EQ(e[3].second, " sp ace \"q\" 'q' $HOME \\n");
  EXPECT_EQ(e[4].second, "");
  EXPECT_NE(error_of([] { parse_env_file("A=1\nnovalue\n", "envf"); }).find("envf:2: malformed"), std::string::npos);
  EXPECT_NE(error_of([] { parse_env_file("1A=1\n", "envf"); }).find("envf:1: bad variable name '1A'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_env_file("=1\n", "envf"); }).find("bad variable name"), std::string::npos);
  EXPECT_NE(error_of([] { parse_env_file("A B=1\n", "envf"); }).find("bad variable name 'A B'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_env_file(std::string("A=\0\n", 4), "envf"); }).find("NUL"), std::string::npos);
}

TEST(EnvFile, DefaultExportsAndPaths) {
  EnvList env = {{"NCCL_DEBUG", "INFO"}, {"HOME", "/root"}, {"PYTHONPATH", "/p"}, {"UCX_TLS", "rc"},
                 {"MV2_X", "1"}, {"MLFLOW_URI", "u"}, {"AZUREML_RUN_ID", "r"}, {"OTHER", "no"},
                 {"XNCCL", "no"}};
  EnvList d = default_exports(env);
  V keys;
  for (auto& [k, v] : d) keys.push_back(k);
  EXPECT_EQ(keys, (V{"NCCL_DEBUG", "PYTHONPATH", "UCX_TLS", "MV2_X", "MLFLOW_URI", "AZUREML_RUN_ID"}));
  env.emplace_back("AISC_JOB_NAME", "j");
  env.emplace_back("NCCL_IB_HCA", "mlx5");
  d = default_exports(env);
  EXPECT_EQ(env_get(d, "NCCL_IB_HCA"), nullptr);
  EXPECT_EQ(env_file_paths({{"HOME", "/h"}}, "/w"), (V{"/h/.deepspeed_env", "/w/.deepspeed_env"}));
  EXPECT_EQ(env_file_paths({{"HOME", "/h"}, {"DS_ENV_FILE", "my.env"}}, "/w"), (V{"/h/my.env", "/w/my.env"}));
  EXPECT_EQ(env_file_paths({{"DS_ENV_FILE", "/abs/e"}}, "/w"), (V{"/abs/e"}));
  EXPECT_EQ(env_file_paths({{"HOME", "/w"}}, "/w"), (V{"/w/.deepspeed_env"}));
  EnvList ex = collect_exports({{"PYTHONPATH", "/p"}, {"NCCL_A", "1"}}, {{"NCCL_A", "2"}}, "/w", true);
  EXPECT_EQ(*env_get(ex, "PYTHONPATH"), "/w:/p");
  EXPECT_EQ(*env_get(ex, "NCCL_A"), "2");
  ex = collect_exports({{"PYTHONPATH", "/p"}}, {}, "/w", false);
  EXPECT_EQ(*env_get(ex, "PYTHONPATH"), "/p");
}

// DS_ENV_FILE may name anything: a FIFO is refused at once (never waited on), a device or
// directory is named as what it is, a huge file is refused by size; a missing one is skipped.
TEST(EnvFile, OnlyRegularFilesAreRead) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "ds_env_file.XXXXXX").string();
  const fs::path d = ::mkdtemp(tmpl.data());
  const std::string fifo = (d / "fifo.env").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = error_without_hang(fifo, [&] { read_env_files({fifo}); });
  EXPECT_NE(e.find("environment file " + fifo + " is a FIFO, not a regular file"), std::string::npos) << e;
  e = error_of([] { read_env_files({"/dev/zero"}); });
  EXPECT_NE(e.find("environment file /dev/zero is a character device, not a regular file"), std::string::npos) << e;
  e = error_of([&] { read_env_files({d.string()}); });
  EXPECT_NE(e.find("environment file " + d.string() + " is a directory, not a regular file"), std::string::npos) << e;
  const std::string big = (d / "big.env").string();
  std::ofstream(big) << "A=1\n";
  fs::resize_file(big, (std::uint64_t(4) << 20) + 1);
  e = error_of([&] { read_env_files({big}); });
  EXPECT_NE(e.find("environment file " + big + " is 4194305 bytes; the limit is 4194304 bytes (4 MiB)"), std::string::npos) << e;
  const std::string good = (d / "good.env").string();
  std::ofstream(good) << "NCCL_X=1\n";
  EnvList got = read_env_files({(d / "missing.env").string(), good});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, "1");
  fs::remove_all(d);
}

// DS_ENV_FILE named explicitly: a file found in neither place is an error naming both paths
// (a typo used to be skipped in silence); a file that sets nothing is a warning. The default
// .deepspeed_env stays optional and quiet.
TEST(EnvFile, ANamedFileMustExistAndSetSomething) {
  TempDir d("ds_env_named");
  const std::string home = (d.path / "home").string(), work = (d.path / "work").string();
  std::filesystem::create_directories(home);
  std::filesystem::create_directories(work);
  EXPECT_FALSE(env_file_named({{"DS_ENV_FILE", ""}}));
  EXPECT_FALSE(env_file_named({{"HOME", home}}));
  const EnvList named = {{"HOME", home}, {"DS_ENV_FILE", "custom.env"}};
  ASSERT_TRUE(env_file_named(named));
  const V paths = env_file_paths(named, work);
  EXPECT_HAS(error_of([&] { read_env_files(paths, true); }),
             "DS_ENV_FILE: environment file " + home + "/custom.env or " + work + "/custom.env does not exist");
  V warnings;
  EXPECT_TRUE(read_env_files(paths, false, &warnings).empty());  // not named: optional
  EXPECT_TRUE(warnings.empty());

  std::ofstream(work + "/custom.env");  // empty
  EXPECT_TRUE(read_env_files(paths, true, &warnings).empty());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], "environment file " + work + "/custom.env sets no variable (it is empty)");
  std::ofstream(home + "/custom.env") << "# only a comment\n\n";
  warnings.clear();
  read_env_files(paths, true, &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_HAS(warnings[0], home + "/custom.env sets no variable (only blank and comment lines)");
  std::ofstream(work + "/custom.env") << "NCCL_X=1\n";
  warnings.clear();
  EXPECT_EQ(read_env_files(paths, true, &warnings).size(), 1u);
  EXPECT_EQ(warnings.size(), 1u);  // the home file still sets nothing
}

TEST(Shell, QuoteAndSplit) {
  EXPECT_EQ(shell_quote("abc/d-e.f:1,2=3@%+"), "abc/d-e.f:1,2=3@%+");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's $x"), "'it'\"'\"'s $x'");
  EXPECT_EQ(shell_join({"a", "b c"}), "a 'b c'");
  EXPECT_EQ(shell_split("--mca btl_tcp_if_include eth1 -x 'A=b c' \"d\\\"e\" f\\ g"),
            (V{"--mca", "btl_tcp_if_include", "eth1", "-x", "A=b c", "d\"e", "f g"}));
  EXPECT_TRUE(shell_split("   ").empty());
  EXPECT_EQ(shell_split("''"), (V{""}));
  EXPECT_THROW(shell_split("'open"), ds::Error);
  EXPECT_THROW(shell_split("\"open"), ds::Error);
  for (std::string s : {"plain", "a b", "it's", "$HOME \"q\"", "", "back\\slash"}) {
    EXPECT_EQ(shell_split(shell_quote(s)), (V{s})) << s;
  }
}

TEST(Command, OpenMpiLocal) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "./prog";
  o.program_args = {"--hostfile", "x", "a b"};
  Command c = build_command(res_of({{"localhost", {0, 1}}}, false), o, {{"NCCL_X", "a b"}}, {});
  std::string wi = base64_urlsafe_encode(R"({"localhost": [0, 1]})");
  EXPECT_EQ(c.argv, (V{"mpirun", "-np", "2", "--host", "localhost:2", "--map-by", "slot", "--bind-to",
                       "none", "-x", "NCCL_X=a b", "/bin/dsrun", "--rank_shim", "--world_info=" + wi,
                       "--master_addr=h0", "--master_port=1234", "--", "./prog", "--hostfile", "x",
                       "a b"}));
  o.as_root = true;
  o.no_local_rank = true;
  c = build_command(res_of({{"w0", {0, 1}}}, false), o, {}, {});
  EXPECT_EQ(c.argv[1], "--allow-run-as-root");
  EXPECT_EQ(c.argv[5], "localhost:2");  // one host, no --force_multi: this machine
  EXPECT_NE(std::find(c.argv.begin(), c.argv.end(), "--no_local_rank"), c.argv.end());
}

// dsrun adds --local_rank=N itself: the program's own one would override it (argparse keeps
// the last), so it is refused unless --no_local_rank; dsrun's own flags are not looked at.
TEST(Command, ProgramLocalRankRefused) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "./prog";
  Resolution r = res_of({{"localhost", {0, 1}}}, false);
  for (const char* bad : {"--local_rank", "--local_rank=0", "--local_rank="}) {
    o.program_args = {"x", bad, "1"};
    std::string e = error_of([&] { build_command(r, o, {}, {}); });
    EXPECT_NE(e.find(std::string("the program's arguments contain ") + bad + " (argument 2 after the program); "
                     "dsrun adds --local_rank=N to each rank itself (remove it, or pass --no_local_rank"),
              std::string::npos)
        << bad << ": " << e;
  }
  o.program_args = {"--local_rank_x=1", "--local-rank", "local_rank", "-local_rank"};  // not the flag
  EXPECT_EQ(error_of([&] { build_command(r, o, {}, {}); }), "(no error)");
  o.program_args = {"--local_rank=3"};
  o.no_local_rank = true;  // the program's own flag is then the only one
  Command c = build_command(r, o, {}, {});
  EXPECT_EQ(c.argv.back(), "--local_rank=3");
}

TEST(Command, OpenMpiMulti) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "p";
  Resolution r = res_of({{"a", {0, 1}}, {"z", {}}, {"b", {0}}}, true);
  Command c = build_command(r, o, {}, {});
  V want_prefix = {"mpirun", "-np", "3", "--host", "a:2,b:1", "--map-by", "slot", "--bind-to", "none",
                   "--mca", "btl_tcp_if_include", "eth0", "--mca", "plm_rsh_args",
                   "-o BatchMode=yes -o ConnectTimeout=10", "-x", "UCX_TLS=tcp", "/bin/dsrun"};
  EXPECT_EQ(V(c.argv.begin(), c.argv.begin() + static_cast<long>(want_prefix.size())), want_prefix);
  // User-chosen interfaces suppress eth0 (launcher_args or environment).
  o.launcher_args = "-mca btl_tcp_if_include eth1";
  c = build_command(r, o, {{"UCX_TLS", "rc"}}, {});
  EXPECT_EQ(std::count(c.argv.begin(), c.argv.end(), "eth0"), 0);
  EXPECT_NE(std::find(c.argv.begin(), c.argv.end(), "eth1"), c.argv.end());
  EXPECT_EQ(std::count(c.argv.begin(), c.argv.end(), "UCX_TLS=tcp"), 0);
  o.launcher_args.clear();
  c = build_command(r, o, {}, {{"OMPI_MCA_btl_tcp_if_include", "10.0.0.0/8"}, {"OMPI_MCA_plm_rsh_args", "x"}});
  EXPECT_EQ(std::count(c.argv.begin(), c.argv.end(), "eth0"), 0);
  EXPECT_EQ(std::count(c.argv.begin(), c.argv.end(), "plm_rsh_args"), 0);
}

TEST(Command, MpichAndSlurm) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "p";
  o.launcher = Launcher::MPICH;
  Resolution r = res_of({{"a", {0, 1}}, {"b", {0, 1}}}, true);
  Command c = build_command(r, o, {{"K", "v w"}}, {});
  EXPECT_EQ(V(c.argv.begin(), c.argv.begin() + 10),
            (V{"mpiexec", "-n", "4", "-ppn", "2", "-hosts", "a,b", "-genv", "K", "v w"}));
  Resolution uneven = res_of({{"a", {0, 1}}, {"b", {0}}}, true);
  EXPECT_NE(error_of([&] { build_command(uneven, o, {}, {}); }).find("same number of slots"), std::string::npos);
  o.launcher = Launcher::Slurm;
  c = build_command(r, o, {{"K", "v,w"}}, {});
  EXPECT_EQ(V(c.argv.begin(), c.argv.begin() + 9),
            (V{"env", "K=v,w", "srun", "-n", "4", "-N", "2", "--ntasks-per-node=2", "--nodelist=a,b"}));
  EXPECT_NE(error_of([&] { build_command(uneven, o, {}, {}); }).find("same number of slots"), std::string::npos);
  EXPECT_EQ(parse_launcher("OpenMPI"), Launcher::OpenMPI);
  EXPECT_EQ(parse_launcher("SLURM"), Launcher::Slurm);
  EXPECT_NE(error_of([] { parse_launcher("pdsh"); }).find("--launcher pdsh is not supported"), std::string::npos);
  EXPECT_NE(error_of([] { parse_launcher("mpi"); }).find("unknown --launcher 'mpi' (openmpi, mpich, impi, mvapich or slurm)"),
            std::string::npos);
}

// Intel MPI and MVAPICH2 (Hydra forms): -genv NAME VALUE, equal slots, DeepSpeed's defaults.
TEST(Command, ImpiAndMvapich) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "p";
  o.launcher = Launcher::IMPI;
  EXPECT_EQ(parse_launcher("IMPI"), Launcher::IMPI);
  EXPECT_EQ(parse_launcher("mvapich"), Launcher::MVAPICH);
  Resolution r = res_of({{"a", {0, 1}}, {"b", {0, 1}}}, true);
  Command c = build_command(r, o, {{"K", "v w"}}, {});
  EXPECT_EQ(V(c.argv.begin(), c.argv.begin() + 14),
            (V{"mpirun", "-n", "4", "-ppn", "2", "-hosts", "a,b", "-genv", "K", "v w", "-genv", "I_MPI_PIN", "0",
               "/bin/dsrun"}));
  Resolution uneven = res_of({{"a", {0, 1}}, {"b", {0}}}, true);
  EXPECT_NE(error_of([&] { build_command(uneven, o, {}, {}); }).find("--launcher impi requires the same number of slots"),
            std::string::npos);
  o.launcher = Launcher::MVAPICH;
  c = build_command(r, o, {{"MV2_USE_CUDA", "0"}}, {});
  EXPECT_EQ(V(c.argv.begin(), c.argv.begin() + 7), (V{"mpirun", "-n", "4", "-ppn", "2", "-hosts", "a,b"}));
  std::string joined = shell_join(c.argv);
  EXPECT_NE(joined.find("-genv MV2_ENABLE_AFFINITY 0"), std::string::npos) << joined;
  EXPECT_NE(joined.find("-genv MV2_USE_CUDA 0"), std::string::npos) << joined;  // the user's value wins
  EXPECT_EQ(joined.find("MV2_USE_CUDA 1"), std::string::npos) << joined;
  EXPECT_NE(error_of([&] { build_command(uneven, o, {}, {}); }).find("--launcher mvapich requires"), std::string::npos);
}

// --ssh_port joins Open MPI's ssh arguments: the default, the user's --mca value, or the env's.
TEST(Command, SshPort) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "p";
  o.ssh_port = 2222;
  Resolution r = res_of({{"a", {0}}, {"b", {0}}}, true);
  auto value_after = [](const V& a, const std::string& key) {
    auto it = std::find(a.begin(), a.end(), key);
    return it == a.end() || it + 1 == a.end() ? std::string("<none>") : *(it + 1);
  };
  EXPECT_EQ(value_after(build_command(r, o, {}, {}).argv, "plm_rsh_args"),
            "-o BatchMode=yes -o ConnectTimeout=10 -p 2222");
  o.launcher_args = "-mca plm_rsh_args '-i key'";
  V a = build_command(r, o, {}, {}).argv;
  EXPECT_EQ(value_after(a, "plm_rsh_args"), "-i key -p 2222");
  EXPECT_EQ(std::count(a.begin(), a.end(), "plm_rsh_args"), 1);
  o.launcher_args = "";
  EXPECT_EQ(value_after(build_command(r, o, {}, {{"OMPI_MCA_plm_rsh_args", "-o X=1"}}).argv, "plm_rsh_args"),
            "-o X=1 -p 2222");
  o.ssh_port = 0;  // without it the environment's value is left to mpirun
  EXPECT_EQ(value_after(build_command(r, o, {}, {{"OMPI_MCA_plm_rsh_args", "-o X=1"}}).argv, "plm_rsh_args"),
            "<none>");
  o.ssh_port = 22;
  o.launcher = Launcher::MPICH;
  EXPECT_NE(error_of([&] { build_command(r, o, {}, {}); }).find("--ssh_port works with --launcher openmpi only (mpich"),
            std::string::npos);
  o.launcher = Launcher::Slurm;
  EXPECT_NE(error_of([&] { build_command(r, o, {}, {}); }).find("srun starts ranks without ssh"), std::string::npos);
}

// --module / --no_python / per-rank log / binding reach the rank shim; the contradiction is refused.
TEST(Command, ShimFlags) {
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "pkg.train";
  o.module = true;
  o.rank_log_prefix = "/logs/20260101000000_rank";
  o.bind_cores = true;
  o.core_list = "0,2-4";
  Resolution r = res_of({{"a", {0, 1}}}, false);
  V a = build_command(r, o, {}, {}).argv;
  V tail(std::find(a.begin(), a.end(), "--master_port=1234") + 1, a.end());
  EXPECT_EQ(tail, (V{"--module", "--rank_log=/logs/20260101000000_rank", "--bind_cores=0,2-4", "--", "pkg.train"}));
  o.no_python = true;
  EXPECT_NE(error_of([&] { build_command(r, o, {}, {}); }).find("--module and --no_python cannot be used together"),
            std::string::npos);
  o.module = false;
  o.bind_cores = false;
  o.rank_log_prefix.clear();
  a = build_command(r, o, {}, {}).argv;
  EXPECT_EQ(V(a.end() - 3, a.end()), (V{"--no_python", "--", "pkg.train"}));
  o.launcher = Launcher::Slurm;  // srun's own binding would narrow the shared-out mask
  o.bind_cores = true;
  a = build_command(res_of({{"a", {0, 1}}}, true), o, {}, {}).argv;
  EXPECT_NE(std::find(a.begin(), a.end(), "--cpu-bind=none"), a.end());
}

// DeepSpeed's parse_range_list grammar and its examples.
TEST(CoreList, Parse) {
  EXPECT_EQ(parse_core_list("0,2-4,6,8-9"), (std::vector<int>{0, 2, 3, 4, 6, 8, 9}));
  EXPECT_EQ(parse_core_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_core_list("3-3"), (std::vector<int>{3}));
  EXPECT_EQ(format_core_list({0, 2, 3, 4, 6, 8, 9}), "0,2-4,6,8-9");
  EXPECT_NE(error_of([] { parse_core_list("0,2-6,5-9"); }).find("'5-9' overlaps or comes before"), std::string::npos);
  EXPECT_NE(error_of([] { parse_core_list("8,2-6"); }).find("'2-6' overlaps"), std::string::npos);
  EXPECT_NE(error_of([] { parse_core_list("1,6-2"); }).find("range '6-2' runs backwards"), std::string::npos);
  for (const char* bad : {"", "0,", "a", "0, 1", "-1", "1-", "0x1", "2--3", "99999"}) {
    EXPECT_THROW(parse_core_list(bad), ds::Error) << bad;
  }
  EXPECT_NE(error_of([] { parse_core_list("0,x"); }).find("--bind_core_list '0,x': 'x' is not a core number"),
            std::string::npos);
}

// Each local rank gets a contiguous equal share (DeepSpeed: len // local ranks, rest unused).
TEST(CoreList, ShareForRank) {
  std::vector<int> c = {0, 2, 3, 4, 6};
  EXPECT_EQ(cores_for_rank(c, 0, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(cores_for_rank(c, 1, 2), (std::vector<int>{3, 4}));
  EXPECT_EQ(cores_for_rank(c, 4, 5), (std::vector<int>{6}));
  EXPECT_NE(error_of([&] { cores_for_rank(c, 0, 6); }).find("5 core(s) (0,2-4,6) for 6 local ranks"),
            std::string::npos);
}

TEST(Shim, RankEnvFromEngines) {
  WorldInfo w = {{"a", {1, 3}}, {"b", {0, 1, 2}}};
  RankEnv r = compute_rank_env(w, {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "5"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"}});
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.world_size, 5);
  EXPECT_EQ(r.local_size, 3);
  EXPECT_EQ(r.cross_rank, 1);
  EXPECT_EQ(r.cross_size, 2);
  EXPECT_EQ(r.cuda_visible_devices, "0,1,2");
  r = compute_rank_env(w, {{"PMI_RANK", "1"}, {"PMI_SIZE", "5"}});
  EXPECT_EQ(r.cuda_visible_devices, "1,3");
  EXPECT_EQ(r.local_rank, 1);
  // MVAPICH2 (mpirun_rsh sets only MV2_*; it beats PMI_RANK, as the launcher spec recommends).
  r = compute_rank_env(w, {{"MV2_COMM_WORLD_RANK", "4"}, {"MV2_COMM_WORLD_SIZE", "5"},
                           {"MV2_COMM_WORLD_LOCAL_RANK", "2"}, {"PMI_RANK", "0"}});
  EXPECT_EQ(r.rank, 4);
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_NE(error_of([&] { compute_rank_env(w, {{"MV2_COMM_WORLD_RANK", "1"}, {"MV2_COMM_WORLD_LOCAL_RANK", "0"}}); })
                .find("host-major"), std::string::npos);
  r = compute_rank_env(w, {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(r.cross_rank, 1);
  r = compute_rank_env(w, {{"PMIX_RANK", "4"}, {"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "5"}});
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_NE(error_of([&] { compute_rank_env(w, {}); }).find("no rank"), std::string::npos);
  EXPECT_NE(error_of([&] { compute_rank_env(w, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}); })
                .find("started 4 ranks"), std::string::npos);
  EXPECT_NE(error_of([&] { compute_rank_env(w, {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}); })
                .find("host-major"), std::string::npos);
  EXPECT_NE(error_of([&] { compute_rank_env(w, {{"OMPI_COMM_WORLD_RANK", "x"}}); }).find("not an integer"),
            std::string::npos);
  EXPECT_THROW(compute_rank_env(w, {{"OMPI_COMM_WORLD_RANK", "9"}}), ds::Error);
}

TEST(Shim, ProgramArgv) {
  EXPECT_EQ(program_argv("./t", {"a", "b"}, 2, false, "py"), (V{"./t", "--local_rank=2", "a", "b"}));
  EXPECT_EQ(program_argv("./t", {"a"}, 2, true, "py"), (V{"./t", "a"}));
  EXPECT_EQ(program_argv("train.py", {"--x"}, 1, false, "py"), (V{"py", "-u", "train.py", "--local_rank=1", "--x"}));
  EXPECT_EQ(program_argv("/usr/bin/python3", {"-u", "s.py", "--x"}, 0, false, "py"),
            (V{"/usr/bin/python3", "-u", "s.py", "--local_rank=0", "--x"}));
  EXPECT_EQ(program_argv("python3", {"-m", "pkg.mod", "a"}, 0, false, "py"),
            (V{"python3", "-m", "pkg.mod", "--local_rank=0", "a"}));
  EXPECT_EQ(program_argv("python3", {"-W", "ignore", "-c", "code"}, 3, false, "py"),
            (V{"python3", "-W", "ignore", "-c", "code", "--local_rank=3"}));
  EXPECT_EQ(program_argv("python3", {}, 0, false, "py"), (V{"python3", "--local_rank=0"}));
}

// --module: `python -u -m MODULE`; --no_python: the program itself, even a .py file.
TEST(Shim, ProgramArgvModes) {
  EXPECT_EQ(program_argv("pkg.train", {"--x"}, 1, false, "py", ProgramMode::Module),
            (V{"py", "-u", "-m", "pkg.train", "--local_rank=1", "--x"}));
  EXPECT_EQ(program_argv("pkg.train", {}, 1, true, "py", ProgramMode::Module), (V{"py", "-u", "-m", "pkg.train"}));
  EXPECT_EQ(program_argv("./run.py", {"--x"}, 2, false, "py", ProgramMode::NoPython),
            (V{"./run.py", "--local_rank=2", "--x"}));
  EXPECT_EQ(program_argv("python3", {"s.py", "a"}, 0, false, "py", ProgramMode::NoPython),
            (V{"python3", "s.py", "--local_rank=0", "a"}));
}
