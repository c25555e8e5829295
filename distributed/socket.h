// TCP sockets for the ranks of a job: an owning fd, HOST:PORT parsing, listen/accept and
// connect with deadlines, and send/receive of whole buffers with deadlines (poll, EINTR).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace kiln::dist {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline `timeout` from now.
Deadline deadline_after(std::chrono::milliseconds timeout);
// Milliseconds left until `deadline` (0 when past), for poll().
int milliseconds_left(Deadline deadline);

// Owns one file descriptor; closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  int release();
  void close();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};

// The launcher's listening socket on 127.0.0.1 for rank 0 (launch.h): rank 0 gets a copy as
// file descriptor kInheritedListenFd and its number in the environment variable
// kInheritedListenVariable, so no other process can take the port between the launcher's
// choice and rank 0's listen.
inline constexpr int kInheritedListenFd = 64;
inline constexpr const char* kInheritedListenVariable = "KILN_INIT_LISTEN_FD";
// A new listening TCP socket on 127.0.0.1 at a port the system chooses, and that port.
Socket listen_on_loopback(int& port);
// The inherited listening socket if the environment names one that listens at `address`'s port
// (the variable is then removed), else none: rank 0 listens itself.
std::optional<Socket> inherited_listener(const std::string& address);

// "HOST:PORT" -> its parts; kiln::Error when the port is missing or not in 1..65535.
HostPort parse_host_port(const std::string& address);

// Rank 0's listening socket for `address` (its loopback IP, or every interface otherwise).
Socket listen_at(const std::string& address);
// The next connection on `listener`, or nullopt once `deadline` passed.
std::optional<Socket> accept_until(const Socket& listener, Deadline deadline);
// Connects to `address`, retrying every 100 ms until `deadline`; kiln::Error then, naming
// the address and the last cause ("connection refused"). `between_attempts` (if set) runs
// before each retry and may throw to give up early.
Socket connect_with_retry(const std::string& address, Deadline deadline,
                          const std::function<void()>& between_attempts = {});

// The result of a send or receive of a whole buffer.
enum class IoStatus { ok, closed, timed_out, failed };
struct IoResult {
  IoStatus status = IoStatus::ok;
  std::string cause;  // for `failed`: strerror(errno)
  bool ok() const { return status == IoStatus::ok; }
};

// Sends all `size` bytes (MSG_NOSIGNAL: a closed peer is `closed`, not SIGPIPE).
IoResult send_all(const Socket& socket, const void* data, std::size_t size, Deadline deadline);
// Receives exactly `size` bytes; `closed` when the peer hung up first.
IoResult receive_all(const Socket& socket, void* data, std::size_t size, Deadline deadline);
// Waits until `socket` is readable (data or a hang-up): true, or false at `deadline`.
bool wait_readable(const Socket& socket, Deadline deadline);

// "closed the connection", "timed out", or the errno text, for messages.
std::string describe(const IoResult& result);

}  // namespace kiln::dist
