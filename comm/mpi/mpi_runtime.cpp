#include "comm/mpi/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>

#include "core/check.h"

namespace ft {

namespace {
const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}
}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv, bool initialise) {
  if (!initialise) return;
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  if (provided < MPI_THREAD_SERIALIZED) {
    if (owns_mpi_) MPI_Finalize();
    owns_mpi_ = false;
    FT_FAIL("MPI granted thread level ", thread_level_name(provided),
            " but gradient-sync overlap needs MPI_THREAD_SERIALIZED or higher; "
            "use an MPI library built with thread support");
  }
}

MpiRuntime::~MpiRuntime() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool MpiRuntime::launched_by_mpi() {
  // Open MPI's mpirun, PMIx launchers, MPICH's hydra and Slurm's PMI, MVAPICH.
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void MpiRuntime::abort(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace ft
