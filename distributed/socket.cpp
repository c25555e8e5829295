// TCP sockets with deadlines: every blocking step is a poll() bounded by a deadline, and
// EINTR restarts it. IPv4 only (getaddrinfo with AF_INET).
#include "distributed/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace kiln::dist {

Deadline deadline_after(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

int milliseconds_left(Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000'000));
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

HostPort parse_host_port(const std::string& address) {
  const auto colon = address.rfind(':');
  KILN_CHECK(colon != std::string::npos && colon > 0, "address '{}': expected HOST:PORT", address);
  const std::string port_text = address.substr(colon + 1);
  int port = 0;
  const bool digits =
      !port_text.empty() && port_text.size() <= 5 &&
      std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) port = std::stoi(port_text);
  KILN_CHECK(digits && port >= 1 && port <= 65535,
             "address '{}': the port '{}' is not a number in 1..65535", address, port_text);
  return {address.substr(0, colon), port};
}

namespace {

std::string errno_text(int error) { return std::strerror(error); }

sockaddr_in resolve(const std::string& address) {
  const HostPort hp = parse_host_port(address);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(hp.host.c_str(), nullptr, &hints, &found);
  KILN_CHECK(rc == 0 && found, "address '{}': cannot resolve host '{}': {}", address, hp.host,
             ::gai_strerror(rc));
  sockaddr_in result{};
  std::memcpy(&result, found->ai_addr, sizeof(result));
  ::freeaddrinfo(found);
  result.sin_port = htons(static_cast<uint16_t>(hp.port));
  return result;
}

Socket new_tcp_socket() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  KILN_CHECK(s.is_open(), "cannot create a TCP socket: {}", errno_text(errno));
  return s;
}

void set_nonblocking(const Socket& s, bool on) {
  const int flags = ::fcntl(s.fd(), F_GETFL);
  ::fcntl(s.fd(), F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void set_no_delay(const Socket& s) {
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Polls `fd` for `events` until `deadline`: the revents, or 0 at the deadline.
int poll_until(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, milliseconds_left(deadline));
    if (rc > 0) return p.revents;
    if (rc == 0) return 0;
    if (errno != EINTR) return POLLERR;
  }
}

// One non-blocking connect bounded by `deadline`: 0 on success, else the errno.
int connect_once(const Socket& s, const sockaddr_in& target, Deadline deadline) {
  set_nonblocking(s, true);
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&target), sizeof(target)) == 0) return 0;
  if (errno != EINPROGRESS && errno != EINTR) return errno;
  if (poll_until(s.fd(), POLLOUT, deadline) == 0) return ETIMEDOUT;
  int error = 0;
  socklen_t length = sizeof(error);
  ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
  return error;
}

}  // namespace

Socket listen_at(const std::string& address) {
  sockaddr_in local = resolve(address);
  const bool loopback = (ntohl(local.sin_addr.s_addr) >> 24) == 127;
  if (!loopback)
    local.sin_addr.s_addr = htonl(INADDR_ANY);  // the name may map to another interface
  Socket s = new_tcp_socket();
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  KILN_CHECK(::bind(s.fd(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) == 0,
             "rank 0 cannot listen at '{}': bind: {}", address, errno_text(errno));
  KILN_CHECK(::listen(s.fd(), 128) == 0, "rank 0 cannot listen at '{}': listen: {}", address,
             errno_text(errno));
  return s;
}

Socket listen_on_loopback(int& port) {
  Socket s = new_tcp_socket();
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(local);
  KILN_CHECK(::bind(s.fd(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) == 0 &&
                 ::listen(s.fd(), 128) == 0 &&
                 ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &length) == 0,
             "cannot listen on 127.0.0.1: {}", errno_text(errno));
  port = ntohs(local.sin_port);
  return s;
}

std::optional<Socket> inherited_listener(const std::string& address) {
  const char* named = std::getenv(kInheritedListenVariable);
  if (named == nullptr) return std::nullopt;
  const std::string text = named;
  ::unsetenv(kInheritedListenVariable);  // one process group adopts it, once
  if (text != std::to_string(kInheritedListenFd)) return std::nullopt;
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  int listening = 0;
  socklen_t option_length = sizeof(listening);
  if (::getsockname(kInheritedListenFd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
      local.sin_family != AF_INET ||
      ::getsockopt(kInheritedListenFd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &option_length) !=
          0 ||
      listening == 0 || ntohs(local.sin_port) != parse_host_port(address).port)
    return std::nullopt;
  ::fcntl(kInheritedListenFd, F_SETFD, FD_CLOEXEC);
  return Socket(kInheritedListenFd);
}

std::optional<Socket> accept_until(const Socket& listener, Deadline deadline) {
  while (Clock::now() < deadline) {
    const int events = poll_until(listener.fd(), POLLIN, deadline);
    if (events == 0) return std::nullopt;
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!s.is_open()) continue;  // the connection went away again, or EINTR
    set_no_delay(s);
    return s;
  }
  return std::nullopt;
}

Socket connect_with_retry(const std::string& address, Deadline deadline,
                          const std::function<void()>& between_attempts) {
  std::string cause = "timed out";
  for (;;) {
    const sockaddr_in target = resolve(address);
    Socket s = new_tcp_socket();
    const int error = connect_once(s, target, deadline);
    if (error == 0) {
      set_nonblocking(s, false);
      set_no_delay(s);
      return s;
    }
    cause = errno_text(error);
    if (Clock::now() + std::chrono::milliseconds(100) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (between_attempts) between_attempts();
  }
  throw Error(fmt::format("cannot connect to rank 0 at '{}': {}", address, cause));
}

IoResult send_all(const Socket& socket, const void* data, std::size_t size, Deadline deadline) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const int events = poll_until(socket.fd(), POLLOUT, deadline);
    if (events == 0) return {IoStatus::timed_out, {}};
    const ssize_t sent = ::send(socket.fd(), bytes, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET) return {IoStatus::closed, {}};
      return {IoStatus::failed, errno_text(errno)};
    }
    bytes += sent;
    size -= static_cast<std::size_t>(sent);
  }
  return {};
}

IoResult receive_all(const Socket& socket, void* data, std::size_t size, Deadline deadline) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    const int events = poll_until(socket.fd(), POLLIN, deadline);
    if (events == 0) return {IoStatus::timed_out, {}};
    const ssize_t got = ::recv(socket.fd(), bytes, size, MSG_DONTWAIT);
    if (got == 0) return {IoStatus::closed, {}};
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET) return {IoStatus::closed, {}};
      return {IoStatus::failed, errno_text(errno)};
    }
    bytes += got;
    size -= static_cast<std::size_t>(got);
  }
  return {};
}

bool wait_readable(const Socket& socket, Deadline deadline) {
  return poll_until(socket.fd(), POLLIN, deadline) != 0;
}

std::string describe(const IoResult& result) {
  switch (result.status) {
    case IoStatus::ok:
      return "ok";
    case IoStatus::closed:
      return "closed the connection";
    case IoStatus::timed_out:
      return "timed out";
    case IoStatus::failed:
      return result.cause;
  }
  return "unknown";
}

}  // namespace kiln::dist
