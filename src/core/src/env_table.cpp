// The table of every environment variable dstrain reads (see ds/core/env.h). One row per
// variable; docs/user/environment.md is checked against this table by a test, and
// `ds_report --env` prints it with the current values.
#include "ds/core/env.h"

namespace ds::env {

namespace {
constexpr Var kTable[] = {
    // ---- system: a user may set these for a run ----
    {"DS_LOG_LEVEL", Type::Choice, "info", Class::System,
     "lowest level of log line printed", "debug|info|warn|error"},
    {"DS_LOG_ALL_RANKS", Type::Bool, "0", Class::System,
     "print info and debug lines on every rank, not only rank 0"},
    {"DS_COMM_TIMEOUT", Type::Seconds, "", Class::System,
     "seconds a rank waits in one collective before the job ends naming it; overrides "
     "communication.timeout (0 = wait forever)"},
    {"DS_PYTHON", Type::String, "python3", Class::System,
     "the interpreter dsrun runs a Python user script with"},
    {"DS_ENV_FILE", Type::String, "", Class::System,
     "dsrun: an environment file exported to every rank instead of ./.deepspeed_env"},
    // ---- debug: force a plain or alternative code path ----
    {"DS_CPU_ISA", Type::Choice, "auto", Class::Debug,
     "CPU kernel set: auto (the best the CPU has), or a lower one to run its paths: avx512, avx2, "
     "neon or plain (the portable loops)", "auto|avx512|avx2|neon|plain"},
    {"DS_COMM_SHM", Type::Bool, "1", Class::Debug,
     "0 turns the shared-memory collectives off (plain MPI); wins over communication.shared_memory"},
    {"DS_COMM_PROGRESS_THREAD", Type::Bool, "1", Class::Debug,
     "0 runs non-blocking shared-memory collectives inline; wins over communication.progress_thread"},
    {"DS_COMM_RANKS_PER_NODE", Type::Int, "0", Class::Debug,
     "N > 0 makes each group of N consecutive ranks act as a node (multi-node paths on one host)",
     nullptr, 0, 1 << 20},
    {"DS_COMM_OVERSUBSCRIBED", Type::Bool, "", Class::Debug,
     "1 / 0 says whether a node's ranks outnumber its CPUs instead of detecting it"},
    {"DS_CRC32C_NO_AVX512", Type::Bool, "0", Class::Debug,
     "1 computes checkpoint CRC32C without the AVX-512 carry-less fold"},
    {"DS_CKPT_TEST_KILL_AT", Type::String, "", Class::Debug,
     "kills the process at a named point of a checkpoint save (crash-safety tests)"},
    {"DS_NN_GEMM", Type::Choice, "auto", Class::Debug,
     "fp32 GEMM back end: auto, openblas or own (the AVX-512 or AVX2 kernel of the kernel set in use)",
     "auto|openblas|own"},
    {"DS_NN_ROWS", Type::Choice, "auto", Class::Debug,
     "plain runs the softmax rows without the AVX-512 row kernels", "auto|plain"},
};
}  // namespace

std::span<const Var> table() { return kTable; }

}  // namespace ds::env
