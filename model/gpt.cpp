// GPT-2 graph builder: parameter registration in canonical order, and the pre-LN op graph.
#include "model/gpt.h"

#include <cmath>
#include <string>

#include "core/check.h"
#include "core/rng.h"
#include "model/gemm_input_casts.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/dropout.h"
#include "model/ops/embedding.h"
#include "model/ops/gelu.h"
#include "model/ops/layernorm.h"
#include "model/ops/linear.h"
#include "model/ops/lm_head.h"
#include "model/ops/residual.h"

namespace ft {

void validate_gpt_shape(const GptShape& shape) {
  if (shape.n_layer < 1) FT_FAIL("model.n_layer = ", shape.n_layer, ": must be >= 1");
  if (shape.n_head < 1) FT_FAIL("model.n_head = ", shape.n_head, ": must be >= 1");
  if (shape.d_model < 1) FT_FAIL("model.d_model = ", shape.d_model, ": must be >= 1");
  if (shape.d_model % shape.n_head != 0)
    FT_FAIL("model.d_model = ", shape.d_model,
            ": must be divisible by model.n_head = ", shape.n_head);
  if (shape.seq_len < 1) FT_FAIL("model.seq_len = ", shape.seq_len, ": must be >= 1");
  if (shape.vocab_size < 1) FT_FAIL("model.vocab_size = ", shape.vocab_size, ": must be >= 1");
  if (!(shape.dropout >= 0.0f && shape.dropout < 1.0f))
    FT_FAIL("model.dropout = ", shape.dropout, ": must be in [0, 1)");
}

namespace {

constexpr float kInitStd = 0.02f;

ParamId add_matrix(ParamStore& params, const std::string& name, int64_t rows, int64_t cols,
                   float std) {
  return params.add(name, {rows, cols}, ParamInit::kNormal, std, /*weight_decay=*/true);
}
ParamId add_vector(ParamStore& params, const std::string& name, int64_t size, ParamInit init) {
  return params.add(name, {size}, init, 0.0f, /*weight_decay=*/false);
}

}  // namespace

GptParamIds register_gpt_params(const GptShape& shape, ParamStore& params) {
  validate_gpt_shape(shape);
  const int64_t C = shape.d_model, V = shape.vocab_size, T = shape.seq_len;
  const int64_t head_dim = C / shape.n_head;
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(shape.n_layer));
  GptParamIds ids;
  ids.wte = add_matrix(params, "wte.weight", V, C, kInitStd);
  ids.wpe = add_matrix(params, "wpe.weight", T, C, kInitStd);
  for (int layer = 0; layer < shape.n_layer; ++layer) {
    const std::string prefix = "h." + std::to_string(layer) + ".";
    GptBlockParamIds block;
    block.ln_1_weight = add_vector(params, prefix + "ln_1.weight", C, ParamInit::kOnes);
    block.ln_1_bias = add_vector(params, prefix + "ln_1.bias", C, ParamInit::kZeros);
    block.c_attn_weight = add_matrix(params, prefix + "attn.c_attn.weight", 3 * C, C, kInitStd);
    block.c_attn_bias = add_vector(params, prefix + "attn.c_attn.bias", 3 * C, ParamInit::kZeros);
    if (shape.qk_norm) {
      block.q_norm_weight =
          add_vector(params, prefix + "attn.q_norm.weight", head_dim, ParamInit::kOnes);
      block.q_norm_bias =
          add_vector(params, prefix + "attn.q_norm.bias", head_dim, ParamInit::kZeros);
      block.k_norm_weight =
          add_vector(params, prefix + "attn.k_norm.weight", head_dim, ParamInit::kOnes);
      block.k_norm_bias =
          add_vector(params, prefix + "attn.k_norm.bias", head_dim, ParamInit::kZeros);
    }
    block.attn_proj_weight = add_matrix(params, prefix + "attn.c_proj.weight", C, C, proj_std);
    block.attn_proj_bias = add_vector(params, prefix + "attn.c_proj.bias", C, ParamInit::kZeros);
    block.ln_2_weight = add_vector(params, prefix + "ln_2.weight", C, ParamInit::kOnes);
    block.ln_2_bias = add_vector(params, prefix + "ln_2.bias", C, ParamInit::kZeros);
    block.fc_weight = add_matrix(params, prefix + "mlp.c_fc.weight", 4 * C, C, kInitStd);
    block.fc_bias = add_vector(params, prefix + "mlp.c_fc.bias", 4 * C, ParamInit::kZeros);
    block.mlp_proj_weight = add_matrix(params, prefix + "mlp.c_proj.weight", C, 4 * C, proj_std);
    block.mlp_proj_bias = add_vector(params, prefix + "mlp.c_proj.bias", C, ParamInit::kZeros);
    ids.blocks.push_back(block);
  }
  ids.ln_f_weight = add_vector(params, "ln_f.weight", C, ParamInit::kOnes);
  ids.ln_f_bias = add_vector(params, "ln_f.bias", C, ParamInit::kZeros);
  return ids;
}

