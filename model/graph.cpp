#include "model/graph.h"

#include "core/check.h"

namespace ft {

const char* graph_mode_name(GraphMode mode) {
  return mode == GraphMode::kTrain ? "train" : "eval";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kLayerNorm:
      return "layernorm";
    case OpKind::kLinear:
      return "linear";
    case OpKind::kGelu:
      return "gelu";
    case OpKind::kDropout:
      return "dropout";
    case OpKind::kResidualAdd:
      return "residual";
    case OpKind::kAttentionScores:
      return "attention_scores";
    case OpKind::kCausalSoftmax:
      return "causal_softmax";
    case OpKind::kAttentionMix:
      return "attention_mix";
    case OpKind::kLmHead:
      return "lm_head";
    case OpKind::kCrossEntropy:
      return "cross_entropy";
    case OpKind::kConv2d:
      return "conv2d";
    case OpKind::kBatchNorm:
      return "batchnorm2d";
    case OpKind::kBatchNormInference:
      return "batchnorm2d_inference";
    case OpKind::kRelu:
      return "relu";
    case OpKind::kGlobalAvgPool:
      return "global_avg_pool";
    case OpKind::kCast:
      return "cast";
    case OpKind::kLayerNormCast:
      return "layernorm_cast";
    case OpKind::kGeluCast:
      return "gelu_cast";
    case OpKind::kReluCast:
      return "relu_cast";
    case OpKind::kLinearGelu:
      return "linear_gelu";
    case OpKind::kResidualLayerNorm:
      return "residual_layernorm";
    case OpKind::kClassifier:
      return "classifier";
    case OpKind::kFlashAttention:
      return "flash_attention";
    case OpKind::kBatchNormRelu:
      return "batchnorm_relu";
    case OpKind::kBatchNormInferenceRelu:
      return "batchnorm_inference_relu";
    case OpKind::kAddRelu:
      return "add_relu";
    case OpKind::kBatchNormAddRelu:
      return "batchnorm_add_relu";
    case OpKind::kQkvLinear:
      return "qkv_linear";
    case OpKind::kBatchedLayerNorm:
      return "batched_layernorm";
    case OpKind::kConvShortcut:
      return "conv_shortcut";
    case OpKind::kConvBias:
      return "conv_bias";
    case OpKind::kOther:
      return "other";
  }
  return "unknown";
}

OpCost Op::cost(const Graph& graph) const {
  OpCost cost;
  for (ValueId id : inputs)
    cost.bytes_read += graph.element_bytes(id) * static_cast<double>(graph.numel(id));
  for (ValueId id : outputs)
    cost.bytes_written += graph.element_bytes(id) * static_cast<double>(graph.numel(id));
  return cost;
}

ValueId Graph::add_view(const std::string& name, ValueId base, int64_t column_offset,
                        int64_t width) {
  FT_CHECK(base >= 0 && base < static_cast<ValueId>(values.size()), "add_view '", name,
           "': no value ", base);
  if (values[base].is_view()) {
    column_offset += values[base].column_offset;
    base = values[base].view_of;
  }
  const int64_t stride = values[base].shape.back();
  FT_CHECK(column_offset >= 0 && column_offset + width <= stride, "add_view '", name,
           "': columns [", column_offset, ", ", column_offset + width, ") exceed the ", stride,
           " of '", values[base].name, "'");
  const int64_t rows = numel(base) / stride;
  Value view{name, {rows, width}};
  view.view_of = base;
  view.column_offset = column_offset;
  view.dtype = values[base].dtype;
  values.push_back(view);
  return static_cast<ValueId>(values.size() - 1);
}

int64_t Graph::row_stride(ValueId id) const {
  const Value& value = values.at(id);
  return value.is_view() ? values.at(value.view_of).shape.back() : value.shape.back();
}

}  // namespace ft
