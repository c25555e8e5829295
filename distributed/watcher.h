// The failure watcher: a thread per process that pings its peers over the control
// connections and ends the job on every rank when one rank dies, falls silent or reports an error.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/message.h"
#include "distributed/process_group.h"
#include "distributed/socket.h"

namespace kiln::dist {

class Watcher {
 public:
  // `control` as in PeerConnections: rank 0 a socket per other rank, the others only [0].
  Watcher(const ProcessGroupOptions& options, std::vector<Socket> control);
  ~Watcher();  // stop()
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  void add_failure_hook(std::function<void(const std::string&)> hook);
  // Tells the other ranks (rank 0 directly, the others through rank 0) that this rank failed;
  // then stops watching: this process ends by itself.
  void report_error(const std::string& message);
  // The goodbye: every rank sends done, rank 0 answers all once it has them all. kiln::Error
  // if that takes past `deadline`. Stops the watcher: closed connections are then normal.
  void finish(Deadline deadline);
  // For the caller's thread when a peer's data connection closed: waits up to `limit` so that
  // this watcher, which learns the cause (an error report, a failure notice), ends the job
  // first with that cause. Returns at once when the watcher is stopped.
  void wait_for_verdict(std::chrono::milliseconds limit);
  // Stops the thread (it acts on no failure from then on); idempotent, never blocks long.
  void stop();

 private:
  struct Peer {
    int rank = 0;
    Socket socket;
    Clock::time_point last_heard{};
    bool done = false;    // sent done (rank 0's view); guarded by mutex_
    bool closed = false;  // closed after done: no longer watched
  };

  void run();
  bool watch_once();  // false once there is nothing left to watch
  bool read_from(Peer& peer);
  bool handle(Peer& peer, const Message& message);
  void send_pings();
  void check_silence();
  void peer_failed(int failed_rank, const std::string& cause);
  [[noreturn]] void end_job(int failed_rank, const std::string& cause);
  void send_failure_notices(int failed_rank, const std::string& cause);
  Deadline next_wake() const;
  std::vector<int> ranks_not_done() const;  // mutex_ held
  IoResult send_to(const Peer& peer, MessageType type, const std::string& payload,
                   Deadline deadline);
  void finish_as_rank0(Deadline deadline);
  void finish_as_other_rank(Deadline deadline);

  const ProcessGroupOptions options_;
  std::vector<Peer> peers_;
  int wake_read_ = -1;  // stop() writes to wake_write_; the thread polls wake_read_
  int wake_write_ = -1;
  Clock::time_point next_ping_{};

  std::mutex send_mutex_;     // sends on control sockets (the thread's pings, the caller's goodbye)
  mutable std::mutex mutex_;  // what follows, and Peer::done
  std::condition_variable changed_;
  bool stopping_ = false;
  bool finish_acked_ = false;
  std::vector<std::function<void(const std::string&)>> hooks_;
  std::thread thread_;
};

}  // namespace kiln::dist
