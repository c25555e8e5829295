// The one-host launcher: `trainer --gpus N` runs N copies of itself, one process per rank,
// joined through ProcessGroup on loopback (the several-host path, on one host).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace kiln::dist {

struct LaunchOptions {
  int world_size = 2;
  // Each rank r sees only GPU r (CUDA_VISIBLE_DEVICES=r), so it runs on "its" device 0.
  bool one_gpu_per_rank = true;
  // After the first rank fails, the others get this long to end themselves (they are told
  // by the ProcessGroup watcher) before they are killed.
  std::chrono::milliseconds grace{60'000};
};

// A free TCP port on 127.0.0.1 (the kernel's choice at the time of the call; another process
// may take it before it is used: tests that start ranks themselves).
int free_local_port();

// Runs `executable` world_size times with `args` plus "--rank R --world-size N --init
// 127.0.0.1:PORT", with NCCL_NVLS_ENABLE=0 in their environment, and waits for all of them.
// Returns 0 when every rank exited with 0; otherwise logs each rank that failed and how
// (exit code, or the signal that killed it) and returns the first failure's exit code
// (128 + signal for a signal; ranks that ended with kPeerFailedExitCode because another
// failed, or were killed after the grace, count only when no rank failed by itself).
// PORT is a socket the launcher listens on before it starts any rank; rank 0 inherits it
// (socket.h, kInheritedListenFd) and accepts the others there, so no process can take the
// port in between. SIGINT and SIGTERM sent to the launcher are forwarded to every rank. With
// one_gpu_per_rank and an inherited CUDA_VISIBLE_DEVICES list, rank r gets its r-th entry.
// Throws kiln::Error if a process cannot be started (after killing those already started).
int launch_local(const std::string& executable, const std::vector<std::string>& args,
                 const LaunchOptions& options);

// This process's executable (/proc/self/exe), for launch_local.
std::string self_executable();

}  // namespace kiln::dist
