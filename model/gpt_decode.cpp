// GptDecoder (see gpt_decode.h): the eval graph of model/gpt.cpp, restricted to new positions.
// Row-wise ops (embedding, LayerNorm, Linear, GELU, residual) call the same functions the graph's
// ops call, on the new rows only; attention is the one op that needs the past, and it reads the
// cache instead of recomputing k and v for every earlier position.
#include "model/gpt_decode.h"

#include <algorithm>
#include <cmath>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/math/fast_exp.h"
#include "kernels/gelu.h"
#include "kernels/layernorm_math.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"

namespace ft {

namespace {

// LayerNormOp's forward on `rows` rows of width n with row strides (the per-head qk_norm reads
// and writes head_dim-wide column blocks); the statistics are not kept (no backward).
void layernorm_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride,
                    const float* weight, const float* bias, int64_t rows, int64_t n) {
  float mean, rstd;
  for (int64_t row = 0; row < rows; ++row)
    layernorm_row_forward(y + row * y_stride, &mean, &rstd, x + row * x_stride, weight, bias, n,
                          kLayerNormEps);
}

// Attention's operands kept as fp32 holding bf16 values: the products of two of them are exact in
// fp32, so the plain loops of attend() sum the same products as a bf16 GEMM does.
void round_to_bf16_in_place(float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) values[i] = round_to_bf16(values[i]);
}

}  // namespace

GptDecoder::GptDecoder(const GptShape& shape, const GptParamIds& ids, const ParamStore& params,
                       DType gemm_dtype)
    : shape_(shape), ids_(ids), params_(params), gemm_dtype_(gemm_dtype) {
  validate_gpt_shape(shape);
  FT_CHECK(params.allocated(), "GptDecoder: parameters are not allocated");
  FT_CHECK(gemm_dtype == DType::kF32 || params.has_bf16_copies(),
           "GptDecoder: bf16 GEMMs read the parameters' bf16 copies; call "
           "ParamStore::enable_bf16_copies() before allocate()");
  FT_CHECK(static_cast<int>(ids.blocks.size()) == shape.n_layer, "GptDecoder: ", ids.blocks.size(),
           " registered blocks, shape has n_layer = ", shape.n_layer);
  for (const GptBlockParamIds& block : ids.blocks)
    FT_CHECK((block.q_norm_weight >= 0) == shape.qk_norm,
             "GptDecoder: blocks registered with qk_norm = ", !shape.qk_norm,
             " but the shape says ", shape.qk_norm);
  const size_t T = shape.seq_len, C = shape.d_model;
  k_cache_.assign(shape.n_layer, std::vector<float>(T * C));
  v_cache_.assign(shape.n_layer, std::vector<float>(T * C));
  x_.resize(T * C);
  normed_.resize(T * C);
  qkv_.resize(T * 3 * C);
  q_.resize(T * C);
  attended_.resize(T * C);
  branch_.resize(T * C);
  hidden_.resize(T * 4 * C);
  activated_.resize(T * 4 * C);
  probs_.resize(T);
  logits_.resize(shape.vocab_size);
  if (gemm_dtype == DType::kBF16) operand_.resize(T * 4 * C);
}

// In bf16 the rows are rounded into operand_ first: the bf16 graph's cast op before each GEMM.
void GptDecoder::linear(float* y, const float* x, ParamId weight, const float* bias, int64_t rows,
                        int64_t in_features, int64_t out_features) {
  GemmOperand input = x;
  if (gemm_dtype_ == DType::kBF16) {
    cast_rows_to_bf16(operand_.data(), in_features, x, in_features, rows, in_features);
    input = operand_.data();
  }
  gemm(y, input, weight_operand(params_[weight], 0, gemm_dtype_),
       linear_forward_gemm(rows, in_features, out_features, bias, 0, 0));
}

