// The ResNet's ops under train.precision: bf16, one op at a time on hand-wired workspaces:
//   - Conv2dOp with a bf16 input against the fp32 Conv2dOp on the same bf16-rounded values
//     (x, the weight's bf16 copy, and dy rounded once), forward, input and weight gradients;
//     the same for the eval graphs' ConvBiasOp (bf16-rounded folded weights);
//   - each producer that absorbs a cast (fusion.vertical.cast) against its twin, the fp32 op
//     followed by the cast, bit for bit: ReluCastOp against ReluOp, BatchNormReluOp and
//     BatchNormAddReluOp (identity and normalised shortcut) writing bf16 against writing fp32.
// ctest runs this binary twice: as is (oneDNN's bf16 kernels where the CPU has them) and with
// ONEDNN_MAX_CPU_ISA=AVX2 (the widening path every CPU without bf16 instructions takes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/bf16_cast.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/ops/conv_bias.h"
#include "fusion/ops/relu_cast.h"
#include "model/ops/conv2d.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

std::vector<float> normal_values(int64_t count, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = scale * rng.normal();
  return values;
}

std::vector<float> rounded(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = round_to_bf16(values[i]);
  return out;
}

Tensor fp32_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor bf16_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, Device::kCpu, DType::kBF16);
  cast_to_bf16(t.bf16_data(), values.data(), static_cast<int64_t>(values.size()));
  return t;
}

// A workspace over `values` and `grads` (value i's gradient; undefined for none), every root a
// flat row, no gradient fresh unless `fresh` says so.
Workspace wire(std::vector<Tensor> values, std::vector<Tensor> grads, std::vector<uint8_t> fresh) {
  Workspace ws;
  ws.values = std::move(values);
  ws.grads = std::move(grads);
  ws.grads.resize(ws.values.size());
  for (const Tensor& v : ws.values) ws.row_strides.push_back(v.numel());
  ws.grad_fresh = std::move(fresh);
  ws.grad_fresh.resize(ws.values.size(), 0);
  return ws;
}

// max |a - b| over max |b|.
float relative_error(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.to_host_vector(), b = expected.to_host_vector();
  EXPECT_EQ(a.size(), b.size());
  float worst = 0, largest = 1e-30f;
  for (size_t i = 0; i < b.size(); ++i) {
    largest = std::max(largest, std::fabs(b[i]));
    const float error = std::fabs(a[i] - b[i]);
    if (!(error <= worst)) worst = error;  // NaN counts as worst
  }
  return worst / largest;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.bytes() != b.bytes() || a.dtype() != b.dtype()) return false;
  const auto* pa = a.dtype() == DType::kBF16 ? static_cast<const void*>(a.bf16_data())
                                             : static_cast<const void*>(a.data());
  const auto* pb = b.dtype() == DType::kBF16 ? static_cast<const void*>(b.bf16_data())
                                             : static_cast<const void*>(b.data());
  return std::equal(static_cast<const char*>(pa), static_cast<const char*>(pa) + a.bytes(),
                    static_cast<const char*>(pb));
}

// ---- Conv2dOp with a bf16 input ----

struct ConvCase {
  const char* name;
  int batch, in_channels, out_channels, size, kernel, stride, padding;
  ActivationLayout layout;
  bool needs_input_grad;
  ConvAlgorithm algorithm;
};

// One convolution's forward and backward: y, dx (accumulated onto `dx_start` unless fresh) and
// dw (accumulated onto 0.5).
struct ConvResult {
  Tensor y, dx, dw;
  std::string impl;
};

ConvResult run_conv(const ConvCase& c, bool bf16, const std::vector<float>& x,
                    const std::vector<float>& weight, const std::vector<float>& dy,
                    const std::vector<float>& dx_start, bool dx_fresh) {
  Conv2dOp op(c.batch, c.in_channels, c.out_channels, c.size, c.size, c.kernel, c.stride,
              c.padding);
  op.name = c.name;
  op.input_layout = c.layout;
  op.needs_input_grad = c.needs_input_grad;
  op.algorithm = c.algorithm;
  op.inputs = {0};
  op.outputs = {1};
  op.params = {0};
  ParamStore params;
  params.add("weight", op.weight_shape(), ParamInit::kZeros, 0.0f, true);
  if (bf16) params.enable_bf16_copies();
  params.allocate();
  std::copy(weight.begin(), weight.end(), params[0].value.data());
  params[0].grad.fill(0.5f);
  if (bf16) params.refresh_bf16_copies();
  Workspace ws = wire(
      {bf16 ? bf16_tensor(x) : fp32_tensor(x), Tensor::zeros({shape_numel(op.output_shape())})},
      {fp32_tensor(dx_start), fp32_tensor(dy)}, {dx_fresh ? uint8_t{1} : uint8_t{0}});
  op.forward(ws, params);
  op.backward(ws, params);
  // The gradient is a view of the store's flat buffer, which dies with `params`.
  return {ws.values[1], ws.grads[0], fp32_tensor(params[0].grad.to_host_vector()),
          op.forward_impl()};
}

