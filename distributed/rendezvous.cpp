// Rendezvous: every hello is answered at once (accepted or reject), so a rank that is refused
// learns why; the job starts when rank 0 sends welcome on every data connection.
#include "distributed/rendezvous.h"

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "distributed/message.h"

namespace kiln::dist {

namespace {

constexpr std::uint32_t kMagic = 0x6e6c696b;  // "kiln" read as little-endian bytes
constexpr std::uint32_t kProtocolVersion = 1;
constexpr std::uint32_t kDataChannel = 0;
constexpr std::uint32_t kControlChannel = 1;
constexpr auto kHelloWait = std::chrono::seconds(5);  // for a connection to say who it is

struct Hello {
  std::uint32_t version = 0;
  int rank = -1;
  int world_size = 0;
  std::uint32_t channel = 0;
};

std::string seconds_text(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", ms.count() / 1000.0);
}

std::string hello_payload(const ProcessGroupOptions& options, std::uint32_t channel) {
  PayloadWriter writer;
  writer.u32(kMagic).u32(kProtocolVersion).u32(static_cast<std::uint32_t>(options.rank));
  writer.u32(static_cast<std::uint32_t>(options.world_size)).u32(channel);
  return writer.bytes();
}

// False when the message is no kiln hello (another program connected).
bool parse_hello(const Message& message, Hello& hello) {
  if (message.type != MessageType::hello || message.payload.size() != 20) return false;
  PayloadReader reader(message.payload, "hello");
  if (reader.u32() != kMagic) return false;
  hello.version = reader.u32();
  hello.rank = static_cast<int>(reader.u32());
  hello.world_size = static_cast<int>(reader.u32());
  hello.channel = reader.u32();
  return true;
}

// Rank 0's side of the rendezvous.
class Acceptor {
 public:
  explicit Acceptor(const ProcessGroupOptions& options) : options_(options) {
    connections_.data.resize(static_cast<std::size_t>(options.world_size));
    connections_.control.resize(static_cast<std::size_t>(options.world_size));
  }

  PeerConnections run() {
    std::optional<Socket> inherited = inherited_listener(options_.address);
    const Socket listener = inherited ? std::move(*inherited) : listen_at(options_.address);
    deadline_ = deadline_after(options_.connect_timeout);
    while (!missing_ranks().empty()) {
      std::optional<Socket> socket = accept_until(listener, deadline_);
      if (!socket)
        fail(fmt::format("timed out after {} waiting for rank(s) {} to connect",
                         seconds_text(options_.connect_timeout), rank_list(missing_ranks())));
      admit(std::move(*socket));
    }
    for (std::size_t r = 1; r < connections_.data.size(); ++r)
      send_frame(connections_.data[r], MessageType::welcome, "", deadline_after(kHelloWait));
    return std::move(connections_);
  }

 private:
  void admit(Socket socket) {
    Message message;
    Hello hello;
    const IoResult got =
        receive_frame(socket, message, std::min(deadline_, deadline_after(kHelloWait)));
    if (!got.ok() || !parse_hello(message, hello)) {
      log().warn("rank 0 at '{}': dropped a connection that is no kiln rank ({})", options_.address,
                 got.ok() ? "not a kiln hello" : describe(got));
      return;
    }
    const std::string problem = problem_with(hello);
    if (!problem.empty()) {
      send_frame(socket, MessageType::reject, problem, deadline_after(kHelloWait));
      fail(problem);
    }
    send_frame(socket, MessageType::accepted, "", deadline_after(kHelloWait));
    auto& slots = hello.channel == kDataChannel ? connections_.data : connections_.control;
    slots[static_cast<std::size_t>(hello.rank)] = std::move(socket);
  }

  std::string problem_with(const Hello& hello) const {
    const int world = options_.world_size;
    if (hello.version != kProtocolVersion)
      return fmt::format(
          "rank {} speaks protocol version {}, rank 0 version {} (different kiln builds)",
          hello.rank, hello.version, kProtocolVersion);
    if (hello.world_size != world)
      return fmt::format("rank {} was started with world size {}, rank 0 with {}", hello.rank,
                         hello.world_size, world);
    if (hello.rank == 0)
      return "a second process connected as rank 0: two processes were started with --rank 0";
    if (hello.rank < 0 || hello.rank >= world)
      return fmt::format(
          "a process connected as rank {}, out of range for world size {} (ranks 0..{})",
          hello.rank, world, world - 1);
    if (hello.channel != kDataChannel && hello.channel != kControlChannel)
      return fmt::format("rank {} sent a hello for an unknown channel {}", hello.rank,
                         hello.channel);
    const auto& slots = hello.channel == kDataChannel ? connections_.data : connections_.control;
    if (slots[static_cast<std::size_t>(hello.rank)].is_open())
      return fmt::format("rank {} connected twice: two processes were started with --rank {}",
                         hello.rank, hello.rank);
    return {};
  }