namespace {

// Appends ops to a graph, keeping the shape arithmetic and dropout salts in one place.
class GptGraphBuilder {
 public:
  GptGraphBuilder(const GptShape& shape, int batch, GraphMode mode, DType gemm_dtype)
      : shape_(shape),
        batch_(batch),
        rows_(static_cast<int64_t>(batch) * shape.seq_len),
        gemm_inputs_(gemm_dtype) {
    graph_.mode = mode;
  }

  Graph take() { return std::move(graph_); }
  Graph& graph() { return graph_; }
  int64_t rows() const { return rows_; }

  // A [B, T, width] activation.
  ValueId activation(const std::string& name, int64_t width) {
    return graph_.add_value(name, {batch_, shape_.seq_len, width});
  }

  ValueId layernorm(const std::string& name, ValueId x, ParamId weight, ParamId bias) {
    const ValueId y = activation(name, shape_.d_model);
    graph_.add_op<LayerNormOp>(name, {x}, {y}, {weight, bias}, rows_, shape_.d_model);
    return y;
  }

  // x as a GEMM reads it (model/gemm_input_casts.h).
  ValueId gemm_input(ValueId x) { return gemm_inputs_(graph_, x); }

  // Rows [row_offset, row_offset + out) of weight [*, in] and of bias.
  ValueId linear(const std::string& name, ValueId x, int64_t in, int64_t out, ParamId weight,
                 ParamId bias, int64_t row_offset = 0) {
    const ValueId y = activation(name, out);
    graph_.add_op<LinearOp>(name, {gemm_input(x)}, {y}, {weight, bias}, rows_, in, out, true,
                            row_offset);
    return y;
  }

  // One LayerNorm per head over head h's columns of x, written into the same columns of a new
  // [B, T, C] value: PyTorch's qk_norm applies nn.LayerNorm(head_dim) to [B, NH, T, hd].
  ValueId per_head_layernorm(const std::string& name, ValueId x, ParamId weight, ParamId bias) {
    const int64_t head_dim = shape_.d_model / shape_.n_head;
    const ValueId y = activation(name, shape_.d_model);
    for (int head = 0; head < shape_.n_head; ++head) {
      const std::string head_name = name + "." + std::to_string(head);
      const ValueId x_head = graph_.add_view(head_name + ".in", x, head * head_dim, head_dim);
      const ValueId y_head = graph_.add_view(head_name, y, head * head_dim, head_dim);
      graph_.add_op<LayerNormOp>(head_name, {x_head}, {y_head}, {weight, bias}, rows_, head_dim);
    }
    return y;
  }

  // No op at all when dropout is 0 or in an eval graph: the value passes through unchanged.
  ValueId dropout(const std::string& name, ValueId x) {
    if (shape_.dropout == 0.0f || graph_.mode == GraphMode::kEval) return x;
    const ValueId y = activation(name, shape_.d_model);
    // Salts are spread by a 64-bit mix: with small salts, (seed ^ salt) of one op at step seed s
    // would equal another op's at a nearby seed (s ^ 1 ...), repeating masks across steps.
    const uint64_t salt = mix_u64(0x6470u + dropout_count_++);
    graph_.add_op<DropoutOp>(name, {x}, {y}, {}, rows_ * shape_.d_model, shape_.dropout, salt);
    return y;
  }

  ValueId residual(const std::string& name, ValueId a, ValueId b) {
    const ValueId y = activation(name, shape_.d_model);
    graph_.add_op<ResidualAddOp>(name, {a, b}, {y}, {}, rows_ * shape_.d_model);
    return y;
  }

 private:
  GptShape shape_;
  int64_t batch_;
  int64_t rows_;
  GemmInputCasts gemm_inputs_;
  uint64_t dropout_count_ = 0;
  Graph graph_;
};

}  // namespace

