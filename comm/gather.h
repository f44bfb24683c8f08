// Small, infrequent collectives for reports such as the timeline trace, which need what the
// float-tensor Communicator interface does not offer: gathering byte strings onto one rank, and a
// clock instant that every rank can name on its own steady clock.
// Collective: every rank calls it with the same root, in the same order as its other collectives.
// Thread safety: training thread only, with no other collective in flight on `comm`.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ft {

// On `root`: every rank's `mine`, indexed by rank. On other ranks: empty.
// REQUIRES: comm is an MpiCommunicator (the only host backend); 0 <= root < comm.size().
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine, int root);

// A core/timer.h now_ms() value on each rank that marks the same instant on every rank (within
// about half the fastest round trip between rank 0 and that rank). Rank 0 ping-pongs each rank
// `rounds` times and keeps the offset of the round with the shortest round trip, the one least
// disturbed by descheduling (ranks that share cores are descheduled for milliseconds).
// REQUIRES: comm is an MpiCommunicator; rounds >= 1.
double shared_clock_zero_ms(Communicator& comm, int rounds = 50);

}  // namespace ft
