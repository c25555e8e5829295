// The ProcessGroup of world size > 1: collectives over a star of TCP connections through
// rank 0 (which sums in rank order, so every rank gets the same bits) and the failure watcher.
#pragma once

#include <memory>

#include "distributed/message.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "distributed/watcher.h"

namespace kiln::dist {

class TcpProcessGroup final : public ProcessGroup {
 public:
  // Takes over the connections of a finished rendezvous and starts the watcher.
  TcpProcessGroup(const ProcessGroupOptions& options, PeerConnections connections);
  ~TcpProcessGroup() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string broadcast(const std::string& blob) override;
  std::vector<std::string> all_gather(const std::string& blob) override;
  void all_reduce_mean(std::span<float> data) override;
  void all_reduce_mean(std::span<double> data) override;
  void barrier() override;
  void on_peer_failure(std::function<void(const std::string&)> hook) override;
  void report_error(const std::string& message) override;
  void finish() override;

 private:
  void begin(MessageType op) const;
  Deadline collective_deadline() const;
  [[noreturn]] void connection_failed(MessageType op, int peer, const IoResult& result);
  void check_sent(MessageType op, int peer, const IoResult& result);
  // Rank 0: every other rank's part of `op`, in rank order ([0] is `own`); kiln::Error (on
  // every rank) when one rank called another collective.
  std::vector<std::string> gather_parts(MessageType op, const std::string& own);
  void send_to_all(MessageType op, std::string_view head, const void* body, std::size_t body_size);
  [[noreturn]] void fail_collective(MessageType op, const std::string& problem);
  // Ranks > 0: sends this rank's part of `op` and returns rank 0's answer.
  std::string exchange(MessageType op, const std::string& part);
  // Ranks > 0: reads the header of rank 0's answer; throws for a collective_error.
  FrameHeader receive_answer_header(MessageType op);
  template <typename T>
  void all_reduce_mean_impl(std::span<T> data);
  template <typename T>
  std::string reduce_rank0(std::span<T> data);  // the first problem, or ""

  const ProcessGroupOptions options_;
  std::vector<Socket> data_;          // as PeerConnections::data
  std::unique_ptr<Watcher> watcher_;  // declared after data_: stopped first
  bool finished_ = false;
  std::string broken_;  // why the data connections are out of step (then every call throws)
};

}  // namespace kiln::dist
