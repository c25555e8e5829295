// ProcessGroup::join: checks the options, then either the single-process group (no socket,
// collectives are identities) or the rendezvous and the TCP group.
#include "distributed/process_group.h"

#include "core/error.h"
#include "distributed/rendezvous.h"
#include "distributed/socket.h"
#include "distributed/tcp_process_group.h"

namespace kiln::dist {

namespace {

// world_size 1: every collective returns this rank's own data.
class SingleProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string broadcast(const std::string& blob) override { return blob; }
  std::vector<std::string> all_gather(const std::string& blob) override { return {blob}; }
  void all_reduce_mean(std::span<float>) override {}
  void all_reduce_mean(std::span<double>) override {}
  void barrier() override {}
  void on_peer_failure(std::function<void(const std::string&)>) override {}
  void report_error(const std::string&) override {}
  void finish() override {}
};

void check_options(const ProcessGroupOptions& o) {
  KILN_CHECK(o.world_size >= 1, "process group: the world size is {}; it must be at least 1",
             o.world_size);
  KILN_CHECK(o.rank >= 0 && o.rank < o.world_size,
             "process group: rank {} is out of range for world size {} (ranks 0..{})", o.rank,
             o.world_size, o.world_size - 1);
  parse_host_port(o.address);
  KILN_CHECK(o.connect_timeout.count() > 0 && o.collective_timeout.count() > 0,
             "process group: the connect and collective timeouts must be positive ({} ms, {} ms)",
             o.connect_timeout.count(), o.collective_timeout.count());
  KILN_CHECK(o.heartbeat.count() > 0 && o.peer_timeout > o.heartbeat,
             "process group: the heartbeat ({} ms) must be positive and shorter than the peer "
             "timeout ({} ms)",
             o.heartbeat.count(), o.peer_timeout.count());
}

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::join(const ProcessGroupOptions& options) {
  check_options(options);
  if (options.world_size == 1) return std::make_unique<SingleProcessGroup>();
  PeerConnections connections =
      options.rank == 0 ? accept_ranks(options) : connect_to_rank0(options);
  return std::make_unique<TcpProcessGroup>(options, std::move(connections));
}

}  // namespace kiln::dist
