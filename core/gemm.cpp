#include "core/gemm.h"

#include <dnnl.hpp>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/dnnl_context.h"
#include "core/math/gelu_math.h"
#include "core/timer.h"

namespace ft {

const char* epilogue_name(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kRelu:
      return "relu";
    case Epilogue::kGeluTanh:
      return "gelu_tanh";
    case Epilogue::kGeluTanhAux:
      return "gelu_tanh_aux";
    case Epilogue::kDGeluTanh:
      return "dgelu_tanh";
    case Epilogue::kDGeluTanhBiasGrad:
      return "dgelu_tanh_bias_grad";
    case Epilogue::kBiasGradA:
      return "bias_grad_a";
  }
  return "?";
}

GemmArgs resolve_gemm_strides(const GemmArgs& args) {
  GemmArgs resolved = args;
  if (resolved.lda == 0) resolved.lda = args.transpose_a ? args.m : args.k;
  if (resolved.ldb == 0) resolved.ldb = args.transpose_b ? args.k : args.n;
  if (resolved.ldc == 0) resolved.ldc = args.n;
  if (resolved.ld_aux == 0) resolved.ld_aux = args.n;
  if (resolved.batch_stride_a == 0) resolved.batch_stride_a = args.m * args.k;
  if (resolved.batch_stride_b == 0) resolved.batch_stride_b = args.k * args.n;
  if (resolved.batch_stride_c == 0) resolved.batch_stride_c = args.m * args.n;
  return resolved;
}

void check_gemm_args(const GemmArgs& args, const char* who) {
  const Epilogue epilogue = args.epilogue;
  FT_CHECK(args.m > 0 && args.n > 0 && args.k > 0 && args.batch > 0, who,
           ": empty shape m=", args.m, " n=", args.n, " k=", args.k, " batch=", args.batch);
  const GemmArgs r = resolve_gemm_strides(args);
  FT_CHECK(r.lda >= (args.transpose_a ? args.m : args.k) &&
               r.ldb >= (args.transpose_b ? args.k : args.n) && r.ldc >= args.n,
           who, ": leading dimension too small (lda=", r.lda, " ldb=", r.ldb, " ldc=", r.ldc,
           " for m=", args.m, " n=", args.n, " k=", args.k, ")");
  const bool forward = epilogue == Epilogue::kNone || epilogue == Epilogue::kRelu ||
                       epilogue == Epilogue::kGeluTanh || epilogue == Epilogue::kGeluTanhAux;
  const bool uses_aux = epilogue == Epilogue::kGeluTanhAux || epilogue == Epilogue::kDGeluTanh ||
                        epilogue == Epilogue::kDGeluTanhBiasGrad;
  const bool writes_bias_grad =
      epilogue == Epilogue::kDGeluTanhBiasGrad || epilogue == Epilogue::kBiasGradA;
  FT_CHECK(!args.accumulate || epilogue == Epilogue::kNone || epilogue == Epilogue::kBiasGradA, who,
           ": accumulate with the ", epilogue_name(epilogue), " epilogue is not supported");
  FT_CHECK(args.bias == nullptr || args.alpha == 1.0f, who, ": alpha with bias is not supported");
  // cuBLASLt's BGRADB reduces the A operand itself, so it would not see alpha; keep it 1.
  FT_CHECK(epilogue != Epilogue::kBiasGradA || args.alpha == 1.0f, who,
           ": alpha with the bias_grad_a epilogue is not supported");
  FT_CHECK(args.bias == nullptr || forward, who, ": the ", epilogue_name(epilogue),
           " epilogue takes no bias");
  FT_CHECK((args.aux != nullptr) == uses_aux, who, ": the ", epilogue_name(epilogue), " epilogue ",
           uses_aux ? "needs" : "takes no", " aux buffer");
  FT_CHECK(!uses_aux || r.ld_aux >= args.n, who, ": ld_aux ", r.ld_aux, " < n ", args.n);
  FT_CHECK((args.bias_grad != nullptr) == writes_bias_grad, who, ": the ", epilogue_name(epilogue),
           " epilogue ", writes_bias_grad ? "needs" : "takes no", " bias_grad buffer");
  FT_CHECK(args.batch == 1 || !(uses_aux || writes_bias_grad), who, ": the ",
           epilogue_name(epilogue), " epilogue needs batch 1, got ", args.batch);
}

