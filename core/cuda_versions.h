// CudaVersions: the CUDA runtime, driver, cuBLASLt, cuDNN and NCCL versions this process actually
// loaded, for the start of a cuda run, `fusiontrain --version` and the GPU check's summary. A
// binary built against one CUDA release may load another's libraries on a GPU image, and a
// failure there is read first against these lines. The text form needs no CUDA, so it is tested
// on every machine; the query lives in core/cuda/cuda_versions.cpp.
// Thread safety: values; loaded_cuda_versions() may be called from any thread.
#pragma once
#include <string>

namespace ft {

// Each library's own integer encoding, as its get-version call returns it; 0 = not known.
struct CudaVersions {
  int runtime = 0;   // cudaRuntimeGetVersion: 1000 * major + 10 * minor (13000 = 13.0)
  int driver = 0;    // cudaDriverGetVersion, same encoding; 0 when no driver is installed
  int cublaslt = 0;  // cublasLtGetVersion: 10000 * major + 100 * minor + patch
  int cudnn = 0;     // cudnnGetVersion (cuDNN 9): 10000 * major + 100 * minor + patch
  int nccl = 0;      // ncclGetVersion (NCCL >= 2.9): 10000 * major + 100 * minor + patch
};

// One line each, e.g. "CUDA runtime 13.0", "CUDA driver none (no driver loaded)",
// "cuBLASLt 13.1.0", "cuDNN 9.13.0", "NCCL 2.28.3".
std::string describe_cuda_versions(const CudaVersions& versions);

// REQUIRES: a build with the CUDA path (FT_HAVE_CUDA). Needs no GPU: each call only asks the
// loaded library (the driver's version reads 0 without a driver). Never throws.
CudaVersions loaded_cuda_versions();

}  // namespace ft