class Bf16Conv : public ::testing::TestWithParam<ConvCase> {};

// Tolerance: bf16 x bf16 products are exact in fp32, so the native kernels differ from the fp32
// reference on the same rounded values only in fp32 accumulation order (~1e-7 relative per add,
// 1e-5 of the largest element at the widest reduction here); the widening path runs the
// reference's own fp32 kernels and must match it bit for bit. A wrong layout, weight copy or an
// unrounded dy is off by 1e-3 or more.
TEST_P(Bf16Conv, MatchesFp32OnBf16RoundedValues) {
  const ConvCase& c = GetParam();
  const int64_t x_numel = static_cast<int64_t>(c.batch) * c.in_channels * c.size * c.size;
  const int out_size = (c.size + 2 * c.padding - c.kernel) / c.stride + 1;
  const int64_t y_numel = static_cast<int64_t>(c.batch) * c.out_channels * out_size * out_size;
  const std::vector<float> x = normal_values(x_numel, 1);
  const std::vector<float> weight = normal_values(
      static_cast<int64_t>(c.out_channels) * c.in_channels * c.kernel * c.kernel, 2, 0.3f);
  const std::vector<float> dy = normal_values(y_numel, 3);
  const std::vector<float> dx_start = normal_values(x_numel, 4);
  for (const bool fresh : {true, false}) {
    if (fresh && !c.needs_input_grad) continue;
    const ConvResult got = run_conv(c, true, x, weight, dy, dx_start, fresh);
    // The reference of a timed convolution is a fixed algorithm, so it cannot share a fault.
    ConvCase reference = c;
    if (c.algorithm == ConvAlgorithm::kMeasure) reference.algorithm = ConvAlgorithm::kOneDnn;
    const ConvResult want =
        run_conv(reference, false, rounded(x), rounded(weight), rounded(dy), dx_start, fresh);
    std::printf("%s: bf16 forward %s, reference %s\n", c.name, got.impl.c_str(), want.impl.c_str());
    EXPECT_EQ(got.impl.rfind("ref", 0), std::string::npos) << "oneDNN's reference kernel ran";
    const bool widened = got.impl.rfind("widened:", 0) == 0;
    if (!bf16_gemm_native()) {
      EXPECT_TRUE(widened) << got.impl;
    }
    // kMeasure may time a different winner for each run (Winograd against direct), whose
    // results differ by Winograd's transform round-off, ~1e-6 here; a trial leaking into the
    // gradients would double them.
    const float tolerance = c.algorithm == ConvAlgorithm::kMeasure ? 1e-4f : widened ? 0.0f : 1e-5f;
    EXPECT_LE(relative_error(got.y, want.y), tolerance) << "y";
    EXPECT_LE(relative_error(got.dw, want.dw), tolerance) << "dw";
    if (c.needs_input_grad) {
      EXPECT_LE(relative_error(got.dx, want.dx), tolerance) << "dx, fresh " << fresh;
    }
    // The reference really differs from fp32 on unrounded values: the rounding was applied.
    const ConvResult unrounded = run_conv(c, false, x, weight, dy, dx_start, fresh);
    EXPECT_GT(relative_error(unrounded.y, want.y), 1e-4f);
  }
}

constexpr ActivationLayout kNhwc = ActivationLayout::kNhwc;

