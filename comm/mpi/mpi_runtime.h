// MpiRuntime: owns MPI's process-wide lifetime (MPI_Init_thread in the constructor, MPI_Finalize in
// the destructor) for main() of the app and of the MPI tests. It asks for MPI_THREAD_SERIALIZED,
// which is what the gradient-sync overlap needs: the communication thread makes MPI calls while
// the training thread makes none, and the two hand over through a mutex (see comm/comm_thread.h).
// Thread safety: construct and destroy on the main thread only; abort() is safe from any thread.
#pragma once

namespace ft {

class MpiRuntime {
 public:
  // Initialises MPI unless it already is (then this object neither initialises nor finalises).
  // Throws ft::Error when MPI grants less than MPI_THREAD_SERIALIZED. With initialise false, MPI
  // is never called: one rank (0 of 1), nothing to finalise.
  MpiRuntime(int* argc, char*** argv, bool initialise = true);
  // Calls MPI_Finalize when this object initialised MPI; never throws.
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // Ends every rank of the job now (MPI_Abort on MPI_COMM_WORLD): a rank that hit an error must
  // not leave the others waiting forever inside a collective. Does not return.
  [[noreturn]] static void abort(int code);

  // True when an MPI launcher started this process (mpirun, srun, mpiexec: their rank variables
  // are set). A plain process need not initialise MPI: Open MPI's singleton start forks a daemon,
  // which fails on a machine with the library but no runtime (a GPU box without Open MPI).
  static bool launched_by_mpi();

 private:
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
};

}  // namespace ft
