// Framing and payload encoding of the messages between ranks (little-endian on the wire).
#include "distributed/message.h"

#include <array>
#include <vector>

#include "core/error.h"

namespace kiln::dist {

namespace {

constexpr std::size_t kHeaderBytes = 12;                // u32 type, u64 size
constexpr std::uint64_t kMaxPayloadBytes = 1ull << 40;  // a corrupt header, not a real size
constexpr auto kLastType = static_cast<std::uint32_t>(MessageType::collective_error);

void put_le(char* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

std::uint64_t get_le(const char* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}

}  // namespace

std::string_view message_type_name(MessageType type) {
  switch (type) {
    case MessageType::hello:
      return "hello";
    case MessageType::accepted:
      return "accepted";
    case MessageType::welcome:
      return "welcome";
    case MessageType::reject:
      return "reject";
    case MessageType::ping:
      return "ping";
    case MessageType::error:
      return "error";
    case MessageType::failure:
      return "failure";
    case MessageType::done:
      return "done";
    case MessageType::finish_ack:
      return "finish_ack";
    case MessageType::broadcast:
      return "broadcast";
    case MessageType::all_gather:
      return "all_gather";
    case MessageType::all_reduce_mean:
      return "all_reduce_mean";
    case MessageType::barrier:
      return "barrier";
    case MessageType::collective_error:
      return "collective error";
  }
  return "unknown";
}

IoResult send_frame(const Socket& socket, MessageType type, std::string_view head, const void* body,
                    std::size_t body_size, Deadline deadline) {
  std::string start(kHeaderBytes, '\0');
  put_le(start.data(), static_cast<std::uint32_t>(type), 4);
  put_le(start.data() + 4, head.size() + body_size, 8);
  start.append(head);
  IoResult result = send_all(socket, start.data(), start.size(), deadline);
  if (!result.ok() || body_size == 0) return result;
  return send_all(socket, body, body_size, deadline);
}

IoResult send_frame(const Socket& socket, MessageType type, std::string_view payload,
                    Deadline deadline) {
  return send_frame(socket, type, payload, nullptr, 0, deadline);
}

IoResult receive_header(const Socket& socket, FrameHeader& header, Deadline deadline) {
  std::array<char, kHeaderBytes> bytes{};
  IoResult result = receive_all(socket, bytes.data(), bytes.size(), deadline);
  if (!result.ok()) return result;
  const auto type = static_cast<std::uint32_t>(get_le(bytes.data(), 4));
  header.size = get_le(bytes.data() + 4, 8);
  if (type < 1 || type > kLastType || header.size > kMaxPayloadBytes)
    return {IoStatus::failed,
            fmt::format("corrupt message header (type {}, size {})", type, header.size)};
  header.type = static_cast<MessageType>(type);
  return {};
}

IoResult receive_frame(const Socket& socket, Message& message, Deadline deadline) {
  FrameHeader header;
  IoResult result = receive_header(socket, header, deadline);
  if (!result.ok()) return result;
  message.type = header.type;
  message.payload.resize(header.size);
  return receive_all(socket, message.payload.data(), message.payload.size(), deadline);
}

IoResult discard_bytes(const Socket& socket, std::uint64_t size, Deadline deadline) {
  std::vector<char> chunk(std::min<std::uint64_t>(size, 1 << 20));
  while (size > 0) {
    const std::size_t n = std::min<std::uint64_t>(size, chunk.size());
    IoResult result = receive_all(socket, chunk.data(), n, deadline);
    if (!result.ok()) return result;
    size -= n;
  }
  return {};
}

PayloadWriter& PayloadWriter::u32(std::uint32_t value) {
  char out[4];
  put_le(out, value, 4);
  bytes_.append(out, 4);
  return *this;
}

PayloadWriter& PayloadWriter::u64(std::uint64_t value) {
  char out[8];
  put_le(out, value, 8);
  bytes_.append(out, 8);
  return *this;
}

PayloadWriter& PayloadWriter::text(std::string_view value) {
  u64(value.size());
  bytes_.append(value);
  return *this;
}

std::string_view PayloadReader::take(std::size_t size) {
  KILN_CHECK(bytes_.size() >= size, "malformed {} message: {} bytes left, {} needed", what_,
             bytes_.size(), size);
  const std::string_view head = bytes_.substr(0, size);
  bytes_.remove_prefix(size);
  return head;
}

std::uint32_t PayloadReader::u32() { return static_cast<std::uint32_t>(get_le(take(4).data(), 4)); }

std::uint64_t PayloadReader::u64() { return get_le(take(8).data(), 8); }

std::string PayloadReader::text() {
  const std::uint64_t size = u64();
  KILN_CHECK(size <= bytes_.size(), "malformed {} message: a text of {} bytes, {} left", what_,
             size, bytes_.size());
  return std::string(take(static_cast<std::size_t>(size)));
}

}  // namespace kiln::dist
