// ds_report: what this build and this machine offer, and who this rank is.
//   ds_report [--json] [--no_mpi]
//   ds_report --env [--json]: every registered environment variable (ds/core/env.h) with its
//   class, type, default and current value; the JSON form is {"environment": [{name, class,
//   type, accepted, default, value, help}]} (default / value null when none / unset).
// The `distributed` object comes from the environment alone (no MPI_Init). Unless --no_mpi,
// MPI is then initialized in a child process (so a failing MPI_Init cannot take the report
// down) to report the thread level and MPI's own rank and size, checked against the
// environment. --json prints one JSON object whose keys are a contract:
// version, compiler, mpi, hdf5, cuda, nccl, torch (the libtorch version the PyTorch adapter was
// built with, or null), cpu {features, threads, isa, isa_reason}, distributed {rank,
// world_size, local_rank, local_size, node_rank, master_addr, master_port, source}.
#include <hdf5.h>
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_usage.h"
#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/discovery.h"

using nlohmann::json;

namespace {

std::string compiler() {
#if defined(__clang__)
  return "Clang " + std::string(__clang_version__);
#elif defined(__GNUC__)
  return "GNU " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." + std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string first_line(const std::string& s) {
  auto p = s.find_first_of("\r\n");
  std::string l = p == std::string::npos ? s : s.substr(0, p);
  while (!l.empty() && (l.back() == ',' || l.back() == ' ')) l.pop_back();
  return l;
}

json opt(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

// MPI_Init_thread in a child process: thread level, MPI rank / size, the environment check.
json probe_mpi(const ds::EnvDiscovery* env) {
  int fds[2];
  if (pipe(fds) != 0) return json{{"error", "pipe() failed"}};
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return json{{"error", "fork() failed"}};
  if (pid == 0) {
    close(fds[0]);
    alarm(60);  // a wedged MPI start must not hang the report
    json out;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      out["error"] = "MPI_Init_thread failed";
    } else {
      int rank = 0, size = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      const char* levels[] = {"single", "funneled", "serialized", "multiple"};
      out["thread_level"] = provided >= 0 && provided <= 3 ? levels[provided] : "unknown";
      out["rank"] = rank;
      out["size"] = size;
      if (env) {
        try {
          ds::check_against_mpi(*env, rank, size);
          out["environment_check"] = "ok";
        } catch (const std::exception& e) {
          out["environment_check"] = e.what();
        }
      }
      MPI_Finalize();
    }
    std::string s = out.dump();
    (void)!write(fds[1], s.data(), s.size());
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string buf;
  char tmp[4096];
  ssize_t n;
  while ((n = read(fds[0], tmp, sizeof tmp)) > 0) buf.append(tmp, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!buf.empty()) {
    try {
      return json::parse(buf);
    } catch (const std::exception&) {
    }
  }
  std::ostringstream why;
  if (WIFSIGNALED(status)) why << "MPI start-up died with signal " << WTERMSIG(status);
  else why << "MPI start-up failed with exit code " << WEXITSTATUS(status);
  return json{{"error", why.str()}};
}

json build_report(bool use_mpi) {
  json r;
  r["version"] = DS_VERSION;
  r["compiler"] = compiler();

  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(lib, &len);  // allowed before MPI_Init (MPI-3)
  MPI_Get_version(&major, &minor);
  json mpi;
  mpi["library"] = first_line(lib);
  mpi["standard"] = std::to_string(major) + "." + std::to_string(minor);

  unsigned hmaj = 0, hmin = 0, hrel = 0;
  H5get_libversion(&hmaj, &hmin, &hrel);
  r["hdf5"] = std::to_string(hmaj) + "." + std::to_string(hmin) + "." + std::to_string(hrel);

  const ds::BackendInfo b = ds::backend_info();
  if (b.nccl_compiled) {
    r["cuda"] = json{{"runtime", opt(b.cuda_runtime)}, {"driver", opt(b.cuda_driver)}, {"devices", b.gpu_count},
                     {"error", b.gpu_count > 0 ? json(nullptr) : json(b.gpu_error)}};
  } else {
    r["cuda"] = nullptr;
  }
  r["nccl"] = opt(b.nccl);
  // Set by CMake (cmake/DsTorch.cmake): empty when this build has no PyTorch adapter.
  const std::string torch_version = DS_TORCH_VERSION;
  r["torch"] = torch_version.empty() ? json(nullptr) : json(torch_version);
  r["cpu"] = json{{"features", ds::cpu_features_string()}, {"threads", ds::cpu_threads()},
                  {"isa", ds::isa_name(ds::cpu_isa())}, {"isa_reason", ds::cpu_isa_reason()}};

  std::optional<ds::EnvDiscovery> env;
  try {
    env = ds::discover_environment();
    r["distributed"] = json::parse(ds::discovery_to_json(*env));
  } catch (const std::exception& e) {
    r["distributed"] = json{{"rank", nullptr}, {"world_size", nullptr}, {"local_rank", nullptr}, {"local_size", nullptr},
                            {"node_rank", nullptr}, {"master_addr", nullptr}, {"master_port", nullptr},
                            {"source", nullptr}, {"error", e.what()}};
  }
  if (use_mpi) mpi.update(probe_mpi(env ? &*env : nullptr));
  r["mpi"] = mpi;
  return r;
}

json env_report() {
  json vars = json::array();
  for (const ds::env::Var& v : ds::env::table()) {
    const auto value = ds::env::raw(v.name);
    vars.push_back(json{{"name", v.name},
                        {"class", ds::env::class_name(v.cls)},
                        {"type", ds::env::type_name(v.type)},
                        {"accepted", ds::env::accepted(v)},
                        {"default", *v.default_value ? json(v.default_value) : json(nullptr)},
                        {"value", value ? json(*value) : json(nullptr)},
                        {"help", v.help}});
  }
  return json{{"environment", vars}};
}

// One block per variable: name, class, type and accepted values, default, value; the help below.
void print_env(const json& r) {
  std::cout << "--------------------------------------------------\n"
            << "environment variables (docs/user/environment.md)\n"
            << "--------------------------------------------------\n";
  for (const json& v : r["environment"]) {
    const std::string def = v["default"].is_null() ? "(none)" : v["default"].get<std::string>();
    const std::string val = v["value"].is_null() ? "unset" : v["value"].get<std::string>();
    std::cout << v["name"].get<std::string>() << "  [" << v["class"].get<std::string>() << ", "
              << v["type"].get<std::string>() << ": " << v["accepted"].get<std::string>() << "]  default "
              << def << "  value " << val << "\n    " << v["help"].get<std::string>() << "\n";
  }
}

std::string show(const json& v) {
  if (v.is_null()) return "(none)";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

void print_human(const json& r) {
  auto line = [](const std::string& k, const std::string& v) {
    std::string dots(k.size() < 24 ? 24 - k.size() : 1, '.');
    std::cout << k << " " << dots << " " << v << "\n";
  };
  std::cout << "--------------------------------------------------\n"
            << "dstrain environment report\n"
            << "--------------------------------------------------\n";
  line("dstrain version", show(r["version"]));
  line("compiler", show(r["compiler"]));
  line("MPI library", show(r["mpi"]["library"]));
  line("MPI standard", show(r["mpi"]["standard"]));
  if (r["mpi"].contains("thread_level")) line("MPI thread level", show(r["mpi"]["thread_level"]));
  if (r["mpi"].contains("size")) line("MPI rank / size", show(r["mpi"]["rank"]) + " / " + show(r["mpi"]["size"]));
  if (r["mpi"].contains("environment_check")) line("MPI vs environment", show(r["mpi"]["environment_check"]));
  if (r["mpi"].contains("error")) line("MPI start-up", show(r["mpi"]["error"]));
  line("HDF5", show(r["hdf5"]));
  if (r["cuda"].is_null()) {
    line("CUDA", "not compiled in");
  } else {
    line("CUDA runtime", show(r["cuda"]["runtime"]));
    line("CUDA devices", show(r["cuda"]["devices"]) + (r["cuda"]["error"].is_null() ? "" : " (" + show(r["cuda"]["error"]) + ")"));
  }
  line("NCCL", show(r["nccl"]));
  line("libtorch", r["torch"].is_null() ? std::string("not compiled in (DS_WITH_TORCH)")
                                        : show(r["torch"]) + " (train --model torchscript:PATH)");
  line("CPU features", show(r["cpu"]["features"]));
  line("CPU kernels", r["cpu"]["isa_reason"].get<std::string>());
  line("CPU threads", show(r["cpu"]["threads"]));
  const json& d = r["distributed"];
  std::cout << "--------------------------------------------------\n"
            << "distributed (from the environment)\n"
            << "--------------------------------------------------\n";
  for (const char* k : {"source", "rank", "world_size", "local_rank", "local_size", "node_rank", "master_addr", "master_port", "error"})
    if (d.contains(k)) line(k, show(d[k]));
}

}  // namespace

int main(int argc, char** argv) {
  ds::log::set_tool("ds_report");  // diagnostics on stderr, no rank tag
  try {
    CLI::App app{"dstrain environment report"};
    bool as_json = false, no_mpi = false, env_only = false;
    app.add_flag("--json", as_json, "print one JSON object");
    app.add_flag("--no_mpi", no_mpi, "do not start MPI (versions and the environment only)");
    app.add_flag("--env", env_only,
                 "print every environment variable dstrain reads: class, type, default, current value, help");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return ds::tools::usage_exit(app, e, "ds_report");
    }
    ds::env::check_all();  // a bad DS_* value: one error line before any work
    if (env_only) {
      const json r = env_report();
      if (as_json) std::cout << r.dump() << std::endl;
      else print_env(r);
      return 0;
    }
    json r = build_report(!no_mpi);
    if (as_json) std::cout << r.dump() << std::endl;
    else print_human(r);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ds_report: error: " << ds::user_message(e) << std::endl;
    return 1;
  }
}
