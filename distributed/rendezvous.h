// The start of a job: rank 0 accepts a data and a control connection from every other rank,
// checking each one's hello (magic, version, world size, rank once); the others connect.
#pragma once

#include <vector>

#include "distributed/process_group.h"
#include "distributed/socket.h"

namespace kiln::dist {

// One rank's connections, indexed by peer rank: rank 0 holds a pair for every other rank,
// every other rank only [0], its pair to rank 0. Unused slots stay closed.
struct PeerConnections {
  std::vector<Socket> data;     // collectives (the caller's thread)
  std::vector<Socket> control;  // heartbeats, errors, the goodbye (the watcher's thread)
};

// Rank 0: waits until every other rank connected both channels, then welcomes them all.
// kiln::Error (after telling the connected ranks why) on a timeout or a bad hello.
PeerConnections accept_ranks(const ProcessGroupOptions& options);

// Rank > 0: connects both channels to rank 0 and waits for its welcome. kiln::Error when
// rank 0 cannot be reached before the connect timeout or rejects this rank.
PeerConnections connect_to_rank0(const ProcessGroupOptions& options);

// "1, 2" for messages about ranks.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace kiln::dist
