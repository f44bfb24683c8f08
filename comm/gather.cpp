#include "comm/gather.h"

#include <mpi.h>

#include <climits>

#include "comm/mpi/mpi_check.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"
#include "core/timer.h"

namespace ft {
namespace {

MpiCommunicator& as_mpi(Communicator& comm, const char* what) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  FT_CHECK(mpi != nullptr, what, " needs the mpi backend, got ", comm.backend_name());
  return *mpi;
}

}  // namespace

std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine, int root) {
  FT_CHECK(root >= 0 && root < comm.size(), "gather root ", root, " is not a rank of ",
           comm.size());
  MpiCommunicator* mpi = &as_mpi(comm, "gather_strings");
  CollectiveWatchdog::Scope watched(mpi->watchdog(), "gather", 0);
  FT_CHECK(mine.size() <= static_cast<size_t>(INT_MAX), "gather of ", mine.size(),
           " bytes exceeds MPI's int count");
  const int length = static_cast<int>(mine.size());
  const bool is_root = comm.rank() == root;
  std::vector<int> lengths(is_root ? comm.size() : 0);
  FT_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, mpi->mpi_comm()));
  std::vector<int> offsets(lengths.size());
  long long total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
  }
  FT_CHECK(total <= INT_MAX, "gather of ", total, " bytes in all exceeds MPI's int count");
  std::string all(static_cast<size_t>(total), '\0');
  FT_MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                           offsets.data(), MPI_CHAR, root, mpi->mpi_comm()));
  std::vector<std::string> strings;
  for (size_t r = 0; r < lengths.size(); ++r) strings.push_back(all.substr(offsets[r], lengths[r]));
  return strings;
}

double shared_clock_zero_ms(Communicator& comm, int rounds) {
  FT_CHECK(rounds >= 1, "shared_clock_zero_ms needs rounds >= 1, got ", rounds);
  MpiCommunicator& mpi_comm = as_mpi(comm, "shared_clock_zero_ms");
  CollectiveWatchdog::Scope watched(mpi_comm.watchdog(), "clock exchange", 0);
  const MPI_Comm mpi = mpi_comm.mpi_comm();
  constexpr int kTag = 7101;
  // offset[r] = rank r's clock minus rank 0's, at the same instant.
  std::vector<double> offsets(static_cast<size_t>(comm.size()), 0.0);
  if (comm.rank() == 0) {
    for (int peer = 1; peer < comm.size(); ++peer) {
      double best_round_trip = -1;
      for (int round = 0; round < rounds; ++round) {
        const double sent = now_ms();
        FT_MPI_CHECK(MPI_Send(&sent, 1, MPI_DOUBLE, peer, kTag, mpi));
        double peer_time = 0;
        FT_MPI_CHECK(MPI_Recv(&peer_time, 1, MPI_DOUBLE, peer, kTag, mpi, MPI_STATUS_IGNORE));
        const double received = now_ms();
        if (best_round_trip < 0 || received - sent < best_round_trip) {
          best_round_trip = received - sent;
          offsets[static_cast<size_t>(peer)] = peer_time - 0.5 * (sent + received);
        }
      }
    }
  } else {
    for (int round = 0; round < rounds; ++round) {
      double sent = 0;
      FT_MPI_CHECK(MPI_Recv(&sent, 1, MPI_DOUBLE, 0, kTag, mpi, MPI_STATUS_IGNORE));
      const double now = now_ms();
      FT_MPI_CHECK(MPI_Send(&now, 1, MPI_DOUBLE, 0, kTag, mpi));
    }
  }
  double zero_and_offset[2] = {now_ms(), 0.0};  // rank 0's zero; rank r's offset
  if (comm.rank() == 0) {
    for (int peer = 1; peer < comm.size(); ++peer) {
      zero_and_offset[1] = offsets[static_cast<size_t>(peer)];
      FT_MPI_CHECK(MPI_Send(zero_and_offset, 2, MPI_DOUBLE, peer, kTag, mpi));
    }
    return zero_and_offset[0];
  }
  FT_MPI_CHECK(MPI_Recv(zero_and_offset, 2, MPI_DOUBLE, 0, kTag, mpi, MPI_STATUS_IGNORE));
  return zero_and_offset[0] + zero_and_offset[1];
}

}  // namespace ft
