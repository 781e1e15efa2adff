#include "run.h"

#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ds/core/env.h"

namespace dsrun {
namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int status_to_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Children of this process (orphaned ranks are re-parented to us: we are a subreaper).
std::vector<pid_t> my_children() {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    char buf[1024];
    std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    const char* rp = std::strrchr(buf, ')');  // comm may hold spaces; fields follow the last ')'
    if (rp == nullptr) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == self) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

// After the engine exited: stop and reap every remaining descendant that was re-parented to
// us, so no process of the job outlives dsrun on this machine.
void reap_leftovers(const sigset_t& set, int grace_seconds) {
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    std::vector<pid_t> kids = my_children();
    if (kids.empty()) return;
    for (pid_t k : kids) ::kill(k, SIGTERM);
    timespec start{};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
      while (::waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      if (my_children().empty()) return;
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (now.tv_sec - start.tv_sec >= grace_seconds) {
        for (pid_t k : my_children()) ::kill(k, SIGKILL);
        break;
      }
      timespec wait{0, 200000000};
      sigtimedwait(&set, nullptr, &wait);
    }
  }
}

}  // namespace

bool in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0;
  const std::string p = ds::env::external("PATH").value_or("/usr/bin:/bin");
  std::size_t start = 0;
  while (start <= p.size()) {
    std::size_t c = p.find(':', start);
    if (c == std::string::npos) c = p.size();
    std::string dir = c > start ? p.substr(start, c - start) : std::string(1, '.');
    std::string full = dir;
    full += '/';
    full += name;
    struct stat st{};
    if (::stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(full.c_str(), X_OK) == 0) return true;
    start = c + 1;
  }
  return false;
}

int run_capture(const std::vector<std::string>& argv, std::string& output) {
  int fds[2];
  if (::pipe(fds) != 0) return 127;
  pid_t pid = ::fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    auto av = c_argv(argv);
    ::execvp(av[0], av.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", av[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status_to_code(status);
}

namespace {

// In the forked child: its own process group, death signal from dsrun, then exec. A failed
// exec writes its errno to `exec_err_fd`.
[[noreturn]] void exec_engine(const std::vector<std::string>& argv, const sigset_t& old, int exec_err_fd,
                              pid_t dsrun_pid) {
  ::setpgid(0, 0);  // own group: signals go to the engine and what it spawned, not to us
  // dsrun killed outright (SIGKILL, OOM) cannot forward anything: the kernel sends the
  // engine SIGTERM instead, and mpirun / mpiexec / srun stop their ranks on SIGTERM (the
  // ranks sit in process groups of their own, out of reach of a signal to ours). dsrun is
  // single-threaded, so "parent thread exited" means dsrun exited. If dsrun died before
  // the prctl, nothing would ever signal us: getppid() then is no longer dsrun.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
  if (::getppid() != dsrun_pid) ::_exit(128 + SIGTERM);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  auto av = c_argv(argv);
  ::execvp(av[0], av.data());
  int err = errno;
  if (::write(exec_err_fd, &err, sizeof err) != static_cast<ssize_t>(sizeof err)) {
    std::fprintf(stderr, "dsrun: error: cannot execute '%s': %s\n", av[0], std::strerror(err));
  }
  ::_exit(127);
}

// Starts the engine; returns its pid, or -1 with `fail_code` set when it never ran (dsrun
// printed the one error line). A failed exec comes back as its errno through a close-on-exec
// pipe (end of file: the exec worked).
pid_t start_engine(const std::vector<std::string>& argv, const sigset_t& old, int& fail_code) {
  int exec_err[2];
  if (::pipe2(exec_err, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "dsrun: error: cannot create a pipe: %s\n", std::strerror(errno));
    fail_code = 1;
    return -1;
  }
  const pid_t self = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "dsrun: error: fork failed: %s\n", std::strerror(errno));
    ::close(exec_err[0]);
    ::close(exec_err[1]);
    fail_code = 1;
    return -1;
  }
  if (pid == 0) {
    ::close(exec_err[0]);
    exec_engine(argv, old, exec_err[1], self);
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before any signal
  ::close(exec_err[1]);
  int err = 0;
  ssize_t got;
  while ((got = ::read(exec_err[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  ::close(exec_err[0]);
  if (got != static_cast<ssize_t>(sizeof err)) return pid;
  std::fprintf(stderr, "dsrun: error: cannot execute '%s': %s%s\n", argv.front().c_str(), std::strerror(err),
               err == E2BIG ? " (its arguments and environment are over the system's limit for "
                              "one exec: shorten exported variables or raise `ulimit -s`)"
                            : "");
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  fail_code = 127;
  return -1;
}

// Waits for the engine; the first SIGINT/SIGTERM/SIGHUP goes to its group, a second one or
// the grace period's end sends SIGKILL. Returns dsrun's exit code.
int supervise(pid_t pid, const sigset_t& set, int grace_seconds) {
  int got_signal = 0;
  bool killed = false;
  timespec deadline{};
  for (;;) {
    int status = 0;
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      if (got_signal) ::kill(-pid, SIGKILL);  // leftovers of the group (none normally)
      reap_leftovers(set, grace_seconds);
      return got_signal ? 128 + got_signal : status_to_code(status);
    }
    timespec wait{1, 0};
    if (got_signal && !killed) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (now.tv_sec > deadline.tv_sec ||
          (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec)) {
        std::fprintf(stderr, "dsrun: ranks still running %d s after the signal; sending SIGKILL\n",
                     grace_seconds);
        ::kill(-pid, SIGKILL);
        killed = true;
      }
    }
    int sig = sigtimedwait(&set, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (got_signal == 0) {
        got_signal = sig;
        std::fprintf(stderr, "dsrun: got signal %d; stopping the job\n", sig);
        ::kill(-pid, sig);
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += grace_seconds;
      } else if (!killed) {
        std::fprintf(stderr, "dsrun: second signal; sending SIGKILL\n");
        ::kill(-pid, SIGKILL);
        killed = true;
      }
    }
  }
}

}  // namespace

int run_supervised(const std::vector<std::string>& argv, int grace_seconds) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, &old);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  std::fflush(stdout);
  std::fflush(stderr);
  int rc = 0;
  const pid_t pid = start_engine(argv, old, rc);
  if (pid > 0) rc = supervise(pid, set, grace_seconds);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

}  // namespace dsrun
