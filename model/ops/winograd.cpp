// The public Winograd entry points (model/ops/winograd.h): the weight transform, and a dispatch
// to the kernels of model/ops/winograd_kernels.h at the widest vector width the CPU runs. The
// 8-lane kernels are compiled here, with the build's flags; the 16-lane ones in
// winograd_avx512.cpp with AVX-512 enabled, and they run only where the CPU reports AVX-512.
#include "model/ops/winograd.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/ops/winograd_kernels.h"

namespace ft {
namespace {

using winograd::F2;
using winograd::F4;
using winograd::KernelTable;
using winograd::load8;
using winograd::store8;
using winograd::Vec8;

void check_shape(const WinogradShape& shape) {
  FT_CHECK(shape.batch > 0 && shape.height > 0 && shape.width > 0,
           "winograd: bad shape batch=", shape.batch, " height=", shape.height,
           " width=", shape.width);
  FT_CHECK(winograd_supports(shape.in_channels, shape.out_channels),
           "winograd: channels must be multiples of 16, got in=", shape.in_channels,
           " out=", shape.out_channels);
}

constexpr const char* kIsaVariable = "FT_CPU_ISA";

// Whether this build has the AVX-512 kernels and this CPU (and its OS) can run them.
bool avx512_runs() {
#if FT_WINOGRAD_AVX512
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// The widest width that runs, unless the environment's FT_CPU_ISA names a narrower one.
WinogradIsa initial_isa() {
  const WinogradIsa widest = avx512_runs() ? WinogradIsa::kAvx512 : WinogradIsa::kAvx2;
  const char* requested = std::getenv(kIsaVariable);
  if (requested == nullptr) return widest;
  const std::string name = requested;
  if (name == "avx2") return WinogradIsa::kAvx2;
  FT_REQUIRE(name == "avx512", "environment variable ", kIsaVariable, "=", name,
             " is not one of: avx2, avx512");
  FT_REQUIRE(widest == WinogradIsa::kAvx512, kIsaVariable,
             "=avx512, but this CPU has no AVX-512 (or this build did not compile the AVX-512 "
             "kernels); use avx2 or leave it unset");
  return WinogradIsa::kAvx512;
}

std::atomic<WinogradIsa>& chosen_isa() {
  static std::atomic<WinogradIsa> isa{initial_isa()};
  return isa;
}

const KernelTable& kernels() {
  static const KernelTable avx2 = winograd::kernels_of_width<8>();
#if FT_WINOGRAD_AVX512
  if (chosen_isa().load(std::memory_order_relaxed) == WinogradIsa::kAvx512)
    return winograd::avx512_kernels();
#endif
  return avx2;
}

// U = G g G^T for every (o, c), at U[xi][c][o] (forward) or U[xi][o][c] (backward data, with the
// flipped kernel). Eight kernels that are neighbours in the layout's rows go through the
// transform together as Vec8 lanes, so every store is a whole vector: scalar code with a store
// per value made this 6% of a resnet20 step.
template <typename V>
void transform_weights(float* transformed, const float* weight, int out_channels, int in_channels,
                       WinogradPass pass) {
  constexpr int W = V::kWindow;
  const bool forward = pass == WinogradPass::kForward;
  const int64_t point_stride = static_cast<int64_t>(in_channels) * out_channels;
  const int outer_count = forward ? in_channels : out_channels;
  const int inner_count = forward ? out_channels : in_channels;  // a multiple of 16
  for (int outer = 0; outer < outer_count; ++outer)
    for (int inner = 0; inner < inner_count; inner += 8) {
      float taps[9][8];  // taps[tap][lane]; backward data convolves with the flipped kernel
      for (int lane = 0; lane < 8; ++lane) {
        const int o = forward ? inner + lane : outer, c = forward ? outer : inner + lane;
        const float* w = weight + (static_cast<int64_t>(o) * in_channels + c) * 9;
        for (int tap = 0; tap < 9; ++tap) taps[tap][lane] = forward ? w[tap] : w[8 - tap];
      }
      Vec8 columns[3][W];  // columns[q] = G (column q of g)
      for (int q = 0; q < 3; ++q) {
        const Vec8 column[3] = {load8(taps[q]), load8(taps[3 + q]), load8(taps[6 + q])};
        V::kernel(column, columns[q]);
      }
      float* at = transformed + static_cast<int64_t>(outer) * inner_count + inner;
      for (int r = 0; r < W; ++r) {
        const Vec8 row[3] = {columns[0][r], columns[1][r], columns[2][r]};
        Vec8 u[W];
        V::kernel(row, u);
        for (int s = 0; s < W; ++s) store8(at + (r * W + s) * point_stride, u[s]);
      }
    }
}

}  // namespace

namespace winograd {

float* thread_buffer(BufferSlot slot, int64_t count) {
  thread_local std::vector<float> buffers[kBufferSlots];
  std::vector<float>& buffer = buffers[static_cast<int>(slot)];
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(count);
  return buffer.data();
}

const float* zero_channels(int channels) {
  thread_local std::vector<float> zeros;
  if (static_cast<int>(zeros.size()) < channels) zeros.assign(channels, 0.0f);
  return zeros.data();
}

float** thread_partials(int threads) {
  thread_local std::vector<float*> partials;
  partials.assign(threads, nullptr);
  return partials.data();
}

}  // namespace winograd

bool winograd_isa_available(WinogradIsa isa) {
  return isa == WinogradIsa::kAvx2 || avx512_runs();
}

WinogradIsa winograd_isa() {
  return chosen_isa().load(std::memory_order_relaxed);
}

void winograd_set_isa(WinogradIsa isa) {
  FT_CHECK(winograd_isa_available(isa), "winograd: ", winograd_isa_name(isa),
           " kernels do not run on this CPU or were not built");
  chosen_isa().store(isa, std::memory_order_relaxed);
}

const char* winograd_isa_name(WinogradIsa isa) {
  return isa == WinogradIsa::kAvx512 ? "avx512" : "avx2";
}

bool winograd_supports(int in_channels, int out_channels) {
  return in_channels > 0 && out_channels > 0 && in_channels % winograd::kCols == 0 &&
         out_channels % winograd::kCols == 0;
}

int64_t winograd_weights_numel(int in_channels, int out_channels, WinogradTile tile) {
  const int points = tile == WinogradTile::k2x2 ? F2::kPoints : F4::kPoints;
  return static_cast<int64_t>(points) * in_channels * out_channels;
}

void winograd_transform_weights(float* transformed, const float* weight, int out_channels,
                                int in_channels, WinogradTile tile, WinogradPass pass) {
  if (tile == WinogradTile::k2x2)
    transform_weights<F2>(transformed, weight, out_channels, in_channels, pass);
  else
    transform_weights<F4>(transformed, weight, out_channels, in_channels, pass);
}

void winograd_conv(float* y, const float* x, const float* transformed, const WinogradShape& shape,
                   WinogradWrite write) {
  check_shape(shape);
  const KernelTable& table = kernels();
  (shape.tile == WinogradTile::k2x2 ? table.conv_f2 : table.conv_f4)(y, x, transformed, shape,
                                                                     write, nullptr);
}

void winograd_conv_inference(float* y, const float* x, const float* transformed,
                             const WinogradShape& shape, const WinogradEpilogue& epilogue) {
  check_shape(shape);
  const KernelTable& table = kernels();
  (shape.tile == WinogradTile::k2x2 ? table.conv_f2 : table.conv_f4)(
      y, x, transformed, shape, WinogradWrite::kOverwrite, &epilogue);
}

void winograd_conv_weight_grad(float* weight_grad, const float* x, const float* dy,
                               const WinogradShape& shape) {
  check_shape(shape);
  const KernelTable& table = kernels();
  (shape.tile == WinogradTile::k2x2 ? table.weight_grad_f2 : table.weight_grad_f4)(weight_grad, x,
                                                                                   dy, shape);
}

}  // namespace ft
