// The framed messages between ranks: a 12-byte header (type, payload size) then the payload,
// and the little-endian encoding of the integers and strings inside payloads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "distributed/socket.h"

namespace kiln::dist {

enum class MessageType : std::uint32_t {
  // Rendezvous (on both connections).
  hello = 1,  // rank -> 0: magic, version, rank, world size, channel
  accepted,   // 0 -> rank: this hello is fine
  welcome,    // 0 -> rank (data connection): every rank is here, the job starts
  reject,     // 0 -> rank: why the job cannot start (text)
  // Control connection (the watcher).
  ping,        // "still alive"
  error,       // rank -> 0: this rank failed (text)
  failure,     // 0 -> rank: rank K failed (K, text)
  done,        // rank -> 0: finish() reached
  finish_ack,  // 0 -> rank: every rank reached finish()
  // Data connection (collectives): every other rank sends its part to rank 0 with the
  // collective's type; rank 0 answers each with the result under the same type.
  broadcast,         // empty from the others; rank 0's blob back
  all_gather,        // each rank's blob; every blob back (a count, then texts)
  all_reduce_mean,   // dtype, count, raw elements; the mean back in the same layout
  barrier,           // empty both ways
  collective_error,  // 0 -> rank: the collective failed (text), e.g. mismatched sizes
};

// "all_gather", "ping", ...: for messages about a mismatch.
std::string_view message_type_name(MessageType type);

struct FrameHeader {
  MessageType type = MessageType::ping;
  std::uint64_t size = 0;  // payload bytes
};

struct Message {
  MessageType type = MessageType::ping;
  std::string payload;
};

// Sends a header then a payload made of `head` followed by `body_size` bytes at `body`.
IoResult send_frame(const Socket& socket, MessageType type, std::string_view head, const void* body,
                    std::size_t body_size, Deadline deadline);
IoResult send_frame(const Socket& socket, MessageType type, std::string_view payload,
                    Deadline deadline);
// Receives a header only (the payload follows on the socket); `failed` for a corrupt header.
IoResult receive_header(const Socket& socket, FrameHeader& header, Deadline deadline);
// Receives a whole frame into `message`.
IoResult receive_frame(const Socket& socket, Message& message, Deadline deadline);
// Reads and drops `size` bytes (a payload that is not wanted).
IoResult discard_bytes(const Socket& socket, std::uint64_t size, Deadline deadline);

// Appends little-endian integers and length-prefixed strings.
class PayloadWriter {
 public:
  PayloadWriter& u32(std::uint32_t value);
  PayloadWriter& u64(std::uint64_t value);
  PayloadWriter& text(std::string_view value);
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads what PayloadWriter wrote; kiln::Error naming `what` when the payload is too short.
class PayloadReader {
 public:
  PayloadReader(std::string_view bytes, std::string_view what) : bytes_(bytes), what_(what) {}
  std::uint32_t u32();
  std::uint64_t u64();
  std::string text();

 private:
  std::string_view take(std::size_t size);
  std::string_view bytes_;
  std::string_view what_;
};

}  // namespace kiln::dist