GemmShapeKey GemmShapeKey::of(const GemmArgs& resolved, DType operands) {
  const GemmArgs& r = resolved;
  return {r.m,
          r.n,
          r.k,
          r.batch,
          r.transpose_a,
          r.transpose_b,
          r.lda,
          r.ldb,
          r.ldc,
          r.batch_stride_a,
          r.batch_stride_b,
          r.batch_stride_c,
          r.alpha,
          r.accumulate,
          r.bias != nullptr,
          r.epilogue,
          operands};
}

namespace {

struct CachedGemm {
  dnnl::matmul primitive;
  dnnl::memory src, weights, bias, dst;
};

// One cache per C dtype: fp32 (gemm) and bf16 (gemm_bf16_output).
std::map<GemmShapeKey, CachedGemm>& cache(DType output) {
  static std::map<GemmShapeKey, CachedGemm> fp32_output, bf16_output;
  return output == DType::kBF16 ? bf16_output : fp32_output;
}

// Row-major X[rows, cols] with row stride `ld`; `transposed` means the storage is [cols, rows].
dnnl::memory::desc matrix_desc(int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                               int64_t batch_stride, bool transposed, DType dtype = DType::kF32) {
  using dims = dnnl::memory::dims;
  const dims row_col_strides = transposed ? dims{1, ld} : dims{ld, 1};
  const auto type =
      dtype == DType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  return dnnl::memory::desc({batch, rows, cols}, type,
                            {batch_stride, row_col_strides[0], row_col_strides[1]});
}

// `r` has resolved strides and an epilogue oneDNN runs itself (kNone, kRelu, kGeluTanh).
CachedGemm make_gemm(const GemmArgs& r, DType operands, DType output) {
  dnnl::engine& engine = cpu_engine();
  const auto src_md =
      matrix_desc(r.batch, r.m, r.k, r.lda, r.batch_stride_a, r.transpose_a, operands);
  const auto weights_md =
      matrix_desc(r.batch, r.k, r.n, r.ldb, r.batch_stride_b, r.transpose_b, operands);
  const auto dst_md = matrix_desc(r.batch, r.m, r.n, r.ldc, r.batch_stride_c, false, output);
  dnnl::memory::desc bias_md;
  if (r.bias != nullptr)
    bias_md = dnnl::memory::desc({1, 1, r.n}, dnnl::memory::data_type::f32, {r.n, r.n, 1});

  dnnl::primitive_attr attr;
  dnnl::post_ops post_ops;
  if (r.accumulate) post_ops.append_sum(1.0f);
  if (r.epilogue == Epilogue::kRelu)
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (r.epilogue == Epilogue::kGeluTanh)
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  attr.set_post_ops(post_ops);
  if (r.alpha != 1.0f) attr.set_output_scales(0, {r.alpha});

  dnnl::matmul::desc desc = r.bias != nullptr
                                ? dnnl::matmul::desc(src_md, weights_md, bias_md, dst_md)
                                : dnnl::matmul::desc(src_md, weights_md, dst_md);
  dnnl::matmul::primitive_desc pd(desc, attr, engine);
  CachedGemm gemm;
  gemm.primitive = dnnl::matmul(pd);
  gemm.src = dnnl::memory(src_md, engine, DNNL_MEMORY_NONE);
  gemm.weights = dnnl::memory(weights_md, engine, DNNL_MEMORY_NONE);
  gemm.dst = dnnl::memory(dst_md, engine, DNNL_MEMORY_NONE);
  if (r.bias != nullptr) gemm.bias = dnnl::memory(bias_md, engine, DNNL_MEMORY_NONE);
  return gemm;
}

// C is fp32 (float*) or, with `output` bf16, bf16_bits*.
void run_onednn(void* c, GemmOperand a, GemmOperand b, const GemmArgs& r,
                DType output = DType::kF32) {
  const GemmShapeKey key = GemmShapeKey::of(r, a.dtype);
  auto& gemms = cache(output);
  auto it = gemms.find(key);
  if (it == gemms.end()) it = gemms.emplace(key, make_gemm(r, a.dtype, output)).first;
  CachedGemm& cached = it->second;
  cached.src.set_data_handle(const_cast<void*>(a.data));
  cached.weights.set_data_handle(const_cast<void*>(b.data));
  cached.dst.set_data_handle(c);
  std::unordered_map<int, dnnl::memory> exec_args{
      {DNNL_ARG_SRC, cached.src}, {DNNL_ARG_WEIGHTS, cached.weights}, {DNNL_ARG_DST, cached.dst}};
  if (r.bias != nullptr) {
    cached.bias.set_data_handle(const_cast<float*>(r.bias));
    exec_args.emplace(DNNL_ARG_BIAS, cached.bias);
  }
  cached.primitive.execute(cpu_stream(), exec_args);
  cpu_stream().wait();
}

// The epilogues oneDNN has no post-op for: a plain oneDNN GEMM, then one host pass over C (the
// same split as cuBLASLt's unfused fallback). `r` has resolved strides and batch == 1.
float operand_at(GemmOperand operand, int64_t index) {
  return operand.dtype == DType::kBF16
             ? bf16_to_float(static_cast<const bf16_bits*>(operand.data)[index])
             : static_cast<const float*>(operand.data)[index];
}

void run_with_host_epilogue(float* c, GemmOperand a, GemmOperand b, const GemmArgs& r) {
  GemmArgs plain = r;
  plain.epilogue = Epilogue::kNone;
  const int64_t M = r.m, N = r.n;
  switch (r.epilogue) {
    case Epilogue::kGeluTanhAux: {
      plain.ldc = r.ld_aux;
      run_onednn(r.aux, a, b, plain);  // aux = pre = P + bias
#pragma omp parallel for if (M * N > 262144)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) c[i * r.ldc + j] = gelu_tanh(r.aux[i * r.ld_aux + j]);
      return;
    }
    case Epilogue::kDGeluTanh:
    case Epilogue::kDGeluTanhBiasGrad: {
      run_onednn(c, a, b, plain);
#pragma omp parallel for if (M * N > 262144)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) c[i * r.ldc + j] *= gelu_tanh_grad(r.aux[i * r.ld_aux + j]);
      if (r.epilogue == Epilogue::kDGeluTanhBiasGrad) {
        for (int64_t j = 0; j < N; ++j) r.bias_grad[j] = 0.0f;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) r.bias_grad[j] += c[i * r.ldc + j];
      }
      return;
    }
    case Epilogue::kBiasGradA: {
      run_onednn(c, a, b, plain);
      // op(A)[m, k] is a[m * lda + k], or a[k * lda + m] when A is stored transposed.
      for (int64_t i = 0; i < M; ++i) r.bias_grad[i] = 0.0f;
      for (int64_t p = 0; p < r.k; ++p)
        for (int64_t i = 0; i < M; ++i)
          r.bias_grad[i] += operand_at(a, r.transpose_a ? p * r.lda + i : i * r.lda + p);
      return;
    }
    case Epilogue::kNone:
    case Epilogue::kRelu:
    case Epilogue::kGeluTanh:
      break;
  }
  FT_CHECK(false, "gemm: epilogue ", epilogue_name(r.epilogue), " has no host pass");
}

