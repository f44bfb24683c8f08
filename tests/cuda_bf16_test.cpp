// train.precision: bf16 on a GPU, its building blocks: gemm_cuda with bf16 operands against the
// CPU fp32 GEMM of the same bf16-rounded operands (the products of bf16 values are exact in fp32,
// so the two differ only in accumulation order) for every epilogue, strided batches and views
// that are only 2-byte aligned; on CUDA also with every epilogue unfused and with one plan per
// operand dtype; bf16 tensor fills; and the bf16 weight copies: the refresh kernel, and the
// multi-tensor AdamW and SGD writing them as they update the masters (both bit for bit the
// rounding of core/math/bf16_math.h). The ops' bf16 paths are tests/cuda_bf16_ops_test.cpp.
// Tolerance: 1e-4 of max(1, |expected|), as tests/cuda_kernels_test.cpp's fp32 GEMMs (K <= 128;
// cuBLASLt's fused GELU uses tanhf where core/math/gelu_math.h uses an exp form, far below that).
// Skips without a usable device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/math/bf16_math.h"
#include "cuda_test_util.h"
#include "fusion/multi_tensor.h"
#include "gemm_test_util.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/params.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_context.h"
#endif

namespace ft {
namespace {

constexpr double kTolerance = 1e-4;

using gemm_test::rounded;
using gemm_test::to_bf16;

// A tensor on `device` holding `host` (copied), `offset` elements into its storage: a view whose
// address is only as aligned as the offset makes it.
template <typename T>
struct DeviceArray {
  DeviceArray(std::vector<T> host, Device device, int64_t offset = 0) {
    host.insert(host.begin(), static_cast<size_t>(offset), T{});
    const DType dtype = sizeof(T) == 2 ? DType::kBF16 : DType::kF32;
    const int64_t count = static_cast<int64_t>(host.size());
    storage = Tensor::empty({std::max<int64_t>(count, 1)}, device, dtype);
    if (count > 0) storage.rows(0, count).copy_from(Tensor::wrap(host.data(), {count}));
    at = offset;
  }
  T* get() {
    if constexpr (sizeof(T) == 2)
      return storage.bf16_data() + at;
    else
      return storage.data() + at;
  }
  std::vector<float> to_host() const {
    std::vector<float> all = storage.to_host_vector();
    return std::vector<float>(all.begin() + at, all.end());
  }
  Tensor storage;
  int64_t at = 0;
};

struct Bf16GemmCase {
  std::string name;
  GemmArgs args;  // epilogue and shape; the runner supplies the pointers the epilogue uses
  bool with_bias = false;
  int64_t operand_offset = 0;  // elements: A and B start this far into their allocations
};

bool uses_aux(Epilogue e) {
  return e == Epilogue::kGeluTanhAux || e == Epilogue::kDGeluTanh ||
         e == Epilogue::kDGeluTanhBiasGrad;
}
bool writes_bias_grad(Epilogue e) {
  return e == Epilogue::kDGeluTanhBiasGrad || e == Epilogue::kBiasGradA;
}

struct GemmOutputs {
  std::vector<float> c, aux, bias_grad;
};

// The fp32 GEMM of the bf16-rounded operands on the CPU: the reference.
GemmOutputs reference_gemm(const Bf16GemmCase& t, gemm_test::GemmBuffers data) {
  GemmArgs args = t.args;
  args.bias = t.with_bias ? data.bias.data() : nullptr;
  args.aux = uses_aux(args.epilogue) ? data.aux.data() : nullptr;
  args.bias_grad = writes_bias_grad(args.epilogue) ? data.bias_grad.data() : nullptr;
  const std::vector<float> a = rounded(data.a), b = rounded(data.b);
  gemm(data.c.data(), a.data(), b.data(), args);
  return {data.c, data.aux, data.bias_grad};
}

// The bf16 GEMM on `device`: gemm_cuda on the context's engine, or (`engine` given) on that
// engine; gemm() when the device is the CPU (emulation).
GemmOutputs bf16_gemm(const Bf16GemmCase& t, const gemm_test::GemmBuffers& data, Device device,
                      void* engine = nullptr) {
  DeviceArray<bf16_bits> a(to_bf16(data.a), device, t.operand_offset),
      b(to_bf16(data.b), device, t.operand_offset);
  DeviceArray<float> c(data.c, device), bias(data.bias, device), aux(data.aux, device),
      bias_grad(data.bias_grad, device);
  GemmArgs args = t.args;
  args.bias = t.with_bias ? bias.get() : nullptr;
  args.aux = uses_aux(args.epilogue) ? aux.get() : nullptr;
  args.bias_grad = writes_bias_grad(args.epilogue) ? bias_grad.get() : nullptr;
  const GemmOperand a_operand = a.get(), b_operand = b.get();
#if defined(FT_HAVE_CUDA)
  if (device == Device::kCuda) {
    if (engine != nullptr)
      static_cast<CublasLtGemm*>(engine)->run(c.get(), a_operand, b_operand, args,
                                              cuda_context().compute_stream());
    else
      gemm_cuda(c.get(), a_operand, b_operand, args, cuda_context().compute_stream());
    return {c.to_host(), aux.to_host(), bias_grad.to_host()};  // host reads wait for the stream
  }
#endif
  static_cast<void>(engine);
  gemm(c.get(), a_operand, b_operand, args);
  return {c.to_host(), aux.to_host(), bias_grad.to_host()};
}

// max |got - want| / max(1, |want|), NaN counting as infinite.
double max_scaled_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return 1e30;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]) /
                         std::max(1.0, std::fabs(static_cast<double>(want[i])));
    if (!(error <= worst)) worst = std::isnan(error) ? 1e30 : error;
  }
  return worst;
}

