// Factories for every compute-fusion pass, in the order the pipeline runs them. Each lives in its
// own file fusion/<name>_pass.cpp, with its fused op under fusion/ops/.
// Thread safety: passes are stateless.
#pragma once
#include <memory>

#include "fusion/pass.h"

namespace ft {

// Folding first: it takes conv -> BN -> ReLU chains that bn_relu would otherwise split.
std::unique_ptr<FusionPass> make_fold_bn_pass();  // inference.fold_bn (eval graphs)
// Horizontal next: QKV must be one op before attention fusion looks at its consumers.
std::unique_ptr<FusionPass> make_qkv_pass();                 // fusion.horizontal.qkv
std::unique_ptr<FusionPass> make_batched_layernorm_pass();   // fusion.horizontal.batched_layernorm
std::unique_ptr<FusionPass> make_conv_shortcut_pass();       // fusion.horizontal.conv_shortcut
std::unique_ptr<FusionPass> make_attention_pass();           // fusion.vertical.attention
std::unique_ptr<FusionPass> make_gemm_epilogue_pass();       // fusion.vertical.gemm_epilogue
std::unique_ptr<FusionPass> make_residual_layernorm_pass();  // fusion.vertical.residual_layernorm
std::unique_ptr<FusionPass> make_classifier_pass();          // fusion.vertical.classifier
std::unique_ptr<FusionPass> make_bn_relu_pass();             // fusion.vertical.bn_relu
// Last: the producers it rewrites to write bf16 are the other vertical passes' fused ops.
std::unique_ptr<FusionPass> make_cast_pass();  // fusion.vertical.cast

}  // namespace ft
