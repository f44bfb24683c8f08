// Start-up checks for data parallelism: every rank must start from rank 0's parameters and run the
// same configuration, or the replicas silently drift apart. All functions here are collectives:
// every rank calls them in the same order, and on a failure every rank throws (none is left
// waiting in a collective).
// Thread safety: training thread only, with no other collective in flight on `comm`.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"

namespace ft {

// Overwrites trainable values and buffers (BatchNorm statistics) with rank 0's, through a host
// copy when they live on a device the backend cannot read.
// REQUIRES: params allocated, same layout on every rank.
void broadcast_parameters(Communicator& comm, ParamStore& params);

// Compares a hash of `flat_config` (key, value pairs) across ranks. On a mismatch every rank throws
// ft::Error naming each differing key with rank 0's value and the other rank's value; `origin`
// (e.g. the config file path) is named in the message.
void check_same_config(Communicator& comm,
                       const std::vector<std::pair<std::string, std::string>>& flat_config,
                       const std::string& origin);

// True on every rank iff every rank's `text` hashes like rank 0's; all ranks get the same answer.
bool same_on_all_ranks(Communicator& comm, const std::string& text);

}  // namespace ft
