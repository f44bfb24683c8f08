// Host-side pieces of the CUDA ResNet path that need no GPU: the key under which conv2d.cu caches
// cuDNN's algorithm choice (model/ops/conv_algo_key.h) and the FT_HD BatchNorm-folding helpers of
// fusion/ops/conv_bias.h, checked against the formula evaluated in double.
#include "model/ops/conv_algo_key.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <unordered_set>
#include <vector>

#include "fusion/ops/conv_bias.h"

namespace ft {
namespace {

ConvAlgoKey resnet_key() {
  ConvAlgoKey key;
  key.n = 64;
  key.c = 16;
  key.h = 32;
  key.w = 32;
  key.k = 32;
  key.r = 3;
  key.s = 3;
  key.stride = 2;
  key.pad = 1;
  key.dilation = 1;
  return key;
}

// Every field changed alone, plus the two layouts and three passes.
std::vector<ConvAlgoKey> one_field_variants() {
  std::vector<ConvAlgoKey> keys;
  const ConvAlgoKey base = resnet_key();
  keys.push_back(base);
  int ConvAlgoKey::*fields[] = {&ConvAlgoKey::n,       &ConvAlgoKey::c,      &ConvAlgoKey::h,
                                &ConvAlgoKey::w,       &ConvAlgoKey::k,      &ConvAlgoKey::r,
                                &ConvAlgoKey::s,       &ConvAlgoKey::stride, &ConvAlgoKey::pad,
                                &ConvAlgoKey::dilation};
  for (int ConvAlgoKey::*field : fields) {
    ConvAlgoKey key = base;
    key.*field += 1;
    keys.push_back(key);
  }
  ConvAlgoKey nchw = base;
  nchw.nchw_input = true;
  keys.push_back(nchw);
  for (ConvPass pass : {ConvPass::kBackwardData, ConvPass::kBackwardFilter}) {
    ConvAlgoKey key = base;
    key.pass = pass;
    keys.push_back(key);
  }
  return keys;
}

TEST(ConvAlgoKey, EqualShapesGiveEqualKeys) {
  const ConvAlgoKey a = resnet_key(), b = resnet_key();
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a < b);
  EXPECT_FALSE(b < a);
  EXPECT_EQ(ConvAlgoKeyHash()(a), ConvAlgoKeyHash()(b));
  EXPECT_EQ(a.text(), b.text());
}

TEST(ConvAlgoKey, EveryFieldDistinguishesKeys) {
  const std::vector<ConvAlgoKey> keys = one_field_variants();
  std::set<ConvAlgoKey> ordered(keys.begin(), keys.end());
  std::unordered_set<ConvAlgoKey, ConvAlgoKeyHash> hashed(keys.begin(), keys.end());
  std::set<std::string> texts;
  std::set<size_t> hashes;
  for (const ConvAlgoKey& key : keys) {
    texts.insert(key.text());
    hashes.insert(ConvAlgoKeyHash()(key));
  }
  EXPECT_EQ(ordered.size(), keys.size());
  EXPECT_EQ(hashed.size(), keys.size());
  EXPECT_EQ(texts.size(), keys.size()) << "two keys print alike";
  EXPECT_EQ(hashes.size(), keys.size()) << "a hash collision among one-field changes";
  for (size_t i = 1; i < keys.size(); ++i) EXPECT_NE(keys[0], keys[i]) << keys[i].text();
}

TEST(ConvAlgoKey, TextNamesPassShapeAndGeometry) {
  ConvAlgoKey key = resnet_key();
  key.pass = ConvPass::kBackwardFilter;
  EXPECT_EQ(key.text(),
            "backward_filter x[64,16,32,32] nhwc w[32,16,3,3] stride 2 pad 1 dilation 1");
  key.nchw_input = true;
  key.pass = ConvPass::kForward;
  EXPECT_EQ(key.text(), "forward x[64,16,32,32] nchw w[32,16,3,3] stride 2 pad 1 dilation 1");
}

TEST(ConvAlgoCache, ChoosesOncePerKey) {
  ConvAlgoCache cache;
  int searches = 0;
  auto choose = [&](const ConvAlgoKey& key) {
    ++searches;
    ConvAlgoChoice choice;
    choice.algorithm = key.c;
    choice.workspace_bytes = static_cast<size_t>(key.n) * 100;
    return choice;
  };
  const ConvAlgoKey a = resnet_key();
  ConvAlgoKey b = a;
  b.c = 64;
  EXPECT_EQ(cache.get(a, choose).algorithm, 16);
  EXPECT_EQ(cache.get(a, choose).workspace_bytes, 6400u);
  EXPECT_EQ(searches, 1);
  EXPECT_EQ(cache.get(b, choose).algorithm, 64);
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(cache.get(b, choose).algorithm, 64);
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(FoldBatchnormHelpers, MatchTheFormulaInDouble) {
  const double gamma = 1.7, var = 0.37, eps = 1e-5, mean = -0.61, beta = 0.23, bias = 0.11;
  const double w = -0.83;
  const double scale = gamma / std::sqrt(var + eps);
  EXPECT_DOUBLE_EQ(fold_batchnorm_scale(gamma, var, eps), scale);
  EXPECT_DOUBLE_EQ(fold_batchnorm_weight(w, scale), w * scale);
  EXPECT_DOUBLE_EQ(fold_batchnorm_bias(bias, mean, scale, beta), (bias - mean) * scale + beta);
  // In float the same helpers stay within float rounding of the double result.
  const float scale_f = fold_batchnorm_scale<float>(1.7f, 0.37f, 1e-5f);
  EXPECT_NEAR(scale_f, scale, 4e-7 * scale);
  EXPECT_NEAR(fold_batchnorm_bias<float>(0.11f, -0.61f, scale_f, 0.23f),
              (bias - mean) * scale + beta, 1e-6);
}

TEST(FoldBatchnormHelpers, FoldBatchnormUsesThemPerChannel) {
  // Two output channels of four weights each, with a conv bias.
  const std::vector<float> weight = {0.5f, -1.25f, 2.0f, 0.125f, -0.75f, 1.5f, 0.25f, -2.5f};
  const std::vector<float> conv_bias = {0.3f, -0.2f}, gamma = {1.5f, -0.5f}, beta = {0.1f, 0.7f};
  const std::vector<float> mean = {0.4f, -1.1f}, var = {0.09f, 2.25f};
  const double eps = 1e-3;
  std::vector<float> folded_weight(8), folded_bias(2);
  fold_batchnorm(folded_weight.data(), folded_bias.data(), weight.data(), conv_bias.data(),
                 gamma.data(), beta.data(), mean.data(), var.data(), eps, 2, 4);
  for (int o = 0; o < 2; ++o) {
    const double s = static_cast<double>(gamma[o]) / std::sqrt(static_cast<double>(var[o]) + eps);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(folded_weight[o * 4 + i], static_cast<float>(weight[o * 4 + i] * s)) << o << i;
    EXPECT_EQ(folded_bias[o], static_cast<float>((static_cast<double>(conv_bias[o]) - mean[o]) * s +
                                                 static_cast<double>(beta[o])))
        << o;
  }
}

}  // namespace
}  // namespace ft
