// NCCL communicator: setup over MPI, collectives on a private stream ordered by CUDA events.
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>  // the typed cudaMalloc<T> overloads
#include <mpi.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "core/capture_guard.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"

namespace ft {
namespace {

int world_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  FT_CHECK(initialized != 0, "the NCCL communicator needs MPI_Init to have run first");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Every rank learns whether every rank succeeded, so one rank's failure cannot leave the others
// blocked in the next collective. Throws on every rank when any failed.
void agree_or_throw(bool local_ok, const std::string& local_error, const char* step) {
  int ok = local_ok ? 1 : 0;
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_ok == 1) return;
  if (!local_ok) throw Error(local_error);
  FT_FAIL("NCCL communicator: another rank failed during ", step, "; see its error");
}

// The PCI bus id names a physical GPU, whichever CUDA_VISIBLE_DEVICES each rank was given.
constexpr int kBusIdLength = 32;
struct DeviceChoice {
  int device = 0;
  char bus_id[kBusIdLength] = {};
};

// This process's GPU: its CUDA context's device, made current on this thread for NCCL.
DeviceChoice context_device() {
  DeviceChoice choice;
  choice.device = cuda_context().device_index();
  FT_CUDA_CHECK(cudaSetDevice(choice.device));
  FT_CUDA_CHECK(cudaDeviceGetPCIBusId(choice.bus_id, kBusIdLength, choice.device));
  return choice;
}

// This rank's index among the ranks of its machine; `error` is set when another of them drives
// the same GPU, which NCCL rejects with a less helpful message. Collective over MPI_COMM_WORLD.
int node_local_rank(const DeviceChoice& choice, std::string* error) {
  const int rank = world_rank();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  std::vector<char> bus_ids(static_cast<size_t>(local_size) * kBusIdLength);
  MPI_Allgather(choice.bus_id, kBusIdLength, MPI_CHAR, bus_ids.data(), kBusIdLength, MPI_CHAR,
                node);
  MPI_Comm_free(&node);
  for (int other = 0; other < local_size; ++other) {
    const std::string other_bus(&bus_ids[static_cast<size_t>(other) * kBusIdLength]);
    if (other == local_rank || other_bus != choice.bus_id) continue;
    *error = detail::concat("rank ", rank, " (local rank ", local_rank, ") and local rank ", other,
                            " both drive GPU ", other_bus, " (CUDA device ", choice.device, "); ",
                            local_size, " ranks share this machine's GPUs, but NCCL needs one GPU ",
                            "per rank: run at most one rank per GPU or use comm.backend: mpi");
    break;
  }
  return local_rank;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
  }
  FT_FAIL("NCCL communicator: unknown ReduceOp ", static_cast<int>(op),
          " (allowed: kSum, kAverage)");
}

void check_device_buffer(const void* buffer, size_t count, const char* call) {
  if (count == 0) return;
  FT_CHECK(buffer != nullptr, call, ": null buffer with count = ", count);
  cudaPointerAttributes attributes{};
  FT_CUDA_CHECK(cudaPointerGetAttributes(&attributes, buffer));
  FT_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
           call, ": buffer ", buffer,
           " is not CUDA device memory (the NCCL backend reduces device buffers; "
           "use the MPI backend for host buffers)");
}

