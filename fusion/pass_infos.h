// The PassInfo of every standard pass and switch, each declared once (fusion/pass_infos.cpp): a
// pass's info() returns its entry here, and PassRegistry::standard() (fusion/pass_registry.h)
// lists them in run order. They live apart from the passes, so that what only lists pass keys
// (the config schema, bench, tune, fusion advice) links without any pass or fused op: this header
// needs fusion/pass.h only, and its .cpp nothing but fusion/pass.cpp.
// Thread safety: each is built once (function-local static) and read-only afterwards.
#pragma once
#include "fusion/pass.h"

namespace ft {

const PassInfo& fold_bn_info();             // inference.fold_bn (eval graphs)
const PassInfo& qkv_info();                 // fusion.horizontal.qkv
const PassInfo& batched_layernorm_info();   // fusion.horizontal.batched_layernorm
const PassInfo& multi_tensor_info();        // fusion.horizontal.multi_tensor: a switch, no pass
const PassInfo& conv_shortcut_info();       // fusion.horizontal.conv_shortcut
const PassInfo& gemm_epilogue_info();       // fusion.vertical.gemm_epilogue
const PassInfo& residual_layernorm_info();  // fusion.vertical.residual_layernorm
const PassInfo& classifier_info();          // fusion.vertical.classifier
const PassInfo& attention_info();           // fusion.vertical.attention
const PassInfo& bn_relu_info();             // fusion.vertical.bn_relu
const PassInfo& cast_info();                // fusion.vertical.cast

}  // namespace ft
