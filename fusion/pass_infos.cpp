// Every standard pass's PassInfo: its key, switch, doc, the fused op kinds it may create, the
// passes it must run after (why: the file-top comment of fusion/<name>_pass.cpp) and the edges or
// families fusion advice names it for. Only data: no pass, op or graph code is reached from here.
// Thread safety: each is built once (function-local static) and read-only afterwards.
#include "fusion/pass_infos.h"

namespace ft {

// A pass's name, family and switch, all from its FusionOptions member: they cannot disagree.
#define FT_VERTICAL(name) \
#name, PassFamily::kVertical, +[](FusionOptions & o) { return &o.vertical.name; }
#define FT_HORIZONTAL(name) \
#name, PassFamily::kHorizontal, +[](FusionOptions & o) { return &o.horizontal.name; }
#define FT_INFERENCE(name) #name, PassFamily::kInference, +[](FusionOptions & o) { return &o.name; }

const PassInfo& fold_bn_info() {
  static const PassInfo info{
      FT_INFERENCE(fold_bn),
      "eval graphs fold BatchNorm into the convolution before it, with the ReLU and residual "
      "add after it as the convolution's epilogue (resnet)",
      {OpKind::kConvBias},
      {},
      {},
      {}};
  return info;
}

const PassInfo& qkv_info() {
  static const PassInfo info{FT_HORIZONTAL(qkv),
                             "the q, k and v Linears as one GEMM into a [rows, 3C] buffer (gpt)",
                             {OpKind::kQkvLinear},
                             {},
                             {},
                             {{OpKind::kLinear, true, 0}}};
  return info;
}

const PassInfo& batched_layernorm_info() {
  static const PassInfo info{FT_HORIZONTAL(batched_layernorm),
                             "the per-head q/k LayerNorms of qk_norm as one batched op (gpt)",
                             {OpKind::kBatchedLayerNorm},
                             {},
                             {},
                             {{OpKind::kLayerNorm, false, 0}}};
  return info;
}

// No graph rewrite: the trainer reads the key to run the optimizer step, gradient zeroing and
// gradient norm as chunked sweeps over the flat buffers (fusion/multi_tensor.h) instead of one
// loop per tensor.
const PassInfo& multi_tensor_info() {
  static const PassInfo info{
      FT_HORIZONTAL(multi_tensor),
      "optimizer step, gradient zeroing and gradient norm as chunked passes over the flat "
      "buffers; on the CPU the update also applies the clip and zeroes the gradients",
      {},
      {},
      {},
      {}};
  return info;
}

const PassInfo& conv_shortcut_info() {
  static const PassInfo info{
      FT_HORIZONTAL(conv_shortcut),
      "a downsampling block's 3x3 conv and 1x1 shortcut as one conv, within max_padding_overhead "
      "(resnet)",
      {OpKind::kConvShortcut},
      {"fold_bn"},
      {},
      {{OpKind::kConv2d, true, 2}}};
  return info;
}

const PassInfo& gemm_epilogue_info() {
  static const PassInfo info{
      FT_VERTICAL(gemm_epilogue),
      "Linear -> GELU as one op: the GELU runs on row tiles of the GEMM output (gpt)",
      {OpKind::kLinearGelu},
      {},
      {{OpKind::kLinear, OpKind::kGelu}},
      {}};
  return info;
}

const PassInfo& residual_layernorm_info() {
  static const PassInfo info{FT_VERTICAL(residual_layernorm),
                             "dropout -> residual add -> next LayerNorm as one op (gpt)",
                             {OpKind::kResidualLayerNorm},
                             {},
                             {{OpKind::kResidualAdd, OpKind::kLayerNorm}},
                             {}};
  return info;
}

const PassInfo& classifier_info() {
  static const PassInfo info{
      FT_VERTICAL(classifier),
      "LM head -> softmax -> cross-entropy row block by row block, no probability tensor (gpt)",
      {OpKind::kClassifier},
      {},
      {{OpKind::kLmHead, OpKind::kCrossEntropy}},
      {}};
  return info;
}

const PassInfo& attention_info() {
  static const PassInfo info{
      FT_VERTICAL(attention),
      "scores -> causal softmax -> weighted sum as one tiled op with an online softmax (gpt)",
      {OpKind::kFlashAttention},
      {"qkv"},
      {{OpKind::kAttentionScores, OpKind::kCausalSoftmax},
       {OpKind::kCausalSoftmax, OpKind::kAttentionMix}},
      {}};
  return info;
}

const PassInfo& bn_relu_info() {
  static const PassInfo info{
      FT_VERTICAL(bn_relu),
      "BatchNorm -> ReLU and [BatchNorm(s) ->] residual add -> ReLU as one op each (resnet)",
      {OpKind::kBatchNormRelu, OpKind::kBatchNormInferenceRelu, OpKind::kAddRelu,
       OpKind::kBatchNormAddRelu},
      {"fold_bn"},
      {{OpKind::kBatchNorm, OpKind::kRelu},
       {OpKind::kResidualAdd, OpKind::kRelu},
       {OpKind::kBatchNorm, OpKind::kResidualAdd}},
      {}};
  return info;
}

const PassInfo& cast_info() {
  static const PassInfo info{
      FT_VERTICAL(cast),
      "train.precision bf16: the op producing a GEMM or convolution operand (LayerNorm, "
      "residual+LayerNorm, GELU, Linear+GELU, the QKV GEMM, flash attention; ReLU, "
      "BatchNorm+ReLU, BatchNorm+add+ReLU) writes it in bf16, absorbing the cast op after it",
      {OpKind::kLayerNormCast, OpKind::kGeluCast, OpKind::kReluCast, OpKind::kQkvLinear},
      {"gemm_epilogue", "residual_layernorm", "attention", "bn_relu", "qkv"},
      {{OpKind::kLayerNorm, OpKind::kCast},
       {OpKind::kGelu, OpKind::kCast},
       {OpKind::kResidualLayerNorm, OpKind::kCast},
       {OpKind::kLinearGelu, OpKind::kCast},
       {OpKind::kQkvLinear, OpKind::kCast},
       {OpKind::kFlashAttention, OpKind::kCast},
       {OpKind::kRelu, OpKind::kCast},
       {OpKind::kBatchNormRelu, OpKind::kCast},
       {OpKind::kBatchNormAddRelu, OpKind::kCast}},
      {}};
  return info;
}

#undef FT_VERTICAL
#undef FT_HORIZONTAL
#undef FT_INFERENCE

}  // namespace ft