void expect_matches(const GemmOutputs& got, const GemmOutputs& want) {
  EXPECT_LT(max_scaled_error(got.c, want.c), kTolerance) << "C";
  EXPECT_LT(max_scaled_error(got.aux, want.aux), kTolerance) << "aux";
  EXPECT_LT(max_scaled_error(got.bias_grad, want.bias_grad), kTolerance) << "bias_grad";
}

Bf16GemmCase gemm_case(std::string name, int64_t m, int64_t n, int64_t k) {
  Bf16GemmCase t;
  t.name = std::move(name);
  t.args.m = m;
  t.args.n = n;
  t.args.k = k;
  return t;
}

std::vector<Bf16GemmCase> bf16_gemm_cases() {
  std::vector<Bf16GemmCase> cases;
  auto add = [&](Bf16GemmCase t, auto&& edit) {
    edit(t);
    cases.push_back(t);
  };
  cases.push_back(gemm_case("odd shape", 17, 33, 65));
  add(gemm_case("linear: transpose b + bias", 37, 64, 96), [](Bf16GemmCase& t) {
    t.args.transpose_b = true;
    t.with_bias = true;
  });
  // x a bf16 column view at column 1 of a wider value: 2-byte aligned, odd leading dimension.
  add(gemm_case("2-byte aligned view, odd lda", 19, 24, 32), [](Bf16GemmCase& t) {
    t.args.transpose_b = true;
    t.args.lda = 33;
    t.operand_offset = 1;
    t.with_bias = true;
  });
  add(gemm_case("dW += dy^T x: transpose a, accumulate", 64, 48, 40), [](Bf16GemmCase& t) {
    t.args.transpose_a = true;
    t.args.accumulate = true;
  });
  add(gemm_case("alpha, accumulate", 33, 17, 9), [](Bf16GemmCase& t) {
    t.args.alpha = -1.5f;
    t.args.accumulate = true;
  });
  add(gemm_case("head batch strides", 32, 32, 16), [](Bf16GemmCase& t) {
    t.args.batch = 4;
    t.args.transpose_b = true;
    t.args.lda = t.args.ldb = 64;
    t.args.batch_stride_a = t.args.batch_stride_b = 16;
    t.args.alpha = 0.25f;
  });
  add(gemm_case("relu + bias", 64, 128, 64), [](Bf16GemmCase& t) {
    t.args.epilogue = Epilogue::kRelu;
    t.with_bias = true;
  });
  add(gemm_case("gelu + bias", 64, 128, 64), [](Bf16GemmCase& t) {
    t.args.epilogue = Epilogue::kGeluTanh;
    t.with_bias = true;
  });
  add(gemm_case("gelu", 32, 64, 16),
      [](Bf16GemmCase& t) { t.args.epilogue = Epilogue::kGeluTanh; });
  add(gemm_case("gelu aux + bias", 64, 128, 96), [](Bf16GemmCase& t) {
    t.args.transpose_b = true;
    t.args.epilogue = Epilogue::kGeluTanhAux;
    t.with_bias = true;
  });
  add(gemm_case("gelu aux, odd ld_aux and ldc", 30, 20, 12), [](Bf16GemmCase& t) {
    t.args.epilogue = Epilogue::kGeluTanhAux;
    t.args.ld_aux = 21;
    t.args.ldc = 23;
  });
  add(gemm_case("dgelu", 64, 128, 96),
      [](Bf16GemmCase& t) { t.args.epilogue = Epilogue::kDGeluTanh; });
  add(gemm_case("dgelu + bias grad", 64, 128, 96),
      [](Bf16GemmCase& t) { t.args.epilogue = Epilogue::kDGeluTanhBiasGrad; });
  add(gemm_case("bias grad of A, transposed, accumulate", 96, 64, 128), [](Bf16GemmCase& t) {
    t.args.transpose_a = true;
    t.args.accumulate = true;
    t.args.epilogue = Epilogue::kBiasGradA;
  });
  add(gemm_case("bias grad of A", 48, 40, 72),
      [](Bf16GemmCase& t) { t.args.epilogue = Epilogue::kBiasGradA; });
  return cases;
}