bool timing_enabled = false;
double timed_ms = 0.0;
double conv_timed = 0.0;  // ConvTimeGuard's sum
bool tf32_enabled = false;

}  // namespace

void set_gemm_timing(bool on) {
  timing_enabled = on;
}
double gemm_timed_ms() {
  return timed_ms;
}
ConvTimeGuard::ConvTimeGuard() {
  if (timing_enabled) start_ms_ = now_ms();
}
ConvTimeGuard::~ConvTimeGuard() {
  if (start_ms_ >= 0) conv_timed += now_ms() - start_ms_;
}
double conv_timed_ms() {
  return conv_timed;
}
void set_gemm_tf32(bool on) {
  tf32_enabled = on;
}
bool gemm_tf32() {
  return tf32_enabled;
}

namespace {

void gemm_dispatch(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args);

// Elements a strided operand spans: the last element of the last matrix, plus one.
int64_t operand_span(int64_t batch, int64_t batch_stride, int64_t rows, int64_t cols, int64_t ld,
                     bool transposed) {
  const int64_t last = transposed ? (cols - 1) * ld + (rows - 1) : (rows - 1) * ld + (cols - 1);
  return (batch - 1) * batch_stride + last + 1;
}

// The widening path of a bf16 GEMM: both operands (with their gaps, so strides still hold) to
// fp32 scratch, then the fp32 GEMM.
void gemm_widened(float* c, GemmOperand a, GemmOperand b, const GemmArgs& r) {
  static thread_local std::vector<float> wide_a, wide_b;
  const int64_t span_a = operand_span(r.batch, r.batch_stride_a, r.m, r.k, r.lda, r.transpose_a);
  const int64_t span_b = operand_span(r.batch, r.batch_stride_b, r.k, r.n, r.ldb, r.transpose_b);
  wide_a.resize(static_cast<size_t>(span_a));
  wide_b.resize(static_cast<size_t>(span_b));
  cast_to_float(wide_a.data(), static_cast<const bf16_bits*>(a.data), span_a);
  cast_to_float(wide_b.data(), static_cast<const bf16_bits*>(b.data), span_b);
  gemm_dispatch(c, wide_a.data(), wide_b.data(), r);
}

}  // namespace

