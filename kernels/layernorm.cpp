// LayerNorm over channels, one row per token. Rows are independent in forward and in the input
// gradient (parallel over rows); the weight/bias gradients reduce over rows (serial).
#include "kernels/layernorm.h"

#include "kernels/layernorm_math.h"

namespace ft {

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t rows, int64_t channels, int64_t y_stride,
                       int64_t x_stride) {
  if (y_stride == 0) y_stride = channels;
  if (x_stride == 0) x_stride = channels;
#pragma omp parallel for if (rows * channels > 65536)
  for (int64_t row = 0; row < rows; ++row)
    layernorm_row_forward(y + row * y_stride, mean + row, rstd + row, x + row * x_stride, weight,
                          bias, channels, kLayerNormEps);
}

void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t rows,
                        int64_t channels, int64_t dy_stride, int64_t x_stride) {
  if (dy_stride == 0) dy_stride = channels;
  if (x_stride == 0) x_stride = channels;
#pragma omp parallel for if (rows * channels > 65536)
  for (int64_t row = 0; row < rows; ++row)
    layernorm_row_backward_input(dx + row * x_stride, dy + row * dy_stride, x + row * x_stride,
                                 weight, mean[row], rstd[row], channels);
  for (int64_t row = 0; row < rows; ++row)
    layernorm_row_backward_params(dweight, dbias, dy + row * dy_stride, x + row * x_stride,
                                  mean[row], rstd[row], channels);
}

}  // namespace ft
