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
#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_context.h"
#include "core/cuda/cudnn_handle.h"
#include "core/gemm.h"
#include "core/math/gelu_math.h"
#include "gemm_test_util.h"
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

using gemm_test::uniform;

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
    EXPECT_NE(message.find("cuda_kernels_test.cpp:"), std::string::npos) << message;
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

// One gemm_cuda case: `args` without pointers; the runner supplies bias when with_bias, aux when
// the epilogue reads or writes it, bias_grad when it writes one.
struct GemmCase {
  std::string name;
  GemmArgs args;
  bool with_bias = false;
};

bool epilogue_uses_aux(Epilogue epilogue) {
  return epilogue == Epilogue::kGeluTanhAux || epilogue == Epilogue::kDGeluTanh ||
         epilogue == Epilogue::kDGeluTanhBiasGrad;
}
bool epilogue_writes_bias_grad(Epilogue epilogue) {
  return epilogue == Epilogue::kDGeluTanhBiasGrad || epilogue == Epilogue::kBiasGradA;
}

// Host inputs of a case, sized from its resolved strides (padding included), and its outputs.
using GemmData = gemm_test::GemmBuffers;

GemmData make_gemm_data(const GemmCase& test_case, uint32_t seed) {
  return gemm_test::make_gemm_buffers(test_case.args, seed);
}

GemmArgs with_pointers(const GemmCase& test_case, float* bias, float* aux, float* bias_grad) {
  GemmArgs args = test_case.args;
  args.bias = test_case.with_bias ? bias : nullptr;
  args.aux = epilogue_uses_aux(args.epilogue) ? aux : nullptr;
  args.bias_grad = epilogue_writes_bias_grad(args.epilogue) ? bias_grad : nullptr;
  return args;
}

GemmData run_cpu_gemm(const GemmCase& test_case, GemmData data) {
  gemm(data.c.data(), data.a.data(), data.b.data(),
       with_pointers(test_case, data.bias.data(), data.aux.data(), data.bias_grad.data()));
  return data;
}

// `bias_offset` floats shift the bias (and bias-gradient) pointers off 16-byte alignment.
GemmData run_cuda_gemm(CublasLtGemm& engine, const GemmCase& test_case, GemmData data,
                       size_t bias_offset = 0) {
  std::vector<float> padded_bias(bias_offset, 0.0f), padded_grad(bias_offset, 0.0f);
  padded_bias.insert(padded_bias.end(), data.bias.begin(), data.bias.end());
  padded_grad.insert(padded_grad.end(), data.bias_grad.begin(), data.bias_grad.end());
  DeviceBuffer a(data.a), b(data.b), c(data.c), bias(padded_bias), aux(data.aux),
      bias_grad(padded_grad);
  engine.run(
      c.get(), a.get(), b.get(),
      with_pointers(test_case, bias.get() + bias_offset, aux.get(), bias_grad.get() + bias_offset),
      nullptr);
  FT_CUDA_CHECK(cudaDeviceSynchronize());
  data.c = c.to_host();
  data.aux = aux.to_host();
  data.bias_grad = bias_grad.to_host();
  data.bias_grad.erase(data.bias_grad.begin(),
                       data.bias_grad.begin() + static_cast<std::ptrdiff_t>(bias_offset));
  return data;
}

std::vector<double> as_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// Tolerance 1e-4 (scaled by max(1, |C|)) holds for true FP32 accumulation over K <= 256; TF32
// (10-bit mantissa, ~1e-3 relative per product) would fail it, which is the point: the default
// must be CUBLAS_COMPUTE_32F, not CUBLAS_COMPUTE_32F_FAST_TF32. cuBLASLt's fused GELU and dGELU
// use tanhf where core/math/gelu_math.h uses an exp form; they agree far below 1e-4.
constexpr double kGemmTolerance = 1e-4;

// The bias gradient sums M rows of C's elements (times gelu'(aux) for dGELU), each within the
// tolerance, in cuBLASLt's order: its error grows with the rows summed. The H200 run (cuBLASLt
// 13.1) measured 1.2e-4 on "dgelu + bias grad" (M = 64); 4x the tolerance still fails TF32
// (~1e-3 relative per product).
constexpr double kBiasGradTolerance = 4;  // times the GEMM's tolerance

void expect_matches_cpu(const GemmData& got, const GemmData& want, double tolerance) {
  EXPECT_LT(max_scaled_error(got.c, as_double(want.c)), tolerance) << "C";
  EXPECT_LT(max_scaled_error(got.aux, as_double(want.aux)), tolerance) << "aux";
  EXPECT_LT(max_scaled_error(got.bias_grad, as_double(want.bias_grad)),
            kBiasGradTolerance * tolerance)
      << "bias_grad";
}

