// The one-host launcher: posix_spawn of one process per rank, SIGINT/SIGTERM forwarded to
// them, and a wait that kills the survivors `grace` after the first rank failed.
#include "distributed/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "distributed/process_group.h"
#include "distributed/socket.h"

extern char** environ;

namespace kiln::dist {

namespace {

// The children a forwarded signal goes to (0: not started or already reaped).
std::atomic<std::atomic<pid_t>*> g_children{nullptr};
std::atomic<int> g_child_count{0};

void forward_signal(int signal) {
  std::atomic<pid_t>* children = g_children.load();
  for (int i = 0; children && i < g_child_count.load(); ++i)
    if (const pid_t pid = children[i].load(); pid > 0) ::kill(pid, signal);
}

// Installs forward_signal for SIGINT and SIGTERM while it lives.
class SignalForwarding {
 public:
  SignalForwarding(std::atomic<pid_t>* children, int count) {
    g_children = children;
    g_child_count = count;
    struct sigaction action {};
    action.sa_handler = forward_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    g_child_count = 0;
    g_children = nullptr;
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The device rank `rank` sees: the rank-th entry of an inherited CUDA_VISIBLE_DEVICES list, else
// `rank`.
std::string visible_device(int rank) {
  const char* inherited = std::getenv("CUDA_VISIBLE_DEVICES");
  if (inherited == nullptr || *inherited == '\0') return std::to_string(rank);
  std::string list = inherited;
  for (int i = 0; i < rank; ++i) {
    const auto comma = list.find(',');
    if (comma == std::string::npos) return std::to_string(rank);
    list = list.substr(comma + 1);
  }
  return list.substr(0, list.find(','));
}

std::vector<std::string> rank_environment(int rank, const LaunchOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.starts_with("NCCL_NVLS_ENABLE=")) continue;
    if (options.one_gpu_per_rank && entry.starts_with("CUDA_VISIBLE_DEVICES=")) continue;
    env.push_back(entry);
  }
  env.push_back("NCCL_NVLS_ENABLE=0");  // NVLink multicast stays off (the device README)
  if (options.one_gpu_per_rank) env.push_back("CUDA_VISIBLE_DEVICES=" + visible_device(rank));
  // N ranks share the host's cores: unless told otherwise, each gets its share of OpenMP
  // threads, which sleep rather than spin while they wait (spinning threads of one rank
  // would starve another's host work).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    env.push_back("OMP_NUM_THREADS=" +
                  std::to_string(std::max(1u, cores / static_cast<unsigned>(options.world_size))));
  }
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) env.push_back("OMP_WAIT_POLICY=passive");
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// `listener`: the job's listening socket, which rank 0 inherits (socket.h).
pid_t spawn_rank(const std::string& executable, const std::vector<std::string>& args, int rank,
                 int port, const Socket& listener, const LaunchOptions& options) {
  std::vector<std::string> argv{executable};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const std::string& extra : {std::string("--rank"), std::to_string(rank),
                                   std::string("--world-size"), std::to_string(options.world_size),
                                   std::string("--init"), "127.0.0.1:" + std::to_string(port)})
    argv.push_back(extra);
  std::vector<std::string> env = rank_environment(rank, options);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  if (rank == 0) {  // its copy of the listening socket, without close-on-exec
    posix_spawn_file_actions_adddup2(&files, listener.fd(), kInheritedListenFd);
    env.push_back(fmt::format("{}={}", kInheritedListenVariable, kInheritedListenFd));
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults, empty;
  sigemptyset(&defaults);
  for (int signal : {SIGINT, SIGTERM, SIGPIPE}) sigaddset(&defaults, signal);
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, executable.c_str(), &files, &attributes,
                               c_strings(argv).data(), c_strings(env).data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&files);
  KILN_CHECK(rc == 0, "launch: cannot start rank {} as '{}': {}", rank, executable,
             std::strerror(rc));
  return pid;
}

struct RankExit {
  bool running = true;
  int code = 0;               // the exit code, or 128 + signal
  bool killed_by_us = false;  // after the grace
  Clock::time_point when{};
};

