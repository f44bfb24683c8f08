// CUDA path tests: the GELU kernels and the cuBLASLt GEMM against CPU references, cuDNN linkage,
// and the check macros. Without FT_HAVE_CUDA every test skips; built with CUDA but run without a
// GPU, the device tests skip with the runtime's reason and the host-only ones (macros, probe,
// cuDNN version) still run.
#include <gtest/gtest.h>

#ifndef FT_HAVE_CUDA

TEST(Cuda, Skipped) {
  GTEST_SKIP() << "built without CUDA (FT_CUDA=OFF or nvcc not found)";
}

#else

#include <cuda_runtime.h>  // the typed cudaMalloc<T> overloads
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda/bias_activation_kernel.h"
#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_handle.h"
#include "core/math/gelu.h"
#include "model/ops/gelu.h"

namespace ft {
namespace {

#define FT_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    if (!cuda_device_available())                                             \
      GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

// A device copy of a host vector, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    FT_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(float)));
  }
  explicit DeviceBuffer(const std::vector<float>& host) : DeviceBuffer(host.size()) {
    FT_CUDA_CHECK(
        cudaMemcpy(data_, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* get() { return data_; }
  std::vector<float> to_host() const {
    std::vector<float> host(count_);
    FT_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  float* data_ = nullptr;
  size_t count_;
};

std::vector<float> uniform(size_t count, float low, float high, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

// Largest |got - want| / max(1, |want|): absolute near zero, relative for large values.
double max_scaled_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
  }
  return worst;
}

TEST(CudaCheck, MacrosThrowWithFileLineAndLibraryMessage) {
  try {
    FT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "FT_CUDA_CHECK did not throw";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cuda_test.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaErrorInvalidValue"), std::string::npos) << message;
  }
  try {
    FT_NCCL_CHECK(ncclInvalidArgument);
    FAIL() << "FT_NCCL_CHECK did not throw";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("NCCL call"), std::string::npos) << message;
    EXPECT_NE(message.find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << message;
  }
  EXPECT_THROW(FT_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM), Error);
  EXPECT_NO_THROW(FT_CUDA_CHECK(cudaSuccess));
}

TEST(CudaCheck, DeviceProbeNeverThrowsAndExplainsAbsence) {
  bool available = true;
  EXPECT_NO_THROW(available = cuda_device_available());
  if (available) {
    EXPECT_TRUE(cuda_unavailable_reason().empty());
  } else {
    EXPECT_FALSE(cuda_unavailable_reason().empty());
  }
}

TEST(Cudnn, LinkedLibraryIsVersion9) {
  // cudnnGetVersion needs no device, so this runs on CPU-only machines too.
  EXPECT_GT(cudnn_version(), 9000u);
}

TEST(Cudnn, HandleCreatesOnDevice) {
  FT_SKIP_WITHOUT_GPU();
  CudnnHandle handle;
  EXPECT_NE(handle.get(), nullptr);
  EXPECT_NO_THROW(handle.set_stream(nullptr));
}

TEST(GeluKernel, ForwardMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  std::vector<float> input = uniform(100003, -8.0f, 8.0f, 1);
  input[0] = 0.0f;
  input[1] = -30.0f;
  input[2] = 30.0f;
  DeviceBuffer in(input), out(input.size());
  gelu_forward_cuda(out.get(), in.get(), static_cast<int64_t>(input.size()), nullptr);
  FT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(input.size());
  for (size_t i = 0; i < input.size(); ++i) want[i] = gelu_tanh(input[i]);
  // Device tanhf and FMA contraction differ from the host by a few ulp, far below 1e-6.
  EXPECT_LT(max_scaled_error(out.to_host(), want), 1e-6);
}

TEST(GeluKernel, BackwardAccumulatesIntoInputGradient) {
  FT_SKIP_WITHOUT_GPU();
  const std::vector<float> input = uniform(4099, -6.0f, 6.0f, 2);
  const std::vector<float> upstream = uniform(input.size(), -2.0f, 2.0f, 3);
  const std::vector<float> existing(input.size(), 0.25f);
  DeviceBuffer in(input), dout(upstream), din(existing);
  gelu_backward_cuda(din.get(), dout.get(), in.get(), static_cast<int64_t>(input.size()), nullptr);
  FT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    want[i] = existing[i] + upstream[i] * gelu_tanh_grad(input[i]);
  }
  EXPECT_LT(max_scaled_error(din.to_host(), want), 1e-6);
}

struct GemmCase {
  int64_t m, n, k;
  GemmOptions options;
  bool with_bias;
};

// C = act(op(A) op(B) (+ C) (+ bias)) in double, from the row-major storage the GPU sees.
std::vector<double> reference_gemm(const GemmCase& gemm, const std::vector<float>& a,
                                   const std::vector<float>& b, const std::vector<float>& bias,
                                   const std::vector<float>& c_before) {
  const int64_t M = gemm.m, N = gemm.n, K = gemm.k;
  std::vector<double> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = gemm.options.accumulate ? c_before[i * N + j] : 0.0;
      for (int64_t p = 0; p < K; ++p) {
        const double a_ip = gemm.options.transpose_a ? a[p * M + i] : a[i * K + p];
        const double b_pj = gemm.options.transpose_b ? b[j * K + p] : b[p * N + j];
        sum += a_ip * b_pj;
      }
      if (gemm.with_bias) sum += bias[j];
      if (gemm.options.activation == Activation::kRelu) sum = std::max(sum, 0.0);
      if (gemm.options.activation == Activation::kGelu) sum = gelu_tanh(static_cast<float>(sum));
      c[i * N + j] = sum;
    }
  }
  return c;
}