// The completion of one async collective. Owns its event.
class NcclHandle : public CommHandle {
 public:
  NcclHandle(cudaEvent_t done, cudaStream_t compute_stream)
      : done_(done), compute_stream_(compute_stream) {}
  ~NcclHandle() override { cudaEventDestroy(done_); }  // safe while pending; errors ignored
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  void wait() override { FT_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done_, 0)); }
  // Blocks the host until the collective has finished on the device.
  void synchronize() { FT_CUDA_CHECK(cudaEventSynchronize(done_)); }

  bool test() override {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is an answer, not an error; keep it out of later checks
      return false;
    }
    FT_CUDA_CHECK(status);
    return true;
  }

 private:
  cudaEvent_t done_;
  cudaStream_t compute_stream_;
};

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(cudaStream_t compute_stream) : compute_stream_(compute_stream) {
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override { release(); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend_name() const override { return "nccl"; }
  Device buffer_device() const override { return Device::kCuda; }

  void allreduce(float* buffer, size_t count, const AllreduceOptions& options) override {
    require_not_capturing("NcclCommunicator::allreduce (blocking)");
    auto handle =
        start_allreduce(buffer, count, ncclFloat32, options, "NcclCommunicator::allreduce");
    handle->wait();
    handle->synchronize();
  }

  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                              const AllreduceOptions& options) override {
    return start_allreduce(buffer, count, ncclFloat32, options,
                           "NcclCommunicator::allreduce_async");
  }

  // NCCL's bf16 reductions add in fp32 and round to bf16 at each step, as the interface asks.
  void allreduce_bf16(bf16_bits* buffer, size_t count, const AllreduceOptions& options) override {
    require_not_capturing("NcclCommunicator::allreduce_bf16 (blocking)");
    auto handle =
        start_allreduce(buffer, count, ncclBfloat16, options, "NcclCommunicator::allreduce_bf16");
    handle->wait();
    handle->synchronize();
  }

  std::unique_ptr<CommHandle> allreduce_bf16_async(bf16_bits* buffer, size_t count,
                                                   const AllreduceOptions& options) override {
    return start_allreduce(buffer, count, ncclBfloat16, options,
                           "NcclCommunicator::allreduce_bf16_async");
  }

  void broadcast(float* buffer, size_t count, int root) override {
    require_not_capturing("NcclCommunicator::broadcast (blocking)");
    FT_CHECK(root >= 0 && root < size_, "NcclCommunicator::broadcast: root ", root,
             " is outside [0, ", size_, ")");
    check_device_buffer(buffer, count, "NcclCommunicator::broadcast");
    auto handle = enqueue_after_compute([&] {
      if (count == 0) return;
      FT_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, ncclFloat32, root, comm_, comm_stream_));
    });
    handle->wait();
    handle->synchronize();
  }

  // NCCL has no barrier; a one-float allreduce completes only once every rank has joined it.
  void barrier() override {
    require_not_capturing("NcclCommunicator::barrier");
    FT_NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_,
                                comm_stream_));
    FT_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
  }

 private:
  void init() {
    rank_ = world_rank();
    MPI_Comm_size(MPI_COMM_WORLD, &size_);

    std::string error;
    DeviceChoice choice;
    try {
      choice = context_device();
    } catch (const std::exception& caught) {
      error = caught.what();
    }
    agree_or_throw(error.empty(), error, "device selection");
    local_rank_ = node_local_rank(choice, &error);
    agree_or_throw(error.empty(), error, "device selection");

    // The id is a plain byte blob; a status rides along so a failure on rank 0 reaches everyone.
    struct {
      int ok;
      ncclUniqueId id;
    } setup{};
    if (rank_ == 0) {
      const ncclResult_t status = ncclGetUniqueId(&setup.id);
      setup.ok = status == ncclSuccess ? 1 : 0;
      if (setup.ok == 0)
        error = cuda_error_message(CudaLibrary::kNccl, status, "ncclGetUniqueId(&id)", __FILE__,
                                   __LINE__);
    }
    MPI_Bcast(&setup, sizeof(setup), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (setup.ok == 0) {
      if (rank_ == 0) throw Error(error);
      FT_FAIL("NCCL communicator: rank 0 could not create the NCCL unique id; see its error");
    }

    FT_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    FT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    FT_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
    FT_CUDA_CHECK(cudaMemset(barrier_scratch_, 0, sizeof(float)));
    FT_NCCL_CHECK(ncclCommInitRank(&comm_, size_, setup.id, rank_));
  }

  void release() noexcept {
    if (comm_stream_ != nullptr) cudaStreamSynchronize(comm_stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
    if (compute_ready_ != nullptr) cudaEventDestroy(compute_ready_);
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
    comm_ = nullptr;
    barrier_scratch_ = nullptr;
    compute_ready_ = nullptr;
    comm_stream_ = nullptr;
  }

  // `buffer` holds `count` elements of `type` (ncclFloat32 or ncclBfloat16).
  std::unique_ptr<NcclHandle> start_allreduce(void* buffer, size_t count, ncclDataType_t type,
                                              const AllreduceOptions& options, const char* call) {
    FT_CHECK(options.summation == Summation::kNative, call,
             ": rank-order summation (comm.deterministic: true) needs the mpi backend");
    check_device_buffer(buffer, count, call);
    const ncclRedOp_t reduce_op = nccl_op(options.op);
    return enqueue_after_compute([&] {
      if (count == 0) return;
      FT_NCCL_CHECK(ncclAllReduce(buffer, buffer, count, type, reduce_op, comm_, comm_stream_));
    });
  }

  // Orders `enqueue` (work on comm_stream_) after everything already on the compute stream and
  // returns a handle on its completion.
  template <typename Enqueue>
  std::unique_ptr<NcclHandle> enqueue_after_compute(Enqueue enqueue) {
    cudaEvent_t done = nullptr;
    FT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    auto handle = std::make_unique<NcclHandle>(done, compute_stream_);  // owns `done` from here
    // One compute_ready_ event serves every call: the wait captures the event's state when it is
    // enqueued, so re-recording it later cannot affect an earlier wait.
    FT_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_stream_));
    FT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0));
    enqueue();
    FT_CUDA_CHECK(cudaEventRecord(done, comm_stream_));
    return handle;
  }

  cudaStream_t compute_stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  float* barrier_scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(cudaStream_t compute_stream) {
  return std::make_unique<NcclCommunicator>(compute_stream);
}

}  // namespace ft
