// Factories for every compute-fusion pass, each in its own file fusion/<name>_pass.cpp with its
// fused op under fusion/ops/; a pass's info() returns its PassInfo of fusion/pass_infos.h. The
// order they run in is fusion/standard_passes.def's; each pass states its own order constraints
// in its PassInfo::after, which the pipeline checks as passes are added.
// Thread safety: passes are stateless.
#pragma once
#include <memory>

#include "fusion/pass.h"
#include "fusion/pass_infos.h"

namespace ft {

// make_fold_bn_pass(), make_qkv_pass(), ...: one per FT_PASS line of fusion/standard_passes.def.
#define FT_PASS(name) std::unique_ptr<FusionPass> make_##name##_pass();
#define FT_SWITCH(name)
#include "fusion/standard_passes.def"
#undef FT_SWITCH
#undef FT_PASS

}  // namespace ft