// Runs one case on the GPU; `bias_offset` floats shift the bias pointer off 16-byte alignment.
std::vector<float> run_gemm(CublasLtGemm& gemm, const GemmCase& test_case,
                            const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& bias, const std::vector<float>& c_before,
                            size_t bias_offset = 0) {
  DeviceBuffer a_device(a), b_device(b), c_device(c_before);
  std::vector<float> padded_bias(bias_offset, 0.0f);
  padded_bias.insert(padded_bias.end(), bias.begin(), bias.end());
  DeviceBuffer bias_device(padded_bias);
  gemm.matmul(c_device.get(), a_device.get(), b_device.get(),
              test_case.with_bias ? bias_device.get() + bias_offset : nullptr, test_case.m,
              test_case.n, test_case.k, test_case.options, nullptr);
  FT_CUDA_CHECK(cudaDeviceSynchronize());
  return c_device.to_host();
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  cases.push_back({1, 1, 1, {}, false});
  cases.push_back({17, 33, 65, {}, false});
  cases.push_back({17, 33, 65, {true, false, false, Activation::kNone}, false});
  cases.push_back({17, 33, 65, {false, true, false, Activation::kNone}, true});
  cases.push_back({64, 96, 48, {true, true, true, Activation::kNone}, false});
  cases.push_back({128, 256, 64, {false, false, false, Activation::kGelu}, true});
  cases.push_back({128, 256, 64, {false, false, false, Activation::kRelu}, true});
  cases.push_back({96, 128, 256, {false, true, true, Activation::kGelu}, true});
  cases.push_back({32, 64, 16, {false, false, false, Activation::kGelu}, false});
  return cases;
}

// Tolerance 1e-4 (scaled by max(1, |C|)) holds for true FP32 accumulation over K <= 256; TF32
// (10-bit mantissa, ~1e-3 relative per product) would fail it, which is the point: the helper
// must use CUBLAS_COMPUTE_32F, not CUBLAS_COMPUTE_32F_FAST_TF32.
constexpr double kGemmTolerance = 1e-4;

