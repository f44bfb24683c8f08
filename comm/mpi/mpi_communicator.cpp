#include "comm/mpi/mpi_communicator.h"

#include <algorithm>

#include "comm/mpi/bf16_reduction.h"
#include "comm/mpi/fold_allreduce.h"
#include "comm/mpi/mpi_check.h"
#include "core/capture_guard.h"
#include "core/check.h"

namespace ft {

namespace {

// MPI counts are int; bigger buffers go in chunks of this many elements (1 GiB of floats).
constexpr size_t kMaxChunk = size_t{1} << 28;

void scale(float* buffer, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buffer[i] *= factor;
}

void scale(bf16_bits* buffer, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buffer[i] = float_to_bf16(bf16_to_float(buffer[i]) * factor);
}

// An in-flight allreduce over T (float or bf16_bits): native requests, or a fold with its own
// scratch area.
template <typename T>
class MpiHandle final : public CommHandle {
 public:
  MpiHandle(T* buffer, size_t count, float post_scale, CollectiveWatchdog* watchdog)
      : buffer_(buffer), count_(count), post_scale_(post_scale), watchdog_(watchdog) {}

  // MPI may still be writing the buffer, so an unwaited handle finishes here; never throws.
  ~MpiHandle() override {
    try {
      wait();
    } catch (...) {
    }
  }

  void wait() override {
    if (done_) return;
    CollectiveWatchdog::Scope watched(*watchdog_, "allreduce", count_);
    if (fold_) {
      fold_->progress(true);
    } else {
      FT_MPI_CHECK(
          MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    }
    complete();
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    if (fold_) {
      flag = fold_->progress(false) ? 1 : 0;
    } else {
      FT_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                               MPI_STATUSES_IGNORE));
    }
    if (flag) complete();
    return done_;
  }

  std::vector<MPI_Request> requests_;
  std::vector<T> scratch_;
  std::unique_ptr<FoldAllreduceOf<T>> fold_;

 private:
  void complete() {
    if (post_scale_ != 1.0f) scale(buffer_, count_, post_scale_);
    done_ = true;
  }

  T* buffer_;
  size_t count_;
  float post_scale_;
  CollectiveWatchdog* watchdog_;  // the communicator's; outlives the handle
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  FT_CHECK(initialized, "MpiCommunicator needs MPI initialised first (create an MpiRuntime)");
  FT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  // Errors come back as codes so they surface as ft::Error naming the call, not a bare abort.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm node_comm = MPI_COMM_NULL;
  FT_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm));
  MPI_Comm_rank(node_comm, &local_rank_);
  MPI_Comm_free(&node_comm);
  watchdog_ = std::make_unique<CollectiveWatchdog>(rank_);
  bf16_ = std::make_unique<Bf16Reduction>();
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  bf16_.reset();  // its own destructor checks for a finalised MPI too
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// With two ranks every algorithm computes x_0 + x_1 (addition commutes exactly), so the native
// call, with its lower latency, is already size-independent.
bool MpiCommunicator::folds(Summation summation) const {
  return summation == Summation::kRankOrder && size_ > 2;
}

MPI_Datatype MpiCommunicator::mpi_type(const float*) const {
  return MPI_FLOAT;
}
MPI_Datatype MpiCommunicator::mpi_type(const bf16_bits*) const {
  return bf16_->type();
}
MPI_Op MpiCommunicator::mpi_sum(const float*) const {
  return MPI_SUM;
}
MPI_Op MpiCommunicator::mpi_sum(const bf16_bits*) const {
  return bf16_->sum();
}
std::vector<float>& MpiCommunicator::scratch(const float*) {
  return scratch_;
}
std::vector<bf16_bits>& MpiCommunicator::scratch(const bf16_bits*) {
  return scratch_bf16_;
}

template <typename T>
void MpiCommunicator::allreduce_of(T* buffer, size_t count, const AllreduceOptions& options) {
  require_not_capturing("MpiCommunicator::allreduce (blocking)");
  FT_CHECK(buffer != nullptr || count == 0, "allreduce of ", count, " elements at nullptr");
  CollectiveWatchdog::Scope watched(*watchdog_, "allreduce", count);
  if (folds(options.summation)) {
    FoldAllreduceOf<T>(comm_, next_sequence_++, buffer, count, &scratch(buffer)).progress(true);
  } else {
    for (size_t begin = 0; begin < count; begin += kMaxChunk) {
      const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
      FT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buffer + begin, chunk, mpi_type(buffer),
                                 mpi_sum(buffer), comm_));
    }
  }
  if (options.op == ReduceOp::kAverage) scale(buffer, count, 1.0f / static_cast<float>(size_));
}

template <typename T>
std::unique_ptr<CommHandle> MpiCommunicator::allreduce_async_of(T* buffer, size_t count,
                                                                const AllreduceOptions& options) {
  FT_CHECK(buffer != nullptr || count == 0, "allreduce_async of ", count, " elements at nullptr");
  const float post_scale =
      options.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  auto handle = std::make_unique<MpiHandle<T>>(buffer, count, post_scale, watchdog_.get());
  if (folds(options.summation)) {
    handle->fold_ = std::make_unique<FoldAllreduceOf<T>>(comm_, next_sequence_++, buffer, count,
                                                         &handle->scratch_);
    handle->fold_->progress(false);  // posts the first messages
    return handle;
  }
  for (size_t begin = 0; begin < count; begin += kMaxChunk) {
    const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
    handle->requests_.emplace_back();
    FT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer + begin, chunk, mpi_type(buffer),
                                mpi_sum(buffer), comm_, &handle->requests_.back()));
  }
  return handle;
}

void MpiCommunicator::allreduce(float* buffer, size_t count, const AllreduceOptions& options) {
  allreduce_of(buffer, count, options);
}

std::unique_ptr<CommHandle> MpiCommunicator::allreduce_async(float* buffer, size_t count,
                                                             const AllreduceOptions& options) {
  return allreduce_async_of(buffer, count, options);
}

void MpiCommunicator::allreduce_bf16(bf16_bits* buffer, size_t count,
                                     const AllreduceOptions& options) {
  allreduce_of(buffer, count, options);
}

std::unique_ptr<CommHandle> MpiCommunicator::allreduce_bf16_async(bf16_bits* buffer, size_t count,
                                                                  const AllreduceOptions& options) {
  return allreduce_async_of(buffer, count, options);
}

void MpiCommunicator::broadcast(float* buffer, size_t count, int root) {
  require_not_capturing("MpiCommunicator::broadcast (blocking)");
  FT_CHECK(root >= 0 && root < size_, "broadcast root ", root, " outside [0, ", size_, ")");
  FT_CHECK(buffer != nullptr || count == 0, "broadcast of ", count, " floats at nullptr");
  CollectiveWatchdog::Scope watched(*watchdog_, "broadcast", count);
  for (size_t begin = 0; begin < count; begin += kMaxChunk) {
    const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
    FT_MPI_CHECK(MPI_Bcast(buffer + begin, chunk, MPI_FLOAT, root, comm_));
  }
}

void MpiCommunicator::barrier() {
  require_not_capturing("MpiCommunicator::barrier");
  CollectiveWatchdog::Scope watched(*watchdog_, "barrier", 0);
  FT_MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace ft
