// Factories for every compute-fusion pass, each in its own file fusion/<name>_pass.cpp with its
// fused op under fusion/ops/; a pass's info() returns its PassInfo of fusion/pass_infos.h. The
// order they run in is PassRegistry::standard() (fusion/pass_registry.cpp), which fusion/
// pipeline.cpp's standard() repeats with the factories and checks; each pass states its own order
// constraints in its PassInfo::after, which the pipeline checks as passes are added.
// Thread safety: passes are stateless.
#pragma once
#include <memory>

#include "fusion/pass.h"
#include "fusion/pass_infos.h"

namespace ft {

std::unique_ptr<FusionPass> make_fold_bn_pass();             // inference.fold_bn (eval graphs)
std::unique_ptr<FusionPass> make_qkv_pass();                 // fusion.horizontal.qkv
std::unique_ptr<FusionPass> make_batched_layernorm_pass();   // fusion.horizontal.batched_layernorm
std::unique_ptr<FusionPass> make_conv_shortcut_pass();       // fusion.horizontal.conv_shortcut
std::unique_ptr<FusionPass> make_attention_pass();           // fusion.vertical.attention
std::unique_ptr<FusionPass> make_gemm_epilogue_pass();       // fusion.vertical.gemm_epilogue
std::unique_ptr<FusionPass> make_residual_layernorm_pass();  // fusion.vertical.residual_layernorm
std::unique_ptr<FusionPass> make_classifier_pass();          // fusion.vertical.classifier
std::unique_ptr<FusionPass> make_bn_relu_pass();             // fusion.vertical.bn_relu
std::unique_ptr<FusionPass> make_cast_pass();                // fusion.vertical.cast

}  // namespace ft