GemmCase gemm_case(std::string name, int64_t m, int64_t n, int64_t k) {
  GemmCase test_case;
  test_case.name = std::move(name);
  test_case.args.m = m;
  test_case.args.n = n;
  test_case.args.k = k;
  return test_case;
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  cases.push_back(gemm_case("1x1x1", 1, 1, 1));
  cases.push_back(gemm_case("odd shape", 17, 33, 65));
  auto add = [&](GemmCase test_case, auto&& edit) {
    edit(test_case);
    cases.push_back(test_case);
  };
  add(gemm_case("transpose a", 17, 33, 65), [](GemmCase& t) { t.args.transpose_a = true; });
  add(gemm_case("transpose b + bias", 17, 33, 65), [](GemmCase& t) {
    t.args.transpose_b = true;
    t.with_bias = true;
  });
  add(gemm_case("both transposed, accumulate", 64, 96, 48), [](GemmCase& t) {
    t.args.transpose_a = t.args.transpose_b = true;
    t.args.accumulate = true;
  });
  add(gemm_case("leading dims", 40, 24, 56), [](GemmCase& t) {
    t.args.transpose_b = true;
    t.args.lda = 56 + 3;
    t.args.ldb = 56 + 5;
    t.args.ldc = 24 + 7;
    t.with_bias = true;
  });
  add(gemm_case("packed batch of 3, alpha", 20, 12, 28), [](GemmCase& t) {
    t.args.batch = 3;
    t.args.alpha = 0.375f;
  });
  // Heads inside a [T, 4 * hd] activation: batch stride hd, row stride 4 hd (attention scores).
  add(gemm_case("head batch strides", 32, 32, 16), [](GemmCase& t) {
    t.args.batch = 4;
    t.args.transpose_b = true;
    t.args.lda = t.args.ldb = 64;
    t.args.batch_stride_a = t.args.batch_stride_b = 16;
    t.args.alpha = 0.25f;
  });
  add(gemm_case("head batch strides, accumulate into columns", 32, 16, 32), [](GemmCase& t) {
    t.args.batch = 4;
    t.args.transpose_a = true;
    t.args.ldb = t.args.ldc = 64;
    t.args.batch_stride_b = t.args.batch_stride_c = 16;
    t.args.accumulate = true;
  });
  add(gemm_case("alpha, accumulate", 33, 17, 9), [](GemmCase& t) {
    t.args.alpha = -1.5f;
    t.args.accumulate = true;
  });
  add(gemm_case("relu + bias", 128, 256, 64), [](GemmCase& t) {
    t.args.epilogue = Epilogue::kRelu;
    t.with_bias = true;
  });
  add(gemm_case("gelu + bias", 128, 256, 64), [](GemmCase& t) {
    t.args.epilogue = Epilogue::kGeluTanh;
    t.with_bias = true;
  });
  add(gemm_case("gelu", 32, 64, 16), [](GemmCase& t) { t.args.epilogue = Epilogue::kGeluTanh; });
  add(gemm_case("gelu aux + bias", 64, 128, 96), [](GemmCase& t) {
    t.args.transpose_b = true;
    t.args.epilogue = Epilogue::kGeluTanhAux;
    t.with_bias = true;
  });
  add(gemm_case("gelu aux, odd ld_aux and ldc", 30, 20, 12), [](GemmCase& t) {
    t.args.epilogue = Epilogue::kGeluTanhAux;
    t.args.ld_aux = 21;
    t.args.ldc = 23;
  });
  add(gemm_case("dgelu", 64, 128, 96), [](GemmCase& t) { t.args.epilogue = Epilogue::kDGeluTanh; });
  add(gemm_case("dgelu + bias grad", 64, 128, 96),
      [](GemmCase& t) { t.args.epilogue = Epilogue::kDGeluTanhBiasGrad; });
  // dW += dy^T x with db = colsum(dy): A = dy stored [rows, out] = [K, M].
  add(gemm_case("bias grad of A, transposed, accumulate", 96, 64, 128), [](GemmCase& t) {
    t.args.transpose_a = true;
    t.args.accumulate = true;
    t.args.epilogue = Epilogue::kBiasGradA;
  });
  add(gemm_case("bias grad of A", 48, 40, 72),
      [](GemmCase& t) { t.args.epilogue = Epilogue::kBiasGradA; });
  return cases;
}

TEST(CublasLtGemm, MatchesCpuGemmForShapesStridesBatchesAndEpilogues) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm fused, unfused;
  unfused.set_fused_epilogue_enabled(false);
  uint32_t seed = 10;
  for (const GemmCase& test_case : gemm_cases()) {
    SCOPED_TRACE(test_case.name);
    const GemmData data = make_gemm_data(test_case, seed += 10);
    const GemmData want = run_cpu_gemm(test_case, data);
    expect_matches_cpu(run_cuda_gemm(fused, test_case, data), want, kGemmTolerance);
    expect_matches_cpu(run_cuda_gemm(unfused, test_case, data), want, kGemmTolerance);
  }
}