  // Tells every connected rank why the job cannot start, then throws.
  [[noreturn]] void fail(const std::string& problem) {
    for (const Socket& socket : connections_.data)
      if (socket.is_open())
        send_frame(socket, MessageType::reject, problem, deadline_after(kHelloWait));
    throw Error(fmt::format("rank 0: the job at '{}' cannot start: {}", options_.address, problem));
  }

  std::vector<int> missing_ranks() const {
    std::vector<int> missing;
    for (std::size_t r = 1; r < connections_.data.size(); ++r)
      if (!connections_.data[r].is_open() || !connections_.control[r].is_open())
        missing.push_back(static_cast<int>(r));
    return missing;
  }

  const ProcessGroupOptions& options_;
  PeerConnections connections_;
  Deadline deadline_{};
};

// Rank > 0: reads rank 0's answer on `socket`; throws unless it is `expected`.
void expect_answer(const ProcessGroupOptions& options, const Socket& socket, MessageType expected,
                   Deadline deadline) {
  Message message;
  const IoResult got = receive_frame(socket, message, deadline);
  KILN_CHECK(got.status != IoStatus::timed_out,
             "rank {}: rank 0 at '{}' did not start the job within {}", options.rank,
             options.address, seconds_text(options.connect_timeout));
  KILN_CHECK(got.ok(),
             "rank {}: rank 0 at '{}' {} during the handshake (it failed, or it is no kiln rank 0)",
             options.rank, options.address, describe(got));
  KILN_CHECK(message.type != MessageType::reject, "rank {}: rank 0 at '{}' refused the job: {}",
             options.rank, options.address, message.payload);
  KILN_CHECK(message.type == expected,
             "rank {}: rank 0 at '{}' answered '{}' where '{}' was expected", options.rank,
             options.address, message_type_name(message.type), message_type_name(expected));
}

// Rank > 0: connects one channel, says hello and waits until rank 0 accepted it.
Socket connect_channel(const ProcessGroupOptions& options, std::uint32_t channel, Deadline deadline,
                       const std::function<void()>& between_attempts) {
  Socket socket;
  try {
    socket = connect_with_retry(options.address, deadline, between_attempts);
  } catch (const Error& e) {
    throw Error(fmt::format("rank {}: {} (retried for {})", options.rank, e.what(),
                            seconds_text(options.connect_timeout)));
  }
  const Deadline answer_deadline = deadline_after(options.connect_timeout + kHelloWait);
  send_frame(socket, MessageType::hello, hello_payload(options, channel), answer_deadline);
  expect_answer(options, socket, MessageType::accepted, answer_deadline);
  return socket;
}

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

PeerConnections accept_ranks(const ProcessGroupOptions& options) { return Acceptor(options).run(); }

PeerConnections connect_to_rank0(const ProcessGroupOptions& options) {
  const Deadline deadline = deadline_after(options.connect_timeout);
  PeerConnections connections;
  connections.data.push_back(connect_channel(options, kDataChannel, deadline, {}));
  // While the control connection is retried, a reject on the data connection ends the wait.
  const Socket& data = connections.data[0];
  const auto check_data = [&] {
    if (wait_readable(data, Clock::now()))
      expect_answer(options, data, MessageType::welcome, deadline_after(kHelloWait));
  };
  try {
    connections.control.push_back(connect_channel(options, kControlChannel, deadline, check_data));
  } catch (const Error&) {
    // Rank 0 may have refused the job (and closed everything) while this channel connected.
    if (wait_readable(data, deadline_after(std::chrono::seconds(1))))
      expect_answer(options, data, MessageType::welcome, deadline_after(kHelloWait));
    throw;
  }
  // Rank 0 was listening when this rank connected: it ends its own wait before this one.
  expect_answer(options, data, MessageType::welcome,
                deadline_after(options.connect_timeout + kHelloWait));
  return connections;
}

}  // namespace kiln::dist
