#include "core/gemm.h"

#include <dnnl.hpp>
#include <map>
#include <tuple>
#include <unordered_map>

#include "core/check.h"
#include "core/dnnl_context.h"
#include "core/timer.h"

namespace ft {
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, float, bool, bool, int>;

struct CachedGemm {
  dnnl::matmul primitive;
  dnnl::memory src, weights, bias, dst;
};

std::map<Key, CachedGemm>& cache() {
  static std::map<Key, CachedGemm> gemms;
  return gemms;
}

// Row-major X[rows, cols] with row stride `ld`; `transposed` means the storage is [cols, rows].
dnnl::memory::desc matrix_desc(int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                               int64_t batch_stride, bool transposed) {
  using dims = dnnl::memory::dims;
  const dims row_col_strides = transposed ? dims{1, ld} : dims{ld, 1};
  return dnnl::memory::desc({batch, rows, cols}, dnnl::memory::data_type::f32,
                            {batch_stride, row_col_strides[0], row_col_strides[1]});
}

CachedGemm make_gemm(const GemmArgs& args, int64_t lda, int64_t ldb, int64_t ldc, int64_t sa,
                     int64_t sb, int64_t sc) {
  dnnl::engine& engine = cpu_engine();
  const auto src_md = matrix_desc(args.batch, args.m, args.k, lda, sa, args.transpose_a);
  const auto weights_md = matrix_desc(args.batch, args.k, args.n, ldb, sb, args.transpose_b);
  const auto dst_md = matrix_desc(args.batch, args.m, args.n, ldc, sc, false);
  dnnl::memory::desc bias_md;
  if (args.bias != nullptr)
    bias_md = dnnl::memory::desc({1, 1, args.n}, dnnl::memory::data_type::f32, {args.n, args.n, 1});

  dnnl::primitive_attr attr;
  dnnl::post_ops post_ops;
  if (args.accumulate) post_ops.append_sum(1.0f);
  if (args.epilogue == Epilogue::kRelu)
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (args.epilogue == Epilogue::kGeluTanh)
    post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  attr.set_post_ops(post_ops);
  if (args.alpha != 1.0f) attr.set_output_scales(0, {args.alpha});

  dnnl::matmul::desc desc = args.bias != nullptr
                                ? dnnl::matmul::desc(src_md, weights_md, bias_md, dst_md)
                                : dnnl::matmul::desc(src_md, weights_md, dst_md);
  dnnl::matmul::primitive_desc pd(desc, attr, engine);
  CachedGemm gemm;
  gemm.primitive = dnnl::matmul(pd);
  gemm.src = dnnl::memory(src_md, engine, DNNL_MEMORY_NONE);
  gemm.weights = dnnl::memory(weights_md, engine, DNNL_MEMORY_NONE);
  gemm.dst = dnnl::memory(dst_md, engine, DNNL_MEMORY_NONE);
  if (args.bias != nullptr) gemm.bias = dnnl::memory(bias_md, engine, DNNL_MEMORY_NONE);
  return gemm;
}

}  // namespace

namespace {
bool timing_enabled = false;
double timed_ms = 0.0;
}  // namespace

void set_gemm_timing(bool on) {
  timing_enabled = on;
}
double gemm_timed_ms() {
  return timed_ms;
}

void gemm(float* c, const float* a, const float* b, const GemmArgs& args) {
  const double start_ms = timing_enabled ? now_ms() : 0.0;
  FT_CHECK(args.m > 0 && args.n > 0 && args.k > 0 && args.batch > 0, "gemm: empty shape m=", args.m,
           " n=", args.n, " k=", args.k, " batch=", args.batch);
  FT_CHECK(!(args.accumulate && args.epilogue != Epilogue::kNone),
           "gemm: accumulate with an epilogue is not supported");
  FT_CHECK(args.bias == nullptr || args.alpha == 1.0f, "gemm: alpha with bias is not supported");
  const int64_t lda = args.lda ? args.lda : (args.transpose_a ? args.m : args.k);
  const int64_t ldb = args.ldb ? args.ldb : (args.transpose_b ? args.k : args.n);
  const int64_t ldc = args.ldc ? args.ldc : args.n;
  const int64_t sa = args.batch_stride_a ? args.batch_stride_a : args.m * args.k;
  const int64_t sb = args.batch_stride_b ? args.batch_stride_b : args.k * args.n;
  const int64_t sc = args.batch_stride_c ? args.batch_stride_c : args.m * args.n;
  const Key key{args.m,
                args.n,
                args.k,
                args.batch,
                args.transpose_a,
                args.transpose_b,
                lda,
                ldb,
                ldc,
                sa,
                sb,
                sc,
                args.alpha,
                args.accumulate,
                args.bias != nullptr,
                static_cast<int>(args.epilogue)};
  auto it = cache().find(key);
  if (it == cache().end())
    it = cache().emplace(key, make_gemm(args, lda, ldb, ldc, sa, sb, sc)).first;
  CachedGemm& cached = it->second;
  cached.src.set_data_handle(const_cast<float*>(a));
  cached.weights.set_data_handle(const_cast<float*>(b));
  cached.dst.set_data_handle(c);
  std::unordered_map<int, dnnl::memory> exec_args{
      {DNNL_ARG_SRC, cached.src}, {DNNL_ARG_WEIGHTS, cached.weights}, {DNNL_ARG_DST, cached.dst}};
  if (args.bias != nullptr) {
    cached.bias.set_data_handle(const_cast<float*>(args.bias));
    exec_args.emplace(DNNL_ARG_BIAS, cached.bias);
  }
  cached.primitive.execute(cpu_stream(), exec_args);
  cpu_stream().wait();
  if (timing_enabled) timed_ms += now_ms() - start_ms;
}

int64_t gemm_primitive_count() {
  return static_cast<int64_t>(cache().size());
}

}  // namespace ft
