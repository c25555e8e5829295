// ProcessGroup: the ranks of one data-parallel job, joined over TCP. Rank 0 listens at the
// job's address; every other rank connects to it, so the same code path serves one host
// (the local launcher uses loopback) and several hosts. Over these connections the ranks
// exchange small blobs (NCCL's unique id, checksums), run CPU collectives (the reference
// path, and multi-process training on the CPU), and watch each other: a rank that dies,
// hangs up or reports an error ends the job on every rank with a message naming it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln::dist {

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string address =
      "127.0.0.1:29500";  // HOST:PORT where rank 0 listens (HOST: a name or an IPv4 address)
  // Rank 0 waits this long for every other rank to connect; the others retry connecting
  // this long. Then kiln::Error naming the address, the rank(s) missing and the cause.
  std::chrono::milliseconds connect_timeout{60'000};
  // Each rank pings its peer(s) this often; one silent (no message, connection open) for
  // `peer_timeout` counts as failed. A closed connection counts at once.
  std::chrono::milliseconds heartbeat{1'000};
  std::chrono::milliseconds peer_timeout{30'000};
  // A collective or finish() that waits longer than this for the other ranks throws
  // kiln::Error (ranks that disagree on what to call next would otherwise wait forever).
  std::chrono::milliseconds collective_timeout{30 * 60'000};
};

// The process exit code of a rank that ended because another rank failed.
inline constexpr int kPeerFailedExitCode = 3;

class ProcessGroup {
 public:
  // Joins the job: rank 0 accepts world_size - 1 connections, the others connect to rank 0.
  // Throws kiln::Error for a bad address or options, a timeout, a mismatched world size or
  // a duplicate rank, naming the rank, the address and the cause. world_size 1 opens no socket.
  static std::unique_ptr<ProcessGroup> join(const ProcessGroupOptions& options);

  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Rank 0's `blob` (ignored elsewhere) on every rank.
  virtual std::string broadcast(const std::string& blob) = 0;
  // Every rank's blob, in rank order, on every rank.
  virtual std::vector<std::string> all_gather(const std::string& blob) = 0;
  // data := (sum over ranks of data) / world_size, summed in rank order, so every rank gets
  // the same bits. All ranks must pass the same number of elements (kiln::Error otherwise).
  virtual void all_reduce_mean(std::span<float> data) = 0;
  virtual void all_reduce_mean(std::span<double> data) = 0;
  virtual void barrier() = 0;

  // Called on the watcher thread when another rank failed, before this process exits with
  // kPeerFailedExitCode (e.g. to abort an NCCL communicator). Its argument is the message.
  virtual void on_peer_failure(std::function<void(const std::string&)> hook) = 0;
  // This rank failed (a caught exception): tells the others why before it exits non-zero.
  virtual void report_error(const std::string& message) = 0;
  // The job ended normally: a barrier, after which closed connections are no failure.
  virtual void finish() = 0;
};

}  // namespace kiln::dist
