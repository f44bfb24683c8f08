// `fusiontrain bandwidth`: an nccl-tests-style allreduce sweep over the active Communicator, to see
// what bucketing buys. Two tables: (1) message sizes doubling from min_bytes to max_bytes with
// time, algbw = bytes / time, busbw = algbw * 2(n-1)/n and utilization = busbw / peak, for the
// library's native allreduce and, beside it, for rank-order sums (comm.deterministic: true) with
// their slowdown; (2) the fusion table (native): k = 4 messages of s bytes sent one after another
// vs one fused message of k*s, for s in {1, 8, 128} MiB (those with k*s <= max_bytes), with time,
// utilization and their ratio. Bandwidths are GB/s = 1e9 bytes/s. Times are per iteration: the
// two timings of a row run interleaved (so both see the same load on a shared machine), the
// median over iterations, averaged over ranks. Rank 0 prints the tables to stdout and writes the
// JSON; every rank must call run_bandwidth. Thread safety: a collective job run from main() on
// every rank.
#pragma once
#include <cstdint>
#include <string>

#include "comm/comm_dtype.h"
#include "comm/communicator.h"

namespace ft {

// The largest --min-bytes / --max-bytes: far above where busbw levels off, and small enough that
// a typo fails on the flag instead of in an allocation on every rank.
inline constexpr int64_t kBandwidthMaxMessageBytes = int64_t{8} << 30;

struct BandwidthArgs {
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 512LL << 20;
  int warmup = 5;         // per size; messages above 16 MiB use at most one
  int iters = 20;         // per size; messages above 16 MiB use iters * 16 MiB / size, at least 2
  std::string json_path;  // empty = no JSON
  // Peak for utilization, GB/s (1e9 bytes/s). 0 = measure: host memory bandwidth as the bytes per
  // second one rank's memcpy moves while every rank copies at once (the shared-memory transport
  // is made of such copies).
  double peak_gbps = 0;
  // mpi: host buffers (or, with device cuda, device buffers staged through pinned host memory, as
  // GradSync does when ranks share a GPU); nccl: device buffers, one GPU per rank, 1 rank allowed.
  std::string backend = "mpi";
  std::string device = "cpu";  // cpu | cuda; nccl implies cuda
  // fp32 | bf16, as comm.grad_dtype: the element type reduced; sizes stay in bytes, so a bf16
  // row reduces twice the elements of the fp32 row of the same size.
  std::string dtype = "fp32";
};

// Returns 0. Throws ft::Error on bad arguments (naming the flag), on fewer than 2 ranks (mpi), on
// no usable GPU (cuda, nccl), or on a wrong allreduce result. `comm` is the MPI communicator: it
// carries the bookkeeping (barriers, averaging times), and the timed collectives for mpi.
int run_bandwidth(Communicator& comm, const BandwidthArgs& args);

}  // namespace ft