bool bf16_gemm_native() {
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
}

bool avx512_bf16_kernels_run() {
  static const bool run = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && bf16_gemm_native();
  }();
  return run;
}

const char* bf16_gemm_path() {
  return bf16_gemm_native()
             ? "oneDNN bf16 kernels (this CPU has bf16 instructions)"
             : "no bf16 instructions on this CPU: bf16 operands are widened and multiplied in "
               "fp32, as slow as fp32";
}

namespace {

void gemm_dispatch(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args) {
  check_gemm_args(args, "gemm");
  FT_CHECK(a.dtype == b.dtype, "gemm: a ", dtype_name(a.dtype), " A with a ", dtype_name(b.dtype),
           " B");
  const GemmArgs resolved = resolve_gemm_strides(args);
  if (a.dtype == DType::kBF16 && !bf16_gemm_native()) return gemm_widened(c, a, b, resolved);
  if (args.epilogue == Epilogue::kNone || args.epilogue == Epilogue::kRelu ||
      args.epilogue == Epilogue::kGeluTanh)
    run_onednn(c, a, b, resolved);
  else
    run_with_host_epilogue(c, a, b, resolved);
}

}  // namespace

namespace {

// run(), its time added to gemm_timed_ms() while timing is on.
template <typename Run>
void timed(const Run& run) {
  if (!timing_enabled) return run();
  const double start_ms = now_ms();
  run();
  timed_ms += now_ms() - start_ms;
}

}  // namespace

void gemm(float* c, GemmOperand a, GemmOperand b, const GemmArgs& args) {
  timed([&] { gemm_dispatch(c, a, b, args); });
}

void gemm_bf16_output(bf16_bits* c, GemmOperand a, GemmOperand b, const GemmArgs& args) {
  check_gemm_args(args, "gemm_bf16_output");
  FT_CHECK(a.dtype == DType::kBF16 && b.dtype == DType::kBF16 && bf16_gemm_native(),
           "gemm_bf16_output: needs bf16 A and B and a CPU with bf16 instructions");
  FT_CHECK(
      args.epilogue == Epilogue::kNone && !args.accumulate && args.batch == 1 && args.alpha == 1.0f,
      "gemm_bf16_output: takes a bias only (no epilogue, accumulate, batch or alpha)");
  timed([&] { run_onednn(c, a, b, resolve_gemm_strides(args), DType::kBF16); });
}

}  // namespace ft
