// gemm_cuda (core/gemm.h): the process's cuBLASLt engine on the caller's stream.
#include "core/cuda/cuda_context.h"
#include "core/gemm.h"

namespace ft {

void gemm_cuda(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args, CudaStream stream) {
  cuda_context().gemm().run(c, a, b, args, stream);
}

void gemm_cuda(float* c, const float* a, const float* b, const GemmArgs& args, CudaStream stream) {
  cuda_context().gemm().run(c, a, b, args, stream);
}

}  // namespace ft