INSTANTIATE_TEST_SUITE_P(
    ResnetShapes, Bf16Conv,
    ::testing::Values(
        // The stem reads the NCHW images (one channel) and needs no input gradient.
        ConvCase{"stem", 4, 1, 16, 12, 3, 1, 1, ActivationLayout::kNchw, false,
                 ConvAlgorithm::kAuto},
        ConvCase{"same16", 4, 16, 16, 12, 3, 1, 1, kNhwc, true, ConvAlgorithm::kAuto},
        ConvCase{"same16_direct", 4, 16, 16, 12, 3, 1, 1, kNhwc, true, ConvAlgorithm::kDirect},
        ConvCase{"down3x3", 4, 16, 32, 12, 3, 2, 1, kNhwc, true, ConvAlgorithm::kAuto},
        ConvCase{"down1x1", 4, 16, 32, 12, 1, 2, 0, kNhwc, true, ConvAlgorithm::kAuto},
        ConvCase{"same64_7x7", 4, 64, 64, 7, 3, 1, 1, kNhwc, true, ConvAlgorithm::kAuto},
        ConvCase{"same32_measured", 4, 32, 32, 8, 3, 1, 1, kNhwc, true, ConvAlgorithm::kMeasure},
        ConvCase{"odd_channels", 3, 5, 7, 9, 3, 1, 1, kNhwc, true, ConvAlgorithm::kAuto}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return std::string(info.param.name); });

// ---- ConvBiasOp (eval graphs' folded convolution) with a bf16 input ----

// y = relu(conv(x, W') + b' + residual) from already folded W', b' (ConvBiasSource::kFolded).
Tensor run_conv_bias(const ConvBiasSpec& spec, bool bf16, const std::vector<float>& x,
                     const std::vector<float>& weight, const std::vector<float>& bias,
                     const std::vector<float>& residual, std::string* impl) {
  ConvBiasOp op(spec, ConvBiasSource::kFolded);
  op.name = "conv_bias";
  op.inputs = {0, 1};
  op.outputs = {2};
  op.params = {0, 1};
  ParamStore params;
  params.add("weight", op.weight_shape(), ParamInit::kZeros, 0.0f, false);
  params.add("bias", {spec.out_channels}, ParamInit::kZeros, 0.0f, false);
  params.allocate();
  std::copy(weight.begin(), weight.end(), params[0].value.data());
  std::copy(bias.begin(), bias.end(), params[1].value.data());
  Workspace ws = wire({bf16 ? bf16_tensor(x) : fp32_tensor(x), fp32_tensor(residual),
                       Tensor::zeros({shape_numel(op.output_shape())})},
                      {}, {});
  op.forward(ws, params);
  *impl = op.forward_impl();
  return ws.values[2];
}

// As Bf16Conv: a bf16 x multiplies bf16(W'), accumulating in fp32, so the fp32 op on the rounded
// x and W' is the reference (1e-5 for the native kernel's accumulation order, exact widened).
TEST(Bf16ConvBias, MatchesFp32OnBf16RoundedValues) {
  for (const bool winograd : {true, false}) {
    ConvBiasSpec spec;
    spec.batch = 2;
    spec.in_channels = spec.out_channels = 16;
    spec.height = spec.width = 10;
    spec.kernel = 3;
    spec.padding = 1;
    spec.winograd = winograd;
    spec.residual = spec.relu = true;
    const int64_t numel = int64_t{2} * 16 * 10 * 10;
    const std::vector<float> x = normal_values(numel, 21);
    const std::vector<float> weight = normal_values(16 * 16 * 9, 22, 0.3f);
    const std::vector<float> bias = normal_values(16, 23);
    const std::vector<float> residual = normal_values(numel, 24);
    std::string got_impl, want_impl;
    const Tensor got = run_conv_bias(spec, true, x, weight, bias, residual, &got_impl);
    const Tensor want =
        run_conv_bias(spec, false, rounded(x), rounded(weight), bias, residual, &want_impl);
    std::printf("conv_bias (winograd %d): bf16 %s, reference %s\n", winograd, got_impl.c_str(),
                want_impl.c_str());
    const bool widened = got_impl.rfind("widened:", 0) == 0;
    EXPECT_EQ(widened, !bf16_gemm_native()) << got_impl;
    EXPECT_LE(relative_error(got, want), widened ? 0.0f : 1e-5f);
    const Tensor unrounded = run_conv_bias(spec, false, x, weight, bias, residual, &want_impl);
    EXPECT_GT(relative_error(unrounded, want), 1e-4f);
  }
}

// ---- Producers writing bf16 against their twin: the fp32 op, then the cast ----

