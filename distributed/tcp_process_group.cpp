// Collectives over the star of data connections: every other rank sends its part to rank 0,
// rank 0 checks that all called the same collective with the same sizes and answers each.
#include "distributed/tcp_process_group.h"

#include "core/error.h"

namespace kiln::dist {

namespace {

constexpr std::size_t kReduceMetaBytes = 12;  // u32 dtype, u64 element count
constexpr auto kVerdictWait = std::chrono::seconds(2);

template <typename T>
constexpr std::uint32_t dtype_code() {
  return sizeof(T) == 4 ? 1 : 2;
}

std::string dtype_name(std::uint32_t code) {
  return code == 1 ? "float32" : code == 2 ? "float64" : "unknown";
}

std::string reduce_meta(std::uint32_t dtype, std::uint64_t count) {
  PayloadWriter writer;
  writer.u32(dtype).u64(count);
  return writer.bytes();
}

}  // namespace

TcpProcessGroup::TcpProcessGroup(const ProcessGroupOptions& options, PeerConnections connections)
    : options_(options), data_(std::move(connections.data)) {
  watcher_ = std::make_unique<Watcher>(options_, std::move(connections.control));
}

TcpProcessGroup::~TcpProcessGroup() { watcher_.reset(); }

void TcpProcessGroup::begin(MessageType op) const {
  KILN_CHECK(!finished_, "rank {}: {} called after finish()", options_.rank, message_type_name(op));
  KILN_CHECK(broken_.empty(),
             "rank {}: {}: the process group is unusable after an earlier failure: {}",
             options_.rank, message_type_name(op), broken_);
}

Deadline TcpProcessGroup::collective_deadline() const {
  return deadline_after(options_.collective_timeout);
}

void TcpProcessGroup::connection_failed(MessageType op, int peer, const IoResult& result) {
  // The peer ended: its control connection says why, and the watcher ends this process with
  // that cause; this error is for when it does not (it is stopped, or the cause is unclear).
  if (result.status != IoStatus::timed_out) watcher_->wait_for_verdict(kVerdictWait);
  const std::string what =
      result.status == IoStatus::timed_out
          ? fmt::format("did not answer within {:g} s", options_.collective_timeout.count() / 1e3)
          : describe(result);
  broken_ =
      fmt::format("rank {}: {}: rank {} {}", options_.rank, message_type_name(op), peer, what);
  throw Error(broken_);
}

void TcpProcessGroup::check_sent(MessageType op, int peer, const IoResult& result) {
  if (!result.ok()) connection_failed(op, peer, result);
}

std::vector<std::string> TcpProcessGroup::gather_parts(MessageType op, const std::string& own) {
  std::vector<std::string> parts(data_.size());
  parts[0] = own;
  std::string problem;
  for (std::size_t r = 1; r < data_.size(); ++r) {
    FrameHeader header;
    IoResult got = receive_header(data_[r], header, collective_deadline());
    if (got.ok() && header.type != op) {
      if (problem.empty())
        problem = fmt::format("rank {} called {} while rank 0 called {}", r,
                              message_type_name(header.type), message_type_name(op));
      got = discard_bytes(data_[r], header.size, collective_deadline());
    } else if (got.ok()) {
      parts[r].resize(header.size);
      got = receive_all(data_[r], parts[r].data(), parts[r].size(), collective_deadline());
    }
    if (!got.ok()) connection_failed(op, static_cast<int>(r), got);
  }
  if (!problem.empty()) fail_collective(op, problem);
  return parts;
}

void TcpProcessGroup::send_to_all(MessageType op, std::string_view head, const void* body,
                                  std::size_t body_size) {
  for (std::size_t r = 1; r < data_.size(); ++r)
    check_sent(op, static_cast<int>(r),
               send_frame(data_[r], op, head, body, body_size, collective_deadline()));
}

void TcpProcessGroup::fail_collective(MessageType op, const std::string& problem) {
  for (std::size_t r = 1; r < data_.size(); ++r)
    send_frame(data_[r], MessageType::collective_error, problem, collective_deadline());
  throw Error(fmt::format("rank 0: {}: {}", message_type_name(op), problem));
}

FrameHeader TcpProcessGroup::receive_answer_header(MessageType op) {
  FrameHeader header;
  check_sent(op, 0, receive_header(data_[0], header, collective_deadline()));
  if (header.type == MessageType::collective_error) {
    std::string problem(header.size, '\0');
    check_sent(op, 0, receive_all(data_[0], problem.data(), problem.size(), collective_deadline()));
    throw Error(fmt::format("rank {}: {}: {}", options_.rank, message_type_name(op), problem));
  }
  if (header.type != op) {
    broken_ = fmt::format("rank {}: {}: rank 0 answered '{}'", options_.rank, message_type_name(op),
                          message_type_name(header.type));
    throw Error(broken_);
  }
  return header;
}

std::string TcpProcessGroup::exchange(MessageType op, const std::string& part) {
  check_sent(op, 0, send_frame(data_[0], op, part, collective_deadline()));
  const FrameHeader header = receive_answer_header(op);
  std::string answer(header.size, '\0');
  check_sent(op, 0, receive_all(data_[0], answer.data(), answer.size(), collective_deadline()));
  return answer;
}

std::string TcpProcessGroup::broadcast(const std::string& blob) {
  begin(MessageType::broadcast);
  if (options_.rank != 0) return exchange(MessageType::broadcast, "");
  gather_parts(MessageType::broadcast, "");
  send_to_all(MessageType::broadcast, blob, nullptr, 0);
  return blob;
}

std::vector<std::string> TcpProcessGroup::all_gather(const std::string& blob) {
  begin(MessageType::all_gather);
  std::vector<std::string> blobs;
  if (options_.rank == 0) {
    blobs = gather_parts(MessageType::all_gather, blob);
    PayloadWriter writer;
    writer.u64(blobs.size());
    for (const std::string& b : blobs) writer.text(b);
    send_to_all(MessageType::all_gather, writer.bytes(), nullptr, 0);
    return blobs;
  }
  const std::string answer = exchange(MessageType::all_gather, blob);
  PayloadReader reader(answer, "all_gather result");
  const std::uint64_t count = reader.u64();
  KILN_ASSERT(count == static_cast<std::uint64_t>(options_.world_size),
              "all_gather: {} blobs for world size {}", count, options_.world_size);
  for (std::uint64_t i = 0; i < count; ++i) blobs.push_back(reader.text());
  return blobs;
}

void TcpProcessGroup::barrier() {
  begin(MessageType::barrier);
  if (options_.rank != 0) {
    exchange(MessageType::barrier, "");
    return;
  }
  gather_parts(MessageType::barrier, "");
  send_to_all(MessageType::barrier, "", nullptr, 0);
}

void TcpProcessGroup::all_reduce_mean(std::span<float> data) { all_reduce_mean_impl(data); }

void TcpProcessGroup::all_reduce_mean(std::span<double> data) { all_reduce_mean_impl(data); }

template <typename T>
void TcpProcessGroup::all_reduce_mean_impl(std::span<T> data) {
  constexpr MessageType op = MessageType::all_reduce_mean;
  begin(op);
  const std::string meta = reduce_meta(dtype_code<T>(), data.size());
  if (options_.rank == 0) {
    const std::string problem = reduce_rank0(data);
    if (!problem.empty()) fail_collective(op, problem);
    send_to_all(op, meta, data.data(), data.size_bytes());
    return;
  }
  check_sent(op, 0,
             send_frame(data_[0], op, meta, data.data(), data.size_bytes(), collective_deadline()));
  const FrameHeader header = receive_answer_header(op);
  KILN_ASSERT(header.size == kReduceMetaBytes + data.size_bytes(),
              "all_reduce_mean: answer of {} bytes", header.size);
  std::string answer_meta(kReduceMetaBytes, '\0');
  check_sent(op, 0,
             receive_all(data_[0], answer_meta.data(), answer_meta.size(), collective_deadline()));
  check_sent(op, 0, receive_all(data_[0], data.data(), data.size_bytes(), collective_deadline()));
}

// Sums every rank's part in rank order (rank 0's, in `data`, first), then divides by the
// world size into `data`. Parts that do not fit are read and dropped; `data` then stays as it was.
template <typename T>
std::string TcpProcessGroup::reduce_rank0(std::span<T> data) {
  constexpr MessageType op = MessageType::all_reduce_mean;
  std::vector<T> sum(data.begin(), data.end());
  std::vector<T> part(data.size());
  std::string problem;
  for (std::size_t r = 1; r < data_.size(); ++r) {
    const int peer = static_cast<int>(r);
    FrameHeader header;
    check_sent(op, peer, receive_header(data_[r], header, collective_deadline()));
    std::string meta(std::min<std::uint64_t>(header.size, kReduceMetaBytes), '\0');
    if (header.type == op)
      check_sent(op, peer, receive_all(data_[r], meta.data(), meta.size(), collective_deadline()));
    std::string mismatch;
    if (header.type != op) {
      mismatch = fmt::format("rank {} called {} while rank 0 called {}", r,
                             message_type_name(header.type), message_type_name(op));
    } else {
      PayloadReader reader(meta, "all_reduce_mean");
      const std::uint32_t dtype = reader.u32();
      const std::uint64_t count = reader.u64();
      if (dtype != dtype_code<T>() || count != data.size() ||
          header.size != kReduceMetaBytes + data.size_bytes())
        mismatch = fmt::format("rank {} passed {} {} elements, rank 0 passed {} {} elements", r,
                               count, dtype_name(dtype), data.size(), dtype_name(dtype_code<T>()));
    }
    const std::uint64_t rest = header.size - (header.type == op ? meta.size() : 0);
    if (!mismatch.empty()) {
      if (problem.empty()) problem = mismatch;
      check_sent(op, peer, discard_bytes(data_[r], rest, collective_deadline()));
      continue;
    }
    check_sent(op, peer,
               receive_all(data_[r], part.data(), data.size_bytes(), collective_deadline()));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  const T world = static_cast<T>(options_.world_size);
  if (problem.empty())
    for (std::size_t i = 0; i < sum.size(); ++i) data[i] = sum[i] / world;
  return problem;
}

void TcpProcessGroup::on_peer_failure(std::function<void(const std::string&)> hook) {
  watcher_->add_failure_hook(std::move(hook));
}

void TcpProcessGroup::report_error(const std::string& message) { watcher_->report_error(message); }

void TcpProcessGroup::finish() {
  if (finished_) return;
  watcher_->finish(collective_deadline());
  finished_ = true;
}

}  // namespace kiln::dist