int exit_code_of(int status, int rank) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    log().error("rank {} was killed by signal {} ({})", rank, signal, strsignal(signal));
    return 128 + signal;
  }
  const int code = WEXITSTATUS(status);
  if (code != 0) log().error("rank {} exited with code {}", rank, code);
  return code;
}

// The rank whose failure the job's exit code reports: the first to fail by itself, before
// ranks that ended because of it (kPeerFailedExitCode) or were killed after the grace.
int job_exit_code(const std::vector<RankExit>& exits) {
  const RankExit* first = nullptr;
  const RankExit* first_own = nullptr;
  for (const RankExit& e : exits) {
    if (e.code == 0) continue;
    if (!first || e.when < first->when) first = &e;
    const bool consequence = e.killed_by_us || e.code == kPeerFailedExitCode;
    if (!consequence && (!first_own || e.when < first_own->when)) first_own = &e;
  }
  if (first_own) return first_own->code;
  return first ? first->code : 0;
}

// Waits for every rank; `grace` after the first failure, kills those still running.
int wait_for_ranks(std::atomic<pid_t>* pids, int count, std::chrono::milliseconds grace) {
  std::vector<RankExit> exits(static_cast<std::size_t>(count));
  std::optional<Clock::time_point> first_failure;
  for (int running = count; running > 0;) {
    for (int r = 0; r < count; ++r) {
      RankExit& e = exits[static_cast<std::size_t>(r)];
      int status = 0;
      if (!e.running || ::waitpid(pids[r].load(), &status, WNOHANG) != pids[r].load()) continue;
      pids[r] = 0;
      e = RankExit{false, exit_code_of(status, r), e.killed_by_us, Clock::now()};
      --running;
      if (e.code != 0 && !first_failure) first_failure = e.when;
    }
    if (first_failure && Clock::now() - *first_failure > grace) {
      for (int r = 0; r < count; ++r) {
        RankExit& e = exits[static_cast<std::size_t>(r)];
        if (!e.running || e.killed_by_us) continue;
        log().error("rank {} still runs {} ms after the first failure: killing it", r,
                    grace.count());
        e.killed_by_us = true;
        ::kill(pids[r].load(), SIGKILL);
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return job_exit_code(exits);
}

}  // namespace

int free_local_port() {
  int port = 0;
  listen_on_loopback(port);  // closed again at once: the port is free now, not reserved
  return port;
}

std::string self_executable() {
  std::string path(4096, '\0');
  const ssize_t length = ::readlink("/proc/self/exe", path.data(), path.size());
  KILN_CHECK(length > 0 && static_cast<std::size_t>(length) < path.size(),
             "cannot read /proc/self/exe: {}", std::strerror(errno));
  path.resize(static_cast<std::size_t>(length));
  return path;
}

int launch_local(const std::string& executable, const std::vector<std::string>& args,
                 const LaunchOptions& options) {
  KILN_CHECK(options.world_size >= 1, "launch: the world size is {}; it must be at least 1",
             options.world_size);
  // Rank 0 listens on the launcher's socket: the port stays the job's from the start.
  int port = 0;
  Socket listener = listen_on_loopback(port);
  const int count = options.world_size;
  std::vector<std::atomic<pid_t>> pids(static_cast<std::size_t>(count));
  SignalForwarding forwarding(pids.data(), count);
  for (int r = 0; r < count; ++r) {
    try {
      pids[static_cast<std::size_t>(r)] = spawn_rank(executable, args, r, port, listener, options);
    } catch (const Error&) {
      for (int started = 0; started < r; ++started) {
        ::kill(pids[static_cast<std::size_t>(started)].load(), SIGKILL);
        ::waitpid(pids[static_cast<std::size_t>(started)].load(), nullptr, 0);
      }
      throw;
    }
  }
  listener.close();  // rank 0 has its own copy
  return wait_for_ranks(pids.data(), count, options.grace);
}

}  // namespace kiln::dist
