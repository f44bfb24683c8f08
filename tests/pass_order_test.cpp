// The order of the fusion passes and the lists that hold it: a pipeline (fusion/pipeline.h) or a
// registry (fusion/pass_registry.h) refuses a pass listed before one it must run after
// (PassInfo::after) and a key listed twice, PassRegistry::standard() refuses an `after` name that
// is no pass, and FusionPipeline::standard() refuses to differ from PassRegistry::standard().
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusion/pass_infos.h"
#include "fusion/pass_registry.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "tests/config_test_util.h"
#include "tests/pass_registry_test_util.h"

namespace ft {
namespace {

using config_test::error_of;
using pass_registry_test::named_pass;
using pass_registry_test::NamedPass;

TEST(PassOrder, ViolatedOrderFailsLoudly) {
  FusionPipeline pipeline;
  pipeline.add(make_cast_pass());
  const std::string error = error_of([&] { pipeline.add(make_gemm_epilogue_pass()); });
  EXPECT_NE(error.find("pass 'cast' must run after 'gemm_epilogue'"), std::string::npos) << error;

  FusionPipeline toys;
  toys.add(named_pass("second", {"first"}));
  const std::string toy_error = error_of([&] { toys.add(named_pass("first", {})); });
  EXPECT_NE(toy_error.find("pass 'second' must run after 'first'"), std::string::npos) << toy_error;

  FusionPipeline twice;
  twice.add(make_qkv_pass());
  EXPECT_NE(error_of([&] { twice.add(make_qkv_pass()); }).find("twice"), std::string::npos);
}

TEST(PassOrder, RegistryChecksOrderKeysAndAfterNames) {
  PassRegistry registry;
  registry.add(cast_info());
  const std::string order = error_of([&] { registry.add(gemm_epilogue_info()); });
  EXPECT_NE(order.find("pass 'cast' must run after 'gemm_epilogue'"), std::string::npos) << order;
  const std::string twice = error_of([&] { registry.add(cast_info()); });
  EXPECT_NE(twice.find("lists key 'fusion.vertical.cast' twice"), std::string::npos) << twice;
  // In a list that has cast alone, its PassInfo::after names passes the list lacks.
  const std::string missing = error_of([&] { registry.check_after_names(); });
  EXPECT_NE(missing.find("'cast' must run after 'gemm_epilogue', which is no pass of the list"),
            std::string::npos)
      << missing;
  EXPECT_NO_THROW(PassRegistry::standard().check_after_names());
}

// FusionPipeline::standard() lists exactly PassRegistry::standard()'s entries, each pass by the
// PassInfo object of fusion/pass_infos.h.
TEST(PassOrder, StandardPipelineListsTheRegistryEntries) {
  const FusionPipeline pipeline = FusionPipeline::standard();
  EXPECT_EQ(pipeline.registry().entries(), PassRegistry::standard().entries());
  const std::vector<std::pair<std::unique_ptr<FusionPass> (*)(), const PassInfo& (*)()>> passes = {
      {make_fold_bn_pass, fold_bn_info},
      {make_qkv_pass, qkv_info},
      {make_batched_layernorm_pass, batched_layernorm_info},
      {make_conv_shortcut_pass, conv_shortcut_info},
      {make_gemm_epilogue_pass, gemm_epilogue_info},
      {make_residual_layernorm_pass, residual_layernorm_info},
      {make_classifier_pass, classifier_info},
      {make_attention_pass, attention_info},
      {make_bn_relu_pass, bn_relu_info},
      {make_cast_pass, cast_info}};
  for (const auto& [make, info] : passes) EXPECT_EQ(&make()->info(), &info()) << info().name;
  EXPECT_EQ(passes.size(), pipeline.size());
}

TEST(PassOrder, PipelineThatDriftsFromTheRegistryFailsLoudly) {
  const PassRegistry& standard = PassRegistry::standard();
  // gemm_epilogue and residual_layernorm swapped: no order constraint breaks, the lists differ.
  FusionPipeline swapped;
  for (auto make : {make_fold_bn_pass, make_qkv_pass, make_batched_layernorm_pass})
    swapped.add(make());
  swapped.add_switch(multi_tensor_info());
  for (auto make : {make_conv_shortcut_pass, make_residual_layernorm_pass, make_gemm_epilogue_pass,
                    make_classifier_pass, make_attention_pass, make_bn_relu_pass, make_cast_pass})
    swapped.add(make());
  std::string error = error_of([&] { swapped.check_entries(standard); });
  EXPECT_NE(error.find("differ at entry 5: the pipeline has 'residual_layernorm' "
                       "(fusion.vertical.residual_layernorm) where the registry has "
                       "'gemm_epilogue' (fusion.vertical.gemm_epilogue)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("fusion/standard_passes.def"), std::string::npos);

  // The multi_tensor switch left out.
  FusionPipeline no_switch;
  for (auto make :
       {make_fold_bn_pass, make_qkv_pass, make_batched_layernorm_pass, make_conv_shortcut_pass})
    no_switch.add(make());
  error = error_of([&] { no_switch.check_entries(standard); });
  EXPECT_NE(error.find("entry 3: the pipeline has 'conv_shortcut' (fusion.horizontal."
                       "conv_shortcut) where the registry has 'multi_tensor'"),
            std::string::npos)
      << error;

  // One pass more, and one less.
  FusionPipeline extra = FusionPipeline::standard();
  extra.add(named_pass("extra", {}));
  error = error_of([&] { extra.check_entries(standard); });
  EXPECT_NE(error.find("entry 11: the pipeline has 'extra' (fusion.horizontal.extra) where the "
                       "registry has nothing"),
            std::string::npos)
      << error;
  FusionPipeline first_only;
  first_only.add(make_fold_bn_pass());
  error = error_of([&] { first_only.check_entries(standard); });
  EXPECT_NE(error.find("entry 1: the pipeline has nothing where the registry has 'qkv'"),
            std::string::npos)
      << error;

  // qkv under a copy of its PassInfo: the same key, but not the registry's entry.
  FusionPipeline copied;
  copied.add(make_fold_bn_pass());
  copied.add(std::make_unique<NamedPass>(qkv_info()));
  error = error_of([&] { copied.check_entries(standard); });
  EXPECT_NE(error.find("entry 1: the pipeline has 'qkv' (fusion.horizontal.qkv) where the registry "
                       "has 'qkv' (fusion.horizontal.qkv) (another PassInfo object"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace ft