// The cast's rounding of an fp32 result, as the twin's CastOp writes it.
Tensor cast_of(const Tensor& fp32) {
  Tensor out = Tensor::empty(fp32.shape(), Device::kCpu, DType::kBF16);
  cast_to_bf16(out.bf16_data(), fp32.data(), fp32.numel());
  return out;
}

TEST(Bf16Producers, ReluCastMatchesReluThenCast) {
  // Zeros, negatives, tiny and huge values and ties of bf16 rounding.
  std::vector<float> x = normal_values(1003, 5, 3.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 1e-30f;
  x[3] = -1e-30f;
  x[4] = 1.0f + std::ldexp(1.0f, -8);
  x[5] = 3e38f;
  const std::vector<float> dy = normal_values(1003, 6);
  const std::vector<float> dx_start = normal_values(1003, 7);
  const int64_t n = static_cast<int64_t>(x.size());
  for (const bool fresh : {true, false}) {
    ReluOp twin(n);
    ReluCastOp fused(n);
    for (Op* op : {static_cast<Op*>(&twin), static_cast<Op*>(&fused)}) {
      op->inputs = {0};
      op->outputs = {1};
    }
    ParamStore none;
    Workspace a = wire({fp32_tensor(x), Tensor::zeros({n})},
                       {fp32_tensor(dx_start), fp32_tensor(dy)}, {fresh ? uint8_t{1} : uint8_t{0}});
    Workspace b = wire({fp32_tensor(x), Tensor::zeros({n}, Device::kCpu, DType::kBF16)},
                       {fp32_tensor(dx_start), fp32_tensor(dy)}, {fresh ? uint8_t{1} : uint8_t{0}});
    twin.forward(a, none);
    fused.forward(b, none);
    EXPECT_TRUE(same_bits(b.values[1], cast_of(a.values[1])));
    twin.backward(a, none);
    fused.backward(b, none);
    EXPECT_TRUE(same_bits(b.grads[0], a.grads[0])) << "fresh " << fresh;
  }
}

// BatchNorm's parameters and running statistics: gamma, beta, mean, var per BatchNorm.
void fill_batchnorm_params(ParamStore& params, int batchnorms, int channels) {
  for (int b = 0; b < batchnorms; ++b) {
    const std::string prefix = "bn" + std::to_string(b) + ".";
    params.add(prefix + "weight", {channels}, ParamInit::kNormal, 1.0f, false);
    params.add(prefix + "bias", {channels}, ParamInit::kNormal, 1.0f, false);
    params.add_buffer(prefix + "running_mean", {channels}, ParamInit::kZeros);
    params.add_buffer(prefix + "running_var", {channels}, ParamInit::kOnes);
  }
  params.allocate();
  params.initialize(11);
}

// Per-channel offsets and scales, so statistics differ between channels and about half of the
// normalised values are cut by the ReLU.
std::vector<float> channel_values(int64_t rows, int channels, uint64_t seed) {
  std::vector<float> x = normal_values(rows * channels, seed);
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>(i % channels);
    x[i] = (c % 4 + 1.0f) * x[i] + 2.0f * c - 1.0f;
  }
  return x;
}

// C = 16: vector blocks only; C = 12: a vector block and a scalar tail.
class Bf16BatchNorm : public ::testing::TestWithParam<int> {};