std::string describe(const GemmCase& c) {
  return detail::concat("M=", c.m, " N=", c.n, " K=", c.k, " ta=", c.options.transpose_a,
                        " tb=", c.options.transpose_b, " acc=", c.options.accumulate,
                        " act=", static_cast<int>(c.options.activation), " bias=", c.with_bias);
}

TEST(CublasLtGemm, MatchesCpuGemmForShapesTransposesAndEpilogues) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm gemm;
  uint32_t seed = 10;
  for (const GemmCase& test_case : gemm_cases()) {
    SCOPED_TRACE(describe(test_case));
    const auto a = uniform(static_cast<size_t>(test_case.m * test_case.k), -1.0f, 1.0f, ++seed);
    const auto b = uniform(static_cast<size_t>(test_case.k * test_case.n), -1.0f, 1.0f, ++seed);
    const auto bias = uniform(static_cast<size_t>(test_case.n), -1.0f, 1.0f, ++seed);
    const auto c_before =
        uniform(static_cast<size_t>(test_case.m * test_case.n), -1.0f, 1.0f, ++seed);
    const auto want = reference_gemm(test_case, a, b, bias, c_before);
    EXPECT_LT(max_scaled_error(run_gemm(gemm, test_case, a, b, bias, c_before), want),
              kGemmTolerance);
  }
}

TEST(CublasLtGemm, UnfusedEpilogueAgreesWithFusedAndCpu) {
  FT_SKIP_WITHOUT_GPU();
  const GemmCase test_case{64, 128, 96, {false, false, true, Activation::kGelu}, true};
  const auto a = uniform(64 * 96, -1.0f, 1.0f, 40), b = uniform(96 * 128, -1.0f, 1.0f, 41);
  const auto bias = uniform(128, -1.0f, 1.0f, 42), c_before = uniform(64 * 128, -1.0f, 1.0f, 43);
  const auto want = reference_gemm(test_case, a, b, bias, c_before);

  CublasLtGemm fused;
  const auto fused_result = run_gemm(fused, test_case, a, b, bias, c_before);
  CublasLtGemm unfused;
  unfused.set_fused_epilogue_enabled(false);
  const auto unfused_result = run_gemm(unfused, test_case, a, b, bias, c_before);
  EXPECT_EQ(unfused.unfused_epilogue_calls(), 1);
  EXPECT_LT(max_scaled_error(fused_result, want), kGemmTolerance);
  EXPECT_LT(max_scaled_error(unfused_result, want), kGemmTolerance);

  // A bias one float past a 16-byte boundary cannot use the fused epilogue, yet must be correct.
  CublasLtGemm misaligned;
  const auto misaligned_result = run_gemm(misaligned, test_case, a, b, bias, c_before, 1);
  EXPECT_EQ(misaligned.unfused_epilogue_calls(), 1);
  EXPECT_LT(max_scaled_error(misaligned_result, want), kGemmTolerance);
}

TEST(CublasLtGemm, CachesOnePlanPerShape) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm gemm;
  const GemmCase small{8, 16, 32, {}, false}, other{16, 16, 32, {}, false};
  const auto a = uniform(16 * 32, -1.0f, 1.0f, 50), b = uniform(32 * 16, -1.0f, 1.0f, 51);
  const std::vector<float> bias(16, 0.0f), c(16 * 16, 0.0f);
  run_gemm(gemm, small, a, b, bias, c);
  run_gemm(gemm, small, a, b, bias, c);
  EXPECT_EQ(gemm.cached_plan_count(), 1u);
  run_gemm(gemm, other, a, b, bias, c);
  EXPECT_EQ(gemm.cached_plan_count(), 2u);
}

TEST(CublasLtGemm, RejectsNonPositiveShapes) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm gemm;
  DeviceBuffer buffer(16);
  EXPECT_THROW(gemm.matmul(buffer.get(), buffer.get(), buffer.get(), nullptr, 0, 4, 4, {}, nullptr),
               Error);
}

}  // namespace
}  // namespace ft

#endif  // FT_HAVE_CUDA
