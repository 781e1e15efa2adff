// Exec size limits checked before the engine starts: an exported variable over the kernel's
// one-string limit, another over-long argument, and the whole command over ARG_MAX.
#include <gtest/gtest.h>
#include <unistd.h>

#include "../common/temp_dir.h"
#include "ds/core/error.h"
#include "ds/launch/command.h"
#include "ds/launch/exec_limits.h"

using namespace ds::launch;

namespace {
Command command_with(EnvList exports) {
  Resolution r;
  r.world = {{"localhost", {0, 1}}};
  r.master_addr = "127.0.0.1";
  r.master_port = 29500;
  CommandOptions o;
  o.shim = "/bin/dsrun";
  o.program = "./prog";
  return build_command(r, o, exports, {});
}
}  // namespace

TEST(ExecLimits, SystemValues) {
  ExecLimits l = system_exec_limits();
  EXPECT_EQ(l.max_arg_strlen, 32u * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_GE(l.arg_max, l.max_arg_strlen);
  EXPECT_LE(l.arg_max, 6u << 20);
}

TEST(ExecLimits, OneVariableTooLong) {
  const ExecLimits l{131072, 2u << 20};
  // NAME=VALUE of 131071 bytes fits with its NUL; one byte more does not.
  EnvList fits = {{"NCCL_BIG", std::string(131071 - 9, 'x')}};
  EXPECT_EQ(error_of([&] { check_exec_size(command_with(fits), {}, l); }), "(no error)");
  EnvList over = {{"NCCL_BIG", std::string(131072 - 9, 'x')}};
  EXPECT_NE(error_of([&] { check_exec_size(command_with(over), {}, l); })
                .find("environment variable NCCL_BIG is 131072 bytes (NCCL_BIG=VALUE), over the "
                      "131071-byte limit of one exec argument"),
            std::string::npos);
  EnvList big = {{"A", "1"}, {"FOO", std::string(200000, 'x')}};
  std::string e = error_of([&] { check_exec_size(command_with(big), {}, l); });
  EXPECT_NE(e.find("environment variable FOO is 200004 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("through mpirun"), std::string::npos) << e;
}

TEST(ExecLimits, OtherArgumentTooLong) {
  const ExecLimits l{131072, 2u << 20};
  Command c = command_with({});
  c.argv.push_back(std::string(140000, 'a'));
  std::string e = error_of([&] { check_exec_size(c, {}, l); });
  EXPECT_NE(e.find("of the mpirun command ('aaaa"), std::string::npos) << e;
  EXPECT_NE(e.find("is 140000 bytes, over the 131071-byte limit"), std::string::npos) << e;
}

TEST(ExecLimits, TotalTooLarge) {
  const ExecLimits l{131072, 300000};
  EnvList exports;
  for (int i = 0; i < 3; ++i) exports.emplace_back("NCCL_V" + std::to_string(i), std::string(60000, 'v'));
  exports.emplace_back("NCCL_LARGEST", std::string(90000, 'v'));
  // Exports alone fit; with the same variables in dsrun's environment too they do not.
  EXPECT_EQ(error_of([&] { check_exec_size(command_with(exports), {}, l); }), "(no error)");
  std::string e = error_of([&] { check_exec_size(command_with(exports), exports, l); });
  EXPECT_NE(e.find("the mpirun command line and environment take "), std::string::npos) << e;
  EXPECT_NE(e.find("over this system's 300000-byte limit for one exec"), std::string::npos) << e;
  EXPECT_NE(e.find("the largest variable is NCCL_LARGEST (90013 bytes)"), std::string::npos) << e;
}
