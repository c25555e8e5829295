// The watcher thread: polls the control connections and a wake-up pipe, pings every
// `heartbeat`, and on a failure forwards it (rank 0), logs it, runs the hooks and exits.
#include "distributed/watcher.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"

namespace kiln::dist {

namespace {

constexpr auto kNoticeWait =
    std::chrono::seconds(2);  // for a failure notice or error report to go out
constexpr const char* kClosedCause =
    "closed its connection without finishing (the process died or was killed)";

std::string seconds_text(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", ms.count() / 1000.0);
}

}  // namespace

Watcher::Watcher(const ProcessGroupOptions& options, std::vector<Socket> control)
    : options_(options) {
  for (std::size_t r = 0; r < control.size(); ++r)
    if (control[r].is_open())
      peers_.push_back(Peer{static_cast<int>(r), std::move(control[r]), Clock::now()});
  int fds[2];
  KILN_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0,
             "rank {}: cannot create the watcher's pipe: {}", options.rank, std::strerror(errno));
  wake_read_ = fds[0];
  wake_write_ = fds[1];
  next_ping_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

Watcher::~Watcher() {
  stop();
  ::close(wake_read_);
  ::close(wake_write_);
}

void Watcher::add_failure_hook(std::function<void(const std::string&)> hook) {
  std::lock_guard lock(mutex_);
  hooks_.push_back(std::move(hook));
}

void Watcher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  const char byte = 1;
  [[maybe_unused]] const ssize_t written =
      ::write(wake_write_, &byte, 1);  // a full pipe already wakes it
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Watcher::wait_for_verdict(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, limit, [&] { return stopping_; });
}

void Watcher::run() {
  try {
    while (watch_once()) {}
  } catch (const std::exception& e) {
    log().error("rank {}: the failure watcher stopped: {}", options_.rank, e.what());
  }
}

Deadline Watcher::next_wake() const {
  Deadline wake = next_ping_;
  std::lock_guard lock(mutex_);
  for (const Peer& peer : peers_)
    if (!peer.closed && !peer.done) wake = std::min(wake, peer.last_heard + options_.peer_timeout);
  return wake;
}

bool Watcher::watch_once() {
  std::vector<pollfd> fds{{wake_read_, POLLIN, 0}};
  std::vector<Peer*> polled;
  for (Peer& peer : peers_) {
    if (peer.closed) continue;
    fds.push_back({peer.socket.fd(), POLLIN, 0});
    polled.push_back(&peer);
  }
  if (polled.empty()) return false;
  const int rc = ::poll(fds.data(), fds.size(), milliseconds_left(next_wake()));
  if (rc < 0 && errno != EINTR) throw Error(fmt::format("poll: {}", std::strerror(errno)));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
  }
  for (std::size_t i = 0; rc > 0 && i < polled.size(); ++i)
    if (fds[i + 1].revents != 0 && !read_from(*polled[i])) return false;
  if (Clock::now() >= next_ping_) send_pings();
  check_silence();
  return true;
}

bool Watcher::read_from(Peer& peer) {
  Message message;
  const IoResult got = receive_frame(peer.socket, message, deadline_after(options_.peer_timeout));
  if (got.status == IoStatus::closed) {
    {
      std::lock_guard lock(mutex_);
      peer.closed = peer.done;
    }
    if (peer.closed) return true;  // it said goodbye first: a normal end
    peer_failed(peer.rank, kClosedCause);
    return false;
  }
  if (!got.ok()) {
    peer_failed(peer.rank, fmt::format("its control connection failed: {}", describe(got)));
    return false;
  }
  peer.last_heard = Clock::now();
  return handle(peer, message);
}

bool Watcher::handle(Peer& peer, const Message& message) {
  switch (message.type) {
    case MessageType::ping:
      return true;
    case MessageType::error:
      peer_failed(peer.rank, message.payload.empty() ? "it reported an error" : message.payload);
      return false;
    case MessageType::failure: {
      PayloadReader reader(message.payload, "failure notice");
      const int failed_rank = static_cast<int>(reader.u32());
      peer_failed(failed_rank, reader.text());
      return false;
    }
    case MessageType::done: {
      std::lock_guard lock(mutex_);
      peer.done = true;
      changed_.notify_all();
      return true;
    }
    case MessageType::finish_ack: {
      std::lock_guard lock(mutex_);
      finish_acked_ = true;
      changed_.notify_all();
      return false;  // the job ended normally: nothing left to watch
    }
    default:
      peer_failed(peer.rank,
                  fmt::format("it sent an unexpected '{}' message on its control connection",
                              message_type_name(message.type)));
      return false;
  }
}

