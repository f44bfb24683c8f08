// The PassInfo of every standard pass and switch, each declared once (fusion/pass_infos.cpp): a
// pass's info() returns its entry here. They live apart from the passes, so that what only lists
// pass keys (the config schema, bench, tune, fusion advice) links without any pass or fused op:
// this header needs fusion/pass.h only, and its .cpp nothing but fusion/pass.cpp.
// Thread safety: each is built once (function-local static) and read-only afterwards.
#pragma once
#include "fusion/pass.h"

namespace ft {

// fold_bn_info(), qkv_info(), ...: one per line of fusion/standard_passes.def.
#define FT_PASS(name) const PassInfo& name##_info();
#define FT_SWITCH(name) FT_PASS(name)
#include "fusion/standard_passes.def"
#undef FT_SWITCH
#undef FT_PASS

}  // namespace ft