// Per head h and new row i at position p: a = softmax(q_i k_s^T * scale, s <= p) v, the graph's
// AttentionScoresOp (alpha = scale), CausalSoftmaxOp (max-subtracted fast_exp, times 1/sum) and
// AttentionMixOp for one row. Plain loops: a row against at most seq_len cached keys is too small
// a GEMM for oneDNN's per-call overhead to pay off.
void GptDecoder::attend(int layer, int first_position, int count) {
  const int64_t C = shape_.d_model, head_dim = C / shape_.n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const float* keys = k_cache_[layer].data();
  const float* values = v_cache_[layer].data();
  float* probs = probs_.data();
  for (int i = 0; i < count; ++i) {
    const int64_t position = first_position + i;
    for (int head = 0; head < shape_.n_head; ++head) {
      const int64_t column = head * head_dim;
      const float* q_row = q_.data() + i * C + column;
      float max_score = -INFINITY;
      for (int64_t s = 0; s <= position; ++s) {
        const float* k_row = keys + s * C + column;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        probs[s] = scale * dot;
        max_score = std::max(max_score, probs[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s <= position; ++s) {
        probs[s] = fast_exp(probs[s] - max_score);
        sum += probs[s];
      }
      const float inv_sum = 1.0f / sum;
      float* out = attended_.data() + i * C + column;
      std::fill(out, out + head_dim, 0.0f);
      const bool bf16 = gemm_dtype_ == DType::kBF16;
      for (int64_t s = 0; s <= position; ++s) {
        // bf16: the graph casts the softmax's output before the mix GEMM.
        const float weight = bf16 ? round_to_bf16(probs[s] * inv_sum) : probs[s] * inv_sum;
        const float* v_row = values + s * C + column;
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) out[d] += weight * v_row[d];
      }
    }
  }
}

const float* GptDecoder::append(const int32_t* tokens, int count) {
  FT_CHECK(count >= 1 && cached_positions_ + count <= capacity(), "GptDecoder::append: ", count,
           " new positions after ", cached_positions_, " cached exceed seq_len ", capacity());
  const int64_t C = shape_.d_model, V = shape_.vocab_size, rows = count;
  const int64_t head_dim = C / shape_.n_head;
  // Stale copies would multiply the weights as they were before the last change.
  FT_CHECK(gemm_dtype_ == DType::kF32 || !params_.bf16_copies_stale(),
           "GptDecoder::append: the parameters' bf16 copies are stale; call "
           "ParamStore::refresh_bf16_copies() after changing the weights");
  const int first = cached_positions_;
  auto value = [this](ParamId id) { return params_[id].value.data(); };

  // x = wte[token] + wpe[position]: EmbeddingOp's lookup with the position table shifted so that
  // row 0 of the call is position `first + i`.
  for (int i = 0; i < count; ++i)
    embedding_forward(x_.data() + i * C, tokens + i, value(ids_.wte),
                      value(ids_.wpe) + (first + i) * C, 1, 1, static_cast<int>(C), V);

  for (int layer = 0; layer < shape_.n_layer; ++layer) {
    const GptBlockParamIds& block = ids_.blocks[layer];
    layernorm_rows(normed_.data(), C, x_.data(), C, value(block.ln_1_weight),
                   value(block.ln_1_bias), rows, C);
    // q, k, v in one GEMM over all 3C rows of c_attn: the same products as the graph's three
    // Linears over row blocks [0, C), [C, 2C), [2C, 3C).
    linear(qkv_.data(), normed_.data(), block.c_attn_weight, value(block.c_attn_bias), rows, C,
           3 * C);
    float* k_rows = k_cache_[layer].data() + first * C;
    float* v_rows = v_cache_[layer].data() + first * C;
    for (int64_t i = 0; i < rows; ++i) {
      const float* qkv_row = qkv_.data() + i * 3 * C;
      std::copy(qkv_row, qkv_row + C, q_.data() + i * C);
      std::copy(qkv_row + C, qkv_row + 2 * C, k_rows + i * C);
      std::copy(qkv_row + 2 * C, qkv_row + 3 * C, v_rows + i * C);
    }
    if (shape_.qk_norm) {
      // One LayerNorm(head_dim) per head, in place: each output element depends on its own input
      // and the row's statistics, which are computed before any output is written.
      for (int head = 0; head < shape_.n_head; ++head) {
        float* q_head = q_.data() + head * head_dim;
        float* k_head = k_rows + head * head_dim;
        layernorm_rows(q_head, C, q_head, C, value(block.q_norm_weight), value(block.q_norm_bias),
                       rows, head_dim);
        layernorm_rows(k_head, C, k_head, C, value(block.k_norm_weight), value(block.k_norm_bias),
                       rows, head_dim);
      }
    }
    if (gemm_dtype_ == DType::kBF16) {
      // The bf16 graph casts q, k and v (after qk_norm) for the scores and mix GEMMs.
      round_to_bf16_in_place(q_.data(), rows * C);
      round_to_bf16_in_place(k_rows, rows * C);
      round_to_bf16_in_place(v_rows, rows * C);
    }
    attend(layer, first, count);
    linear(branch_.data(), attended_.data(), block.attn_proj_weight, value(block.attn_proj_bias),
           rows, C, C);
    residual_forward(x_.data(), x_.data(), branch_.data(), rows * C);

    layernorm_rows(normed_.data(), C, x_.data(), C, value(block.ln_2_weight),
                   value(block.ln_2_bias), rows, C);
    linear(hidden_.data(), normed_.data(), block.fc_weight, value(block.fc_bias), rows, C, 4 * C);
    gelu_forward(activated_.data(), hidden_.data(), rows * 4 * C);
    linear(branch_.data(), activated_.data(), block.mlp_proj_weight, value(block.mlp_proj_bias),
           rows, 4 * C, C);
    residual_forward(x_.data(), x_.data(), branch_.data(), rows * C);
  }

  // Only the last new row predicts the next token, so ln_f and the LM head run on it alone.
  const float* last = x_.data() + (rows - 1) * C;
  layernorm_rows(normed_.data(), C, last, C, value(ids_.ln_f_weight), value(ids_.ln_f_bias), 1, C);
  linear(logits_.data(), normed_.data(), ids_.wte, nullptr, 1, C, V);
  cached_positions_ += count;
  return logits_.data();
}

}  // namespace ft
