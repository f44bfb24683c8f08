// NCCL communicator tests over real MPI ranks (one GPU per rank). ctest runs this file under
// mpirun with 2 and 3 ranks; on a machine with fewer GPUs than ranks per node the communicator
// tests skip on every rank together, and NcclSharedGpu checks the error such a run gets instead.
// scripts/gpu_check.sh also runs it as a single rank, which works on one GPU.
// Own main(): MPI must be initialised before the communicator and finalised after the tests.
#include <gtest/gtest.h>
#include <mpi.h>

#ifndef FT_HAVE_CUDA

TEST(Nccl, Skipped) {
  GTEST_SKIP() << "built without CUDA (FT_CUDA=OFF or nvcc not found)";
}

#else

#include <cuda_runtime.h>  // the typed cudaMalloc<T> overloads

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"

namespace ft {
namespace {

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// True when `local` holds on every rank, so that all ranks take the same branch into the
// collectives that follow (none waits in one alone).
bool on_every_rank(bool local) {
  int ok = local ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all_ok == 1;
}

int ranks_on_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int ranks = 0;
  MPI_Comm_size(node, &ranks);
  MPI_Comm_free(&node);
  return ranks;
}

int device_count() {
  int devices = 0;
  FT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  return devices;
}

// Why this run cannot test NCCL, agreed by all ranks; empty when it can.
std::string skip_reason() {
  std::string reason;
  if (!cuda_device_available()) {
    reason = "no usable CUDA device: " + cuda_unavailable_reason();
  } else if (ranks_on_node() > device_count()) {
    reason = detail::concat(ranks_on_node(), " ranks share ", device_count(),
                            " GPU(s) on this node; NCCL needs one GPU per rank");
  }
  if (!on_every_rank(reason.empty()) && reason.empty()) reason = "another rank cannot run NCCL";
  return reason;
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  // The trainer's path: the host communicator's local rank picks the device (setup_device), the
  // CUDA context is made on it, and NCCL runs on the context's device and compute stream.
  static void SetUpTestSuite() {
    skip_reason_ = new std::string(skip_reason());
    if (!skip_reason_->empty()) return;
    local_rank_ = MpiCommunicator().local_rank();
    select_cuda_device(local_rank_);
    compute_stream_ = cuda_context().compute_stream();
    communicator_ = make_nccl_communicator(compute_stream_).release();
  }
  static void TearDownTestSuite() {
    delete communicator_;
    communicator_ = nullptr;
    compute_stream_ = nullptr;  // the context's, never destroyed
    delete skip_reason_;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (!skip_reason_->empty()) GTEST_SKIP() << *skip_reason_;
  }

  // Rank r holds (r + 1) + 0.5 i: small integers and halves, so every sum is exact in float.
  static std::vector<float> rank_values(int rank, size_t count) {
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(rank + 1) + 0.5f * i;
    return values;
  }

  static float* to_device(const std::vector<float>& host) {
    float* device = nullptr;
    FT_CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(float)));
    FT_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, compute_stream_));
    return device;
  }

  static std::vector<float> to_host(const float* device, size_t count) {
    std::vector<float> host(count);
    FT_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, count * sizeof(float),
                                  cudaMemcpyDeviceToHost, compute_stream_));
    FT_CUDA_CHECK(cudaStreamSynchronize(compute_stream_));
    return host;
  }

  static std::string* skip_reason_;
  static int local_rank_;
  static cudaStream_t compute_stream_;
  static Communicator* communicator_;
};

std::string* NcclCommunicatorTest::skip_reason_ = nullptr;
int NcclCommunicatorTest::local_rank_ = 0;
cudaStream_t NcclCommunicatorTest::compute_stream_ = nullptr;
Communicator* NcclCommunicatorTest::communicator_ = nullptr;

TEST_F(NcclCommunicatorTest, ReportsWorldShape) {
  EXPECT_EQ(communicator_->rank(), world_rank());
  EXPECT_EQ(communicator_->size(), world_size());
  EXPECT_STREQ(communicator_->backend_name(), "nccl");
  EXPECT_EQ(communicator_->local_rank(), local_rank_);
  // One device-selection path: NCCL drives the context's device, which the local rank chose.
  int device = -1;
  FT_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(device, cuda_context().device_index());
  EXPECT_EQ(device, local_rank_);  // skip_reason() ensured a GPU per rank of this machine
}

TEST_F(NcclCommunicatorTest, AllreduceSumsAcrossRanks) {
  const size_t count = 1000;
  const int size = world_size();
  float* buffer = to_device(rank_values(world_rank(), count));
  communicator_->allreduce(buffer, count, ReduceOp::kSum);
  const std::vector<float> got = to_host(buffer, count);
  cudaFree(buffer);
  for (size_t i = 0; i < count; ++i) {
    const float want = static_cast<float>(size * (size + 1) / 2) + size * 0.5f * i;
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

TEST_F(NcclCommunicatorTest, AsyncAllreduceAveragesAfterWait) {
  const size_t count = (size_t{1} << 20) + 3;  // large enough to stay in flight for a while
  const int size = world_size();
  float* buffer = to_device(rank_values(world_rank(), count));
  auto handle = communicator_->allreduce_async(buffer, count, ReduceOp::kAverage);
  handle->wait();
  const std::vector<float> got = to_host(buffer, count);  // ordered after wait() on the stream
  EXPECT_TRUE(handle->test());  // the compute stream waited for it and has drained
  cudaFree(buffer);
  for (size_t i = 0; i < count; i += 997) {
    const float want = static_cast<float>(size + 1) / 2.0f + 0.5f * i;
    ASSERT_FLOAT_EQ(got[i], want) << "element " << i;
  }
}

TEST_F(NcclCommunicatorTest, BroadcastCopiesRootBuffer) {
  const size_t count = 257;
  const int root = world_size() - 1;
  float* buffer = to_device(rank_values(world_rank(), count));
  communicator_->broadcast(buffer, count, root);
  const std::vector<float> got = to_host(buffer, count);
  cudaFree(buffer);
  EXPECT_EQ(got, rank_values(root, count));
}

TEST_F(NcclCommunicatorTest, RejectsHostBuffersAndBadRoots) {
  std::vector<float> host(8, 1.0f);
  EXPECT_THROW(communicator_->allreduce(host.data(), host.size(), ReduceOp::kSum), Error);
  float* device = to_device(host);
  EXPECT_THROW(communicator_->broadcast(device, host.size(), world_size()), Error);
  cudaFree(device);
  EXPECT_NO_THROW(communicator_->barrier());
}

// More ranks than GPUs on a machine (ctest's 2 and 3 ranks on a one-GPU machine): the ranks pick
// their devices as the trainer does, so some share one, and creating the communicator fails on
// every rank with the reason rather than with NCCL's own error, or a hang.
TEST(NcclSharedGpu, FailsOnEveryRankWithTheReason) {
  const bool shared = cuda_device_available() && ranks_on_node() > device_count();
  if (!on_every_rank(shared)) GTEST_SKIP() << "every rank has a GPU of its own, or none is usable";
  select_cuda_device(MpiCommunicator().local_rank());
  std::string message;
  try {
    make_nccl_communicator(cuda_context().compute_stream());
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_TRUE(message.find("NCCL needs one GPU per rank") != std::string::npos ||
              message.find("another rank failed during device selection") != std::string::npos)
      << "rank " << world_rank() << ": '" << message << "'";
}

}  // namespace
}  // namespace ft

#endif  // FT_HAVE_CUDA

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Only rank 0 prints, so mpirun's output reads as one test run.
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
