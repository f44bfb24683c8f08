#include "comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "core/check.h"

namespace ft {

namespace {

// MPI counts are int; bigger buffers go in chunks of this many floats (1 GiB each).
constexpr size_t kMaxChunk = size_t{1} << 28;

// Returns MPI's own text for `code` so a failure names what went wrong.
std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

#define FT_MPI_CHECK(call)                                                          \
  do {                                                                              \
    const int ft_mpi_code = (call);                                                 \
    FT_CHECK(ft_mpi_code == MPI_SUCCESS, #call, ": ", mpi_error_text(ft_mpi_code)); \
  } while (0)

void scale(float* buffer, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buffer[i] *= factor;
}

class MpiHandle final : public CommHandle {
 public:
  MpiHandle(std::vector<MPI_Request> requests, float* buffer, size_t count, float post_scale)
      : requests_(std::move(requests)), buffer_(buffer), count_(count), post_scale_(post_scale) {}
  // The buffer may not be released while MPI still writes it, so an unwaited handle waits here.
  ~MpiHandle() override {
    if (!done_)
      MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  void wait() override {
    if (done_) return;
    FT_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    complete();
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    FT_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                             MPI_STATUSES_IGNORE));
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    if (post_scale_ != 1.0f) scale(buffer_, count_, post_scale_);
    done_ = true;
  }

  std::vector<MPI_Request> requests_;
  float* buffer_;
  size_t count_;
  float post_scale_;
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
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(float* buffer, size_t count, ReduceOp op) {
  FT_CHECK(buffer != nullptr || count == 0, "allreduce of ", count, " floats at nullptr");
  for (size_t begin = 0; begin < count; begin += kMaxChunk) {
    const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
    FT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buffer + begin, chunk, MPI_FLOAT, MPI_SUM, comm_));
  }
  if (op == ReduceOp::kAverage) scale(buffer, count, 1.0f / static_cast<float>(size_));
}

std::unique_ptr<CommHandle> MpiCommunicator::allreduce_async(float* buffer, size_t count,
                                                             ReduceOp op) {
  FT_CHECK(buffer != nullptr || count == 0, "allreduce_async of ", count, " floats at nullptr");
  std::vector<MPI_Request> requests;
  for (size_t begin = 0; begin < count; begin += kMaxChunk) {
    const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
    requests.emplace_back();
    FT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer + begin, chunk, MPI_FLOAT, MPI_SUM, comm_,
                                &requests.back()));
  }
  const float post_scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(size_) : 1.0f;
  return std::make_unique<MpiHandle>(std::move(requests), buffer, count, post_scale);
}

void MpiCommunicator::broadcast(float* buffer, size_t count, int root) {
  FT_CHECK(root >= 0 && root < size_, "broadcast root ", root, " outside [0, ", size_, ")");
  FT_CHECK(buffer != nullptr || count == 0, "broadcast of ", count, " floats at nullptr");
  for (size_t begin = 0; begin < count; begin += kMaxChunk) {
    const int chunk = static_cast<int>(std::min(kMaxChunk, count - begin));
    FT_MPI_CHECK(MPI_Bcast(buffer + begin, chunk, MPI_FLOAT, root, comm_));
  }
}

void MpiCommunicator::barrier() {
  FT_MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace ft