TEST_P(Bf16BatchNorm, ReluWritingBf16MatchesItsTwin) {
  const int channels = GetParam(), batch = 3, size = 7;
  const int64_t rows = static_cast<int64_t>(batch) * size * size;
  const std::vector<float> x = channel_values(rows, channels, 12);
  const std::vector<float> dy = normal_values(rows * channels, 13);
  ParamStore twin_params, fused_params;
  fill_batchnorm_params(twin_params, 1, channels);
  fill_batchnorm_params(fused_params, 1, channels);
  BatchNormReluOp twin(batch, channels, size, size), fused(batch, channels, size, size);
  for (Op* op : {static_cast<Op*>(&twin), static_cast<Op*>(&fused)}) {
    op->inputs = {0};
    op->outputs = {1};
    op->params = {0, 1, 2, 3};
  }
  Workspace a = wire({fp32_tensor(x), Tensor::zeros({rows * channels})},
                     {Tensor::zeros({rows * channels}), fp32_tensor(dy)}, {1});
  Workspace b = wire({fp32_tensor(x), Tensor::zeros({rows * channels}, Device::kCpu, DType::kBF16)},
                     {Tensor::zeros({rows * channels}), fp32_tensor(dy)}, {1});
  for (int round = 0; round < 2; ++round) {  // the second from moved running statistics
    twin.forward(a, twin_params);
    fused.forward(b, fused_params);
    EXPECT_TRUE(same_bits(b.values[1], cast_of(a.values[1]))) << "round " << round;
    twin_params.zero_grads();
    fused_params.zero_grads();
    twin.backward(a, twin_params);
    fused.backward(b, fused_params);
    EXPECT_TRUE(same_bits(b.grads[0], a.grads[0])) << "dx, round " << round;
    for (ParamId id = 0; id < 4; ++id) {
      EXPECT_TRUE(same_bits(fused_params[id].value, twin_params[id].value))
          << fused_params[id].name;
      EXPECT_TRUE(same_bits(fused_params[id].grad, twin_params[id].grad))
          << fused_params[id].name << " gradient";
    }
  }
}

TEST_P(Bf16BatchNorm, AddReluWritingBf16MatchesItsTwin) {
  const int channels = GetParam(), batch = 3, size = 7;
  const int64_t rows = static_cast<int64_t>(batch) * size * size, numel = rows * channels;
  for (const bool normalised : {false, true}) {
    const std::vector<float> x = channel_values(rows, channels, 14);
    // A centred shortcut, so that z + s is cut about half the time.
    const std::vector<float> s = normal_values(numel, 15);
    const std::vector<float> dy = normal_values(numel, 16);
    ParamStore twin_params, fused_params;
    fill_batchnorm_params(twin_params, normalised ? 2 : 1, channels);
    fill_batchnorm_params(fused_params, normalised ? 2 : 1, channels);
    const BatchNormSettings settings;
    BatchNormAddReluOp twin(batch, channels, size, size, settings,
                            normalised ? &settings : nullptr);
    BatchNormAddReluOp fused(batch, channels, size, size, settings,
                             normalised ? &settings : nullptr);
    for (Op* op : {static_cast<Op*>(&twin), static_cast<Op*>(&fused)}) {
      op->inputs = {0, 1};
      op->outputs = {2};
      for (ParamId id = 0; id < twin_params.size(); ++id) op->params.push_back(id);
    }
    // The shortcut's gradient accumulates onto what it holds, as a block input's does.
    const std::vector<float> ds_start = normal_values(numel, 17);
    Workspace a = wire({fp32_tensor(x), fp32_tensor(s), Tensor::zeros({numel})},
                       {Tensor::zeros({numel}), fp32_tensor(ds_start), fp32_tensor(dy)}, {1, 0});
    Workspace b =
        wire({fp32_tensor(x), fp32_tensor(s), Tensor::zeros({numel}, Device::kCpu, DType::kBF16)},
             {Tensor::zeros({numel}), fp32_tensor(ds_start), fp32_tensor(dy)}, {1, 0});
    twin.forward(a, twin_params);
    fused.forward(b, fused_params);
    const std::string which = normalised ? "normalised shortcut" : "identity shortcut";
    EXPECT_TRUE(same_bits(b.values[2], cast_of(a.values[2]))) << which;
    twin_params.zero_grads();
    fused_params.zero_grads();
    twin.backward(a, twin_params);
    fused.backward(b, fused_params);
    EXPECT_TRUE(same_bits(b.grads[0], a.grads[0])) << which << ": dx";
    EXPECT_TRUE(same_bits(b.grads[1], a.grads[1])) << which << ": shortcut gradient";
    for (ParamId id = 0; id < twin_params.size(); ++id)
      EXPECT_TRUE(same_bits(fused_params[id].grad, twin_params[id].grad))
          << which << ": " << fused_params[id].name;
    // The mask must matter: some outputs cut, some passed.
    const std::vector<float> y = a.values[2].to_host_vector();
    const auto positives = std::count_if(y.begin(), y.end(), [](float v) { return v > 0; });
    EXPECT_GT(positives, numel / 5);
    EXPECT_LT(positives, 4 * numel / 5);
  }
}

INSTANTIATE_TEST_SUITE_P(Channels, Bf16BatchNorm, ::testing::Values(16, 12));

}  // namespace
}  // namespace ft
