#include "core/cuda_versions.h"

namespace ft {
namespace {

// cudart and the driver: 1000 * major + 10 * minor.
std::string runtime_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// cuBLASLt, cuDNN 9 and NCCL 2.9 on: 10000 * major + 100 * minor + patch.
std::string library_text(int version) {
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

std::string line(const char* name, int version, std::string (*text)(int), const char* when_zero) {
  return std::string(name) + " " + (version > 0 ? text(version) : when_zero) + "\n";
}

}  // namespace

std::string describe_cuda_versions(const CudaVersions& versions) {
  return line("CUDA runtime", versions.runtime, runtime_text, "unknown") +
         line("CUDA driver", versions.driver, runtime_text, "none (no driver loaded)") +
         line("cuBLASLt", versions.cublaslt, library_text, "unknown") +
         line("cuDNN", versions.cudnn, library_text, "unknown") +
         line("NCCL", versions.nccl, library_text, "unknown");
}

}  // namespace ft