void Watcher::send_pings() {
  next_ping_ = Clock::now() + options_.heartbeat;
  // A failed ping needs no action here: the read side sees the closed connection or the silence.
  for (const Peer& peer : peers_)
    if (!peer.closed) send_to(peer, MessageType::ping, "", deadline_after(options_.heartbeat));
}

void Watcher::check_silence() {
  const auto now = Clock::now();
  for (const Peer& peer : peers_) {
    bool done = false;
    {
      std::lock_guard lock(mutex_);
      done = peer.done;
    }
    if (!peer.closed && !done && now - peer.last_heard > options_.peer_timeout)
      peer_failed(peer.rank,
                  fmt::format("sent nothing for {}", seconds_text(options_.peer_timeout)));
  }
}

void Watcher::peer_failed(int failed_rank, const std::string& cause) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;  // this process is ending by itself (an error it reported, or unwinding)
  }
  end_job(failed_rank, cause);
}

void Watcher::end_job(int failed_rank, const std::string& cause) {
  if (options_.rank == 0) send_failure_notices(failed_rank, cause);
  const std::string message = fmt::format("rank {} failed: {}", failed_rank, cause);
  log().error("rank {}: ending the job: {}", options_.rank, message);
  log().flush();
  std::vector<std::function<void(const std::string&)>> hooks;
  {
    std::lock_guard lock(mutex_);
    hooks = hooks_;
  }
  for (const auto& hook : hooks) {
    try {
      hook(message);
    } catch (const std::exception& e) {
      log().error("rank {}: a peer-failure hook threw: {}", options_.rank, e.what());
    }
  }
  log().flush();
  std::_Exit(kPeerFailedExitCode);
}

void Watcher::send_failure_notices(int failed_rank, const std::string& cause) {
  PayloadWriter notice;
  notice.u32(static_cast<std::uint32_t>(failed_rank)).text(cause);
  for (const Peer& peer : peers_)
    if (peer.rank != failed_rank && !peer.closed)
      send_to(peer, MessageType::failure, notice.bytes(), deadline_after(kNoticeWait));
}

IoResult Watcher::send_to(const Peer& peer, MessageType type, const std::string& payload,
                          Deadline deadline) {
  std::lock_guard lock(send_mutex_);
  return send_frame(peer.socket, type, payload, deadline);
}

void Watcher::report_error(const std::string& message) {
  stop();  // this process ends by itself: the others' reactions are no failure to act on here
  if (options_.rank == 0) {
    send_failure_notices(0, message);
  } else if (!peers_.empty()) {
    send_to(peers_[0], MessageType::error, message, deadline_after(kNoticeWait));
  }
}

std::vector<int> Watcher::ranks_not_done() const {
  std::vector<int> ranks;
  for (const Peer& peer : peers_)
    if (!peer.done) ranks.push_back(peer.rank);
  return ranks;
}

void Watcher::finish(Deadline deadline) {
  {
    std::lock_guard lock(mutex_);
    KILN_CHECK(!stopping_, "rank {}: finish() after report_error(): this rank already failed",
               options_.rank);
  }
  if (options_.rank == 0) {
    finish_as_rank0(deadline);
  } else {
    finish_as_other_rank(deadline);
  }
  stop();
}

void Watcher::finish_as_rank0(Deadline deadline) {
  {
    std::unique_lock lock(mutex_);
    const bool all = changed_.wait_until(lock, deadline, [&] { return ranks_not_done().empty(); });
    KILN_CHECK(all, "rank 0: finish(): rank(s) {} did not reach finish() in time",
               fmt::join(ranks_not_done(), ", "));
  }
  stop();  // before the answers: ranks that got theirs may close at once
  for (const Peer& peer : peers_)
    send_to(peer, MessageType::finish_ack, "", deadline_after(kNoticeWait));
}

void Watcher::finish_as_other_rank(Deadline deadline) {
  const IoResult sent = send_to(peers_.at(0), MessageType::done, "", deadline);
  KILN_CHECK(sent.ok(), "rank {}: finish(): cannot tell rank 0 at '{}': {}", options_.rank,
             options_.address, describe(sent));
  std::unique_lock lock(mutex_);
  const bool acked = changed_.wait_until(lock, deadline, [&] { return finish_acked_; });
  KILN_CHECK(acked, "rank {}: finish(): rank 0 at '{}' did not confirm the end of the job in time",
             options_.rank, options_.address);
}

}  // namespace kiln::dist