TEST(Bf16GemmCuda, MatchesFp32GemmOfRoundedOperandsForEveryEpilogue) {
  FT_SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const Bf16GemmCase& t : bf16_gemm_cases()) {
    SCOPED_TRACE(t.name);
    const gemm_test::GemmBuffers data = gemm_test::make_gemm_buffers(t.args, seed += 10);
    expect_matches(bf16_gemm(t, data, test::kGpu), reference_gemm(t, data));
  }
}

#if defined(FT_HAVE_CUDA)
// Every epilogue as a plain bf16 GEMM plus our epilogue kernels (the bf16 operand sums of
// core/cuda/bf16_kernels.h for kBiasGradA), and plans keyed by the operands' dtype.
TEST(Bf16GemmCuda, UnfusedEpiloguesMatchToo) {
  FT_GPU_ONLY();
  CublasLtGemm unfused;
  unfused.set_fused_epilogue_enabled(false);
  uint32_t seed = 300;
  for (const Bf16GemmCase& t : bf16_gemm_cases()) {
    SCOPED_TRACE(t.name);
    const gemm_test::GemmBuffers data = gemm_test::make_gemm_buffers(t.args, seed += 10);
    expect_matches(bf16_gemm(t, data, Device::kCuda, &unfused), reference_gemm(t, data));
  }
  EXPECT_GT(unfused.unfused_epilogue_calls(), 0);
}

TEST(Bf16GemmCuda, OnePlanPerOperandDtype) {
  FT_GPU_ONLY();
  CublasLtGemm engine;
  const Bf16GemmCase t = gemm_case("small", 8, 16, 32);
  const gemm_test::GemmBuffers data = gemm_test::make_gemm_buffers(t.args, 7);
  bf16_gemm(t, data, Device::kCuda, &engine);
  bf16_gemm(t, data, Device::kCuda, &engine);
  EXPECT_EQ(engine.cached_plan_count(), 1u);
  DeviceArray<float> a(data.a, Device::kCuda), b(data.b, Device::kCuda), c(data.c, Device::kCuda);
  engine.run(c.get(), a.get(), b.get(), t.args, cuda_context().compute_stream());
  EXPECT_EQ(engine.cached_plan_count(), 2u);
  // TF32 applies to fp32 operands only: a bf16 GEMM under train.tf32 reuses its plan.
  set_gemm_tf32(true);
  bf16_gemm(t, data, Device::kCuda, &engine);
  set_gemm_tf32(false);
  EXPECT_EQ(engine.cached_plan_count(), 2u);
}

TEST(Bf16GemmCuda, MixedOperandDtypesAreRefused) {
  FT_GPU_ONLY();
  DeviceArray<float> a(std::vector<float>(16, 1.0f), Device::kCuda),
      c(std::vector<float>(16, 0.0f), Device::kCuda);
  DeviceArray<bf16_bits> b(std::vector<bf16_bits>(16, float_to_bf16(1.0f)), Device::kCuda);
  GemmArgs args;
  args.m = args.n = args.k = 4;
  EXPECT_THROW(
      gemm_cuda(c.get(), a.get(), GemmOperand(b.get()), args, cuda_context().compute_stream()),
      Error);
}
#endif  // defined(FT_HAVE_CUDA)

