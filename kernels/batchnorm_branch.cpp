// The BatchNorm kernels on a BatchNormBranch (the ops' calls; batchnorm.cu has the cuda forms),
// and the device scratch they run in on cuda. The math is in batchnorm_loops.h.
#include "kernels/batchnorm.h"

namespace ft {

void ensure_batchnorm_device_scratch(BatchNormScratch& scratch, int64_t rows, int channels) {
  const int64_t chunks = (rows + kBatchNormCudaRowsPerChunk - 1) / kBatchNormCudaRowsPerChunk;
  auto ensure = [](Tensor& tensor, int64_t numel) {
    if (!tensor.defined() || tensor.numel() != numel || tensor.device() != Device::kCuda)
      tensor = Tensor::empty({numel}, Device::kCuda);
  };
  ensure(scratch.device_saved, 2 * static_cast<int64_t>(channels));
  ensure(scratch.device_partials, 2 * chunks * channels);
  ensure(scratch.device_coefficients, 3 * static_cast<int64_t>(channels));
}

void batchnorm_forward_train(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                             BatchNormScratch& scratch) {
  batchnorm_forward_train(y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var, b.x,
                          b.gamma, b.beta, rows, channels, b.momentum, b.eps, scratch);
}

void batchnorm_backward(const float* dy, const BatchNormBranch& b, int64_t rows, int channels,
                        BatchNormScratch& scratch) {
  batchnorm_backward(b.dx, b.dgamma, b.dbeta, dy, b.x, b.gamma, b.saved_mean, b.saved_invstd, rows,
                     channels, b.dx_fresh, scratch);
}

void batchnorm_forward_inference(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                 BatchNormScratch& scratch) {
  batchnorm_forward_inference(y, b.x, b.gamma, b.beta, b.running_mean, b.running_var, rows,
                              channels, b.eps, scratch);
}

}  // namespace ft