TEST(CublasLtGemm, UnfusedEpiloguesAreCounted) {
  FT_SKIP_WITHOUT_GPU();
  GemmCase test_case = gemm_case("gelu + bias, accumulate-free", 64, 128, 96);
  test_case.args.epilogue = Epilogue::kGeluTanh;
  test_case.with_bias = true;
  const GemmData data = make_gemm_data(test_case, 40);
  const GemmData want = run_cpu_gemm(test_case, data);

  CublasLtGemm unfused;
  unfused.set_fused_epilogue_enabled(false);
  expect_matches_cpu(run_cuda_gemm(unfused, test_case, data), want, kGemmTolerance);
  EXPECT_EQ(unfused.unfused_epilogue_calls(), 1);

  // A bias one float past a 16-byte boundary cannot use the fused epilogue, yet must be correct.
  CublasLtGemm misaligned;
  expect_matches_cpu(run_cuda_gemm(misaligned, test_case, data, 1), want, kGemmTolerance);
  EXPECT_EQ(misaligned.unfused_epilogue_calls(), 1);

  // An ld_aux that is not a multiple of 8 is outside cuBLASLt's GELU_AUX contract.
  GemmCase odd_aux = gemm_case("gelu aux, ld_aux 129", 16, 128, 32);
  odd_aux.args.epilogue = Epilogue::kGeluTanhAux;
  odd_aux.args.ld_aux = 129;
  const GemmData odd_data = make_gemm_data(odd_aux, 50);
  CublasLtGemm odd_engine;
  expect_matches_cpu(run_cuda_gemm(odd_engine, odd_aux, odd_data), run_cpu_gemm(odd_aux, odd_data),
                     kGemmTolerance);
  EXPECT_EQ(odd_engine.unfused_epilogue_calls(), 1);
}

TEST(CublasLtGemm, CachesOnePlanPerShapeAndTf32Mode) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm engine;
  const GemmCase small = gemm_case("small", 8, 16, 32), other = gemm_case("other", 16, 16, 32);
  const GemmData small_data = make_gemm_data(small, 60), other_data = make_gemm_data(other, 70);
  run_cuda_gemm(engine, small, small_data);
  run_cuda_gemm(engine, small, small_data);
  EXPECT_EQ(engine.cached_plan_count(), 1u);
  run_cuda_gemm(engine, other, other_data);
  EXPECT_EQ(engine.cached_plan_count(), 2u);
  set_gemm_tf32(true);
  const GemmData tf32 = run_cuda_gemm(engine, small, small_data);
  set_gemm_tf32(false);
  EXPECT_EQ(engine.cached_plan_count(), 3u);
  // TF32 products keep ~3 decimal digits; K = 32 sums of them stay within 1e-2 of FP32.
  EXPECT_LT(max_scaled_error(tf32.c, as_double(run_cpu_gemm(small, small_data).c)), 1e-2);
}

TEST(CublasLtGemm, GemmCudaRunsOnTheContextEngine) {
  FT_SKIP_WITHOUT_GPU();
  GemmCase test_case = gemm_case("linear", 24, 40, 56);
  test_case.args.transpose_b = true;
  test_case.with_bias = true;
  GemmData data = make_gemm_data(test_case, 80);
  const GemmData want = run_cpu_gemm(test_case, data);
  DeviceBuffer a(data.a), b(data.b), c(data.c), bias(data.bias);
  gemm_cuda(c.get(), a.get(), b.get(), with_pointers(test_case, bias.get(), nullptr, nullptr),
            cuda_context().compute_stream());
  FT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(max_scaled_error(c.to_host(), as_double(want.c)), kGemmTolerance);
}

TEST(CublasLtGemm, RejectsInvalidArguments) {
  FT_SKIP_WITHOUT_GPU();
  CublasLtGemm engine;
  DeviceBuffer buffer(64);
  GemmArgs empty;
  empty.m = 0;
  empty.n = empty.k = 4;
  EXPECT_THROW(engine.run(buffer.get(), buffer.get(), buffer.get(), empty, nullptr), Error);
  GemmArgs dgelu_without_aux;
  dgelu_without_aux.m = dgelu_without_aux.n = dgelu_without_aux.k = 4;
  dgelu_without_aux.epilogue = Epilogue::kDGeluTanh;
  EXPECT_THROW(engine.run(buffer.get(), buffer.get(), buffer.get(), dgelu_without_aux, nullptr),
               Error);
}

}  // namespace
}  // namespace ft

#endif  // FT_HAVE_CUDA