TEST(Bf16Tensor, FillRoundsTheValueOnTheDevice) {
  FT_SKIP_WITHOUT_GPU();
  for (const int64_t count : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    Tensor zeros = Tensor::zeros({count}, test::kGpu, DType::kBF16);
    EXPECT_EQ(zeros.to_host_vector(), std::vector<float>(static_cast<size_t>(count), 0.0f));
    Tensor filled = Tensor::empty({count}, test::kGpu, DType::kBF16);
    filled.fill(1.0f / 3.0f);
    EXPECT_EQ(filled.to_host_vector(),
              std::vector<float>(static_cast<size_t>(count), round_to_bf16(1.0f / 3.0f)));
  }
}

// gpt_tiny's parameters with bf16 copies on `device`, initialised from seed 17.
std::unique_ptr<ParamStore> bf16_store(Device device) {
  auto params = std::make_unique<ParamStore>();
  register_gpt_params(GptShape{4, 4, 128, 64, 256, 0.0f, false}, *params);
  params->enable_bf16_copies();
  params->allocate(device);
  params->initialize(17);
  return params;
}

// The copies are exactly the masters rounded to nearest even.
void expect_copies_are_rounded_values(ParamStore& params, const std::string& what) {
  EXPECT_FALSE(params.bf16_copies_stale()) << what;
  const std::vector<float> values = params.flat_values().to_host_vector();
  const std::vector<float> copies = params.flat_bf16_values().to_host_vector();
  ASSERT_EQ(copies.size(), values.size()) << what;
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < values.size(); ++i)
    if (float_bits(copies[i]) != float_bits(round_to_bf16(values[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++wrong;
    }
  EXPECT_EQ(wrong, 0) << what << ": first at " << first;
}

TEST(Bf16WeightCopies, LiveOnTheDeviceAndRefreshAsTheCpuRounds) {
  FT_SKIP_WITHOUT_GPU();
  auto params = bf16_store(test::kGpu);
  EXPECT_EQ(params->flat_bf16_values().device(), test::kGpu);
  EXPECT_EQ(params->flat_bf16_values().numel(), params->num_trainable_floats());
  EXPECT_TRUE(params->bf16_copies_stale());
  params->refresh_bf16_copies();
  expect_copies_are_rounded_values(*params, "refresh");
  // And the CPU store's copies are the same bits.
  auto cpu = bf16_store(Device::kCpu);
  cpu->refresh_bf16_copies();
  EXPECT_EQ(params->flat_bf16_values().to_host_vector(), cpu->flat_bf16_values().to_host_vector());
}

void set_grads(ParamStore& params, uint64_t seed) {
  std::vector<float> grads = gemm_test::uniform(static_cast<size_t>(params.num_trainable_floats()),
                                                -0.05f, 0.05f, static_cast<uint32_t>(seed));
  params.flat_grads().copy_from(
      Tensor::wrap(grads.data(), {static_cast<int64_t>(grads.size())}, Device::kCpu));
}

// The multi-tensor sweep writes the copies as it updates the masters (the optimizer then marks
// them fresh); the per-tensor sweep leaves them stale for the refresh kernel. Both end with the
// rounded masters.
TEST(Bf16WeightCopies, MultiTensorOptimizerWritesThemAsItSteps) {
  FT_SKIP_WITHOUT_GPU();
  for (const std::string name : {"adamw", "sgd"}) {
    SCOPED_TRACE(name);
    OptimizerOptions options;
    options.name = name;
    options.weight_decay = 0.1f;
    auto params = bf16_store(test::kGpu);
    params->refresh_bf16_copies();
    std::shared_ptr<ParamSweep> sweep = make_multi_tensor_sweep(*params);
    EXPECT_TRUE(sweep->writes_bf16_copies());
    auto optimizer = make_optimizer(options, *params, sweep);
    for (int step = 0; step < 3; ++step) {
      set_grads(*params, 50 + step);
      optimizer->step(*params, 1e-2f);
      expect_copies_are_rounded_values(*params, name + " step " + std::to_string(step));
    }
    auto per_tensor_params = bf16_store(test::kGpu);
    auto per_tensor = make_optimizer(options, *per_tensor_params, make_per_tensor_sweep());
    set_grads(*per_tensor_params, 50);
    per_tensor->step(*per_tensor_params, 1e-2f);
    EXPECT_TRUE(per_tensor_params->bf16_copies_stale());
    per_tensor_params->refresh_bf16_copies();
    expect_copies_are_rounded_values(*per_tensor_params, name + " per-tensor, refreshed");
  }
}

}  // namespace
}  // namespace ft
