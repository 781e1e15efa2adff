// Test program for dsrun end-to-end tests: an MPI hello that all-reduces and prints what the
// launcher gave it. Behaviour switches (environment):
//   DS_HELLO_PID_DIR=d     write d/<rank>.pid before anything else
//   DS_HELLO_FAIL_RANK=r   rank r exits with DS_HELLO_FAIL_CODE (default 3) after the
//                          all-reduce while the others block in MPI_Barrier
//   DS_HELLO_BLOCK=1       every rank blocks in pause() after the all-reduce (signal tests)
//   DS_HELLO_CPUS=1        also print "cpus rank=R allowed=<Cpus_allowed_list> omp=<OMP_NUM_THREADS>"
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

static const char* env_or(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "-";
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (const char* dir = std::getenv("DS_HELLO_PID_DIR")) {
    std::string path = std::string(dir) + "/" + std::to_string(rank) + ".pid";
    std::string tmp = path + ".tmp";
    if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
      std::rename(tmp.c_str(), path.c_str());
    }
  }
  long v = rank + 1, sum = 0;
  MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  char netns[64] = "-";
  ssize_t nl = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  netns[nl > 0 ? nl : 1] = '\0';
  std::string args;
  for (int i = 1; i < argc; ++i) args += std::string(i > 1 ? "|" : "") + argv[i];
  std::printf("hello rank=%d size=%d sum=%ld expect=%ld host=%s OMPI_COMM_WORLD_RANK=%s SLURM_STEP_ID=%s RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s "
              "LOCAL_SIZE=%s CROSS_RANK=%s CROSS_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s "
              "CUDA_VISIBLE_DEVICES=%s netns=%s args=%s\n",
              rank, size, sum, static_cast<long>(size) * (size + 1) / 2, host, env_or("OMPI_COMM_WORLD_RANK"),
              env_or("SLURM_STEP_ID"), env_or("RANK"),
              env_or("LOCAL_RANK"), env_or("WORLD_SIZE"), env_or("LOCAL_SIZE"), env_or("CROSS_RANK"),
              env_or("CROSS_SIZE"), env_or("MASTER_ADDR"), env_or("MASTER_PORT"),
              env_or("CUDA_VISIBLE_DEVICES"), netns, args.c_str());
  if (std::getenv("DS_HELLO_CPUS")) {  // the affinity the launcher gave this rank
    std::ifstream status("/proc/self/status");
    std::string line, allowed = "-";
    while (std::getline(status, line)) {
      if (line.starts_with("Cpus_allowed_list:")) allowed = line.substr(line.find_first_not_of(" \t", 18));
    }
    std::printf("cpus rank=%d allowed=%s omp=%s\n", rank, allowed.c_str(), env_or("OMP_NUM_THREADS"));
  }
  std::fflush(stdout);
  if (const char* fr = std::getenv("DS_HELLO_FAIL_RANK")) {
    if (std::atoi(fr) == rank) {
      const char* code = std::getenv("DS_HELLO_FAIL_CODE");
      std::exit(code ? std::atoi(code) : 3);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // never completes: the failing rank is gone
  }
  if (std::getenv("DS_HELLO_BLOCK")) {
    for (;;) pause();
  }
  MPI_Finalize();
  return sum == static_cast<long>(size) * (size + 1) / 2 ? 0 : 1;
}