Graph build_gpt_graph(const GptShape& shape, int batch, const GptParamIds& ids, GraphMode mode,
                      DType gemm_dtype) {
  validate_gpt_shape(shape);
  FT_CHECK(batch >= 1, "build_gpt_graph: batch ", batch, " must be >= 1");
  FT_CHECK(static_cast<int>(ids.blocks.size()) == shape.n_layer,
           "build_gpt_graph: ", ids.blocks.size(),
           " registered blocks, shape has n_layer = ", shape.n_layer);
  const int64_t C = shape.d_model, V = shape.vocab_size;
  GptGraphBuilder builder(shape, batch, mode, gemm_dtype);
  Graph& graph = builder.graph();

  const ValueId embedded = builder.activation("embedding", C);
  graph.add_op<EmbeddingOp>("embedding", {}, {embedded}, {ids.wte, ids.wpe}, batch, shape.seq_len,
                            shape.d_model);
  ValueId x = builder.dropout("embedding.dropout", embedded);

  for (int layer = 0; layer < shape.n_layer; ++layer) {
    const GptBlockParamIds& block = ids.blocks[layer];
    const std::string prefix = "h." + std::to_string(layer) + ".";
    FT_CHECK((block.q_norm_weight >= 0) == shape.qk_norm, "build_gpt_graph: block ", layer,
             " was registered with qk_norm = ", !shape.qk_norm, " but the shape says ",
             shape.qk_norm);

    const ValueId ln_1 = builder.layernorm(prefix + "ln_1", x, block.ln_1_weight, block.ln_1_bias);
    // q, k and v: three GEMMs over row blocks of c_attn (fusion.horizontal.qkv makes them one).
    ValueId q =
        builder.linear(prefix + "attn.q", ln_1, C, C, block.c_attn_weight, block.c_attn_bias, 0);
    ValueId k =
        builder.linear(prefix + "attn.k", ln_1, C, C, block.c_attn_weight, block.c_attn_bias, C);
    const ValueId v = builder.linear(prefix + "attn.v", ln_1, C, C, block.c_attn_weight,
                                     block.c_attn_bias, 2 * C);
    if (shape.qk_norm) {
      q = builder.per_head_layernorm(prefix + "attn.q_norm", q, block.q_norm_weight,
                                     block.q_norm_bias);
      k = builder.per_head_layernorm(prefix + "attn.k_norm", k, block.k_norm_weight,
                                     block.k_norm_bias);
    }
    // Attention as eager PyTorch runs it: scores GEMM, causal softmax, weighted-sum GEMM.
    const ValueId scores = graph.add_value(prefix + "attn.scores",
                                           {batch, shape.n_head, shape.seq_len, shape.seq_len});
    graph.add_op<AttentionScoresOp>(prefix + "attn.scores",
                                    {builder.gemm_input(q), builder.gemm_input(k)}, {scores}, {},
                                    batch, shape.seq_len, shape.d_model, shape.n_head);
    const ValueId probs = graph.add_value(prefix + "attn.softmax",
                                          {batch, shape.n_head, shape.seq_len, shape.seq_len});
    graph.add_op<CausalSoftmaxOp>(prefix + "attn.softmax", {scores}, {probs}, {}, batch,
                                  shape.n_head, shape.seq_len);
    const ValueId attended = builder.activation(prefix + "attn.mix", C);
    graph.add_op<AttentionMixOp>(prefix + "attn.mix",
                                 {builder.gemm_input(probs), builder.gemm_input(v)}, {attended}, {},
                                 batch, shape.seq_len, shape.d_model, shape.n_head);
    const ValueId attn_out = builder.linear(prefix + "attn.c_proj", attended, C, C,
                                            block.attn_proj_weight, block.attn_proj_bias);
    x = builder.residual(prefix + "residual_1", x,
                         builder.dropout(prefix + "attn.dropout", attn_out));

    const ValueId ln_2 = builder.layernorm(prefix + "ln_2", x, block.ln_2_weight, block.ln_2_bias);
    const ValueId fc =
        builder.linear(prefix + "mlp.c_fc", ln_2, C, 4 * C, block.fc_weight, block.fc_bias);
    const ValueId activated = builder.activation(prefix + "mlp.gelu", 4 * C);
    graph.add_op<GeluOp>(prefix + "mlp.gelu", {fc}, {activated}, {}, builder.rows() * 4 * C);
    const ValueId mlp_out = builder.linear(prefix + "mlp.c_proj", activated, 4 * C, C,
                                           block.mlp_proj_weight, block.mlp_proj_bias);
    x = builder.residual(prefix + "residual_2", x,
                         builder.dropout(prefix + "mlp.dropout", mlp_out));
  }

  const ValueId ln_f = builder.layernorm("ln_f", x, ids.ln_f_weight, ids.ln_f_bias);
  const ValueId logits = graph.add_value("logits", {builder.rows(), V});
  graph.add_op<TiedLmHeadOp>("lm_head", {builder.gemm_input(ln_f)}, {logits}, {ids.wte},
                             builder.rows(), C, V);
  const ValueId loss = graph.add_value("loss", {1});
  graph.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {logits}, {loss}, {}, builder.rows(), V);
  graph.output = logits;
  graph.loss = loss;
  return builder.take();
}

Graph build_gpt(const GptShape& shape, int batch, ParamStore& params, GraphMode mode,
                DType gemm_dtype) {
  const GptParamIds ids = register_gpt_params(shape, params);
  return build_gpt_graph(shape, batch, ids, mode, gemm_dtype);
}

}  // namespace ft
