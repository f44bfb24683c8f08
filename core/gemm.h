// The GEMM front-end of both devices, one vocabulary (GemmArgs, Epilogue) for
//   C[b] (=|+=) alpha * op(A[b]) · op(B[b]) (+ bias) (epilogue)   for b in [0, batch)
// gemm() runs it on the CPU through oneDNN matmul, with primitives cached by shape so a training
// step creates none; gemm_cuda() runs it on CUDA device pointers through cuBLASLt
// (core/cuda/cublaslt_gemm.h), with plans cached the same way.
// All matrices are row-major with explicit leading dimensions, so views (heads inside a [B,T,3C]
// activation, weight row blocks) need no copies.
// Thread safety: call from one thread (the training thread); oneDNN parallelises inside.
#pragma once
#include <cstdint>
#include <tuple>

#include "core/device.h"
#include "core/tensor.h"

namespace ft {

// What happens to the product P = alpha op(A) op(B) (+ C when accumulate) before it lands in C.
// A non-null `bias` adds bias[N] to every row of P first in the forward epilogues (kNone, kRelu,
// kGeluTanh, kGeluTanhAux): that is cuBLASLt's BIAS / RELU_BIAS / GELU_BIAS / GELU_AUX_BIAS.
// The gradient epilogues take no bias. GELU is the tanh form of core/math/gelu_math.h.
enum class Epilogue {
  kNone,      // C = P (+ bias)
  kRelu,      // C = max(P (+ bias), 0)
  kGeluTanh,  // C = gelu(P (+ bias)); inference: the pre-activation is lost
  // Training forward of Linear -> GELU: aux = pre = P (+ bias), C = gelu(pre). aux is an output
  // [M, N] with row stride ld_aux; backward reads it (cuBLASLt GELU_AUX(_BIAS)).
  kGeluTanhAux,
  // Backward through that GELU when this GEMM produces its output gradient:
  // C = P ⊙ gelu'(aux), aux being the pre-activation saved by kGeluTanhAux (cuBLASLt DGELU).
  kDGeluTanh,
  // kDGeluTanh, and bias_grad[N] = sum over rows of C (=, the gradient of the bias that fed aux)
  // (cuBLASLt DGELU_BGRAD).
  kDGeluTanhBiasGrad,
  // C = P (+= with accumulate), and bias_grad[M] = sum over k of op(A)[m, k] (=). With
  // A = dy^T this is the weight-gradient GEMM dW = dy^T x that also yields db = colsum(dy).
  // (cuBLASLt's BGRADB: cuBLASLt sees C^T = op(B)^T op(A)^T, so its B is our A.)
  kBiasGradA,
};

const char* epilogue_name(Epilogue epilogue);

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  bool transpose_a = false;           // A stored [K, M] instead of [M, K]
  bool transpose_b = false;           // B stored [N, K] instead of [K, N] (nn.Linear weights)
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides in floats; 0 = packed
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;  // 0 = packed
  float alpha = 1.0f;           // REQUIRES: 1 when bias is set or the epilogue is kBiasGradA
  bool accumulate = false;      // C += result. REQUIRES: epilogue kNone or kBiasGradA
  const float* bias = nullptr;  // [N], broadcast over rows; forward epilogues only
  Epilogue epilogue = Epilogue::kNone;
  // kGeluTanhAux writes, kDGeluTanh(BiasGrad) reads the pre-activation [M, N] here; row stride
  // ld_aux floats (0 = packed N). Null for every other epilogue.
  float* aux = nullptr;
  int64_t ld_aux = 0;
  // kDGeluTanhBiasGrad ([N]) and kBiasGradA ([M]) write (=, not +=) the bias gradient here.
  float* bias_grad = nullptr;
};

// Throws ft::Error naming `who` when the arguments are inconsistent (empty shape, strides too
// small for the matrix, an epilogue without its buffers or with buffers it does not use, ...).
// Epilogues other than kNone / kRelu / kGeluTanh need batch == 1.
void check_gemm_args(const GemmArgs& args, const char* who);
// `args` with every 0 (= packed) leading dimension and batch stride replaced by its value.
GemmArgs resolve_gemm_strides(const GemmArgs& args);

// The shape, layout and epilogue that identify one GEMM plan, whatever the pointers: the key of
// oneDNN's primitive cache (core/gemm.cpp) and the shared part of cuBLASLt's plan key
// (core/cuda/cublaslt_gemm.cpp). REQUIRES: built from resolved strides.
struct GemmShapeKey {
  int64_t m, n, k, batch;
  bool transpose_a, transpose_b;
  int64_t lda, ldb, ldc, batch_stride_a, batch_stride_b, batch_stride_c;
  float alpha;
  bool accumulate, has_bias;
  Epilogue epilogue;
  DType operands;  // A's and B's elements; C is fp32 either way

