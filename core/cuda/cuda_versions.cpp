// The versions of the CUDA libraries this process loaded (core/cuda_versions.h).
#include "core/cuda_versions.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

namespace ft {

CudaVersions loaded_cuda_versions() {
  CudaVersions versions;
  // Each call's status is ignored: a version it cannot read stays 0 and prints as unknown.
  if (cudaRuntimeGetVersion(&versions.runtime) != cudaSuccess) versions.runtime = 0;
  if (cudaDriverGetVersion(&versions.driver) != cudaSuccess) versions.driver = 0;
  versions.cublaslt = static_cast<int>(cublasLtGetVersion());
  versions.cudnn = static_cast<int>(cudnnGetVersion());
  if (ncclGetVersion(&versions.nccl) != ncclSuccess) versions.nccl = 0;
  return versions;
}

}  // namespace ft