  static GemmShapeKey of(const GemmArgs& resolved, DType operands);
  auto tie() const {
    return std::tie(m, n, k, batch, transpose_a, transpose_b, lda, ldb, ldc, batch_stride_a,
                    batch_stride_b, batch_stride_c, alpha, accumulate, has_bias, epilogue,
                    operands);
  }
  bool operator<(const GemmShapeKey& other) const { return tie() < other.tie(); }
};

// A GEMM operand's elements: fp32, or bf16 (train.precision: bf16). Both operands of one GEMM
// share a dtype; C, bias, aux and bias_grad are fp32 always, and products accumulate in fp32.
struct GemmOperand {
  GemmOperand(const float* data) : data(data), dtype(DType::kF32) {}       // NOLINT: implicit
  GemmOperand(const bf16_bits* data) : data(data), dtype(DType::kBF16) {}  // NOLINT: implicit
  // The operand starting `elements` further on (a row block, a weight's rows).
  GemmOperand at(int64_t elements) const {
    GemmOperand moved = *this;
    moved.data =
        static_cast<const char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
    return moved;
  }
  const void* data;
  DType dtype;
};

// CPU: every epilogue (the gradient and aux ones as a oneDNN GEMM plus a host loop). bf16
// operands run oneDNN's bf16 kernels where the CPU has bf16 instructions (bf16_gemm_native());
// elsewhere they are widened to fp32 and multiplied there: the same bf16-rounded values, fp32
// products, so both paths agree to fp32 accumulation order. REQUIRES: a.dtype == b.dtype.
void gemm(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args);

// C = A B (+ bias) with C in bf16: oneDNN accumulates in fp32, adds the bias and rounds each
// element once to nearest even, as float_to_bf16 rounds gemm's fp32 C, with no fp32 C written.
// For a producer whose output feeds bf16 GEMMs only (fusion.vertical.cast). ldc counts bf16
// elements. REQUIRES: bf16 A and B, bf16_gemm_native(), epilogue kNone, no accumulate, batch 1,
// alpha 1.
void gemm_bf16_output(bf16_bits* c, GemmOperand a, GemmOperand b, const GemmArgs& args);

// True when oneDNN runs bf16 GEMMs with bf16 instructions here (AVX512-BF16 or AMX); decided at
// run time from oneDNN's effective ISA, so ONEDNN_MAX_CPU_ISA=AVX2 forces the widening path.
bool bf16_gemm_native();
// True when our own AVX512-BF16 kernels may run: the CPU has the instructions and the GEMMs run
// bf16 natively too (so ONEDNN_MAX_CPU_ISA=AVX2 sends every bf16 path to its generic form, which
// the widening-path tests then cover). Each caller also needs its kernels compiled in.
bool avx512_bf16_kernels_run();
// One line for the start line and bench: which bf16 path this CPU takes and why.
const char* bf16_gemm_path();
// CUDA (core/cuda/gemm_cuda.cpp, CUDA builds only): the same on device pointers, enqueued on
// `stream`, through the process's CublasLtGemm (core/cuda/cuda_context.h). bf16 operands are
// cuBLASLt CUDA_R_16BF matrices multiplied with CUBLAS_COMPUTE_32F into the fp32 C, every
// epilogue as in fp32. REQUIRES: a.dtype == b.dtype.
void gemm_cuda(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args, CudaStream stream);
// The fp32 form, so fp32 callers keep passing plain pointers.
void gemm_cuda(float* c, const float* a, const float* b, const GemmArgs& args, CudaStream stream);

// train.tf32: when true, gemm_cuda computes fp32 operands with CUBLAS_COMPUTE_32F_FAST_TF32
// (10-bit mantissa products, FP32 accumulation) instead of CUBLAS_COMPUTE_32F; bf16 operands are
// exact in fp32 products either way. Part of the plan key, so toggling it never reuses a plan of
// the other mode. The CPU gemm() is FP32 either way. Default false.
void set_gemm_tf32(bool on);
bool gemm_tf32();

// Wall time spent inside gemm() while timing is on, so benchmarks can report a step's GEMM share.
// Off by default (two clock reads per call); not synchronised: the training thread only.
void set_gemm_timing(bool on);
double gemm_timed_ms();
// Convolutions (oneDNN's and our Winograd kernels, which do not call gemm()) time each pass with
// this guard, under the same switch, into conv_timed_ms(), so the share of a step outside matrix
// work covers the ResNet too.
class ConvTimeGuard {
 public:
  ConvTimeGuard();
  ~ConvTimeGuard();
  ConvTimeGuard(const ConvTimeGuard&) = delete;
  ConvTimeGuard& operator=(const ConvTimeGuard&) = delete;

 private:
  double start_ms_ = -1;  // -1: timing was off when the pass began
};
double conv_timed_ms();

}  // namespace ft
