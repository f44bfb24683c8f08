// Host-side pieces of the CUDA ResNet path that need no GPU: the key under which conv2d.cu caches
// cuDNN's algorithm choice (model/ops/conv_algo_key.h), the FT_HD index math of the channels-last
// moves (model/ops/conv2d_layout.h), and the FT_HD BatchNorm-folding helpers of
// fusion/ops/conv_bias.h, checked against the formula evaluated in double.
#include "model/ops/conv_algo_key.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <unordered_set>
#include <vector>

#include "fusion/ops/conv_bias.h"
#include "model/ops/conv2d_layout.h"

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

// Every field changed alone, plus the two layouts, the two data types and three passes.
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
  ConvAlgoKey bf16 = base;
  bf16.bf16 = true;
  keys.push_back(bf16);
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
  key.pass = ConvPass::kForward;
  key.bf16 = true;
  EXPECT_EQ(key.text(), "forward x[64,16,32,32] nhwc w[32,16,3,3] stride 2 pad 1 dilation 1 bf16");
}

TEST(ConvAlgoCache, RanksOncePerKey) {
  ConvAlgoCache cache;
  int searches = 0;
  auto rank = [&](const ConvAlgoKey& key) {
    ++searches;
    ConvAlgoChoice choice;
    choice.algorithm = key.c;
    choice.workspace_bytes = static_cast<size_t>(key.n) * 100;
    return std::vector<ConvAlgoChoice>{choice};
  };
  const ConvAlgoKey a = resnet_key();
  ConvAlgoKey b = a;
  b.c = 64;
  ConvAlgoCandidates* first = &cache.get(a, rank);
  EXPECT_EQ(first->ranked.at(0).algorithm, 16);
  EXPECT_EQ(first->ranked.at(0).workspace_bytes, 6400u);
  EXPECT_EQ(searches, 1);
  EXPECT_EQ(cache.get(b, rank).ranked.at(0).algorithm, 64);
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(&cache.get(a, rank), first) << "an entry moved; convolutions keep pointers to them";
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(cache.size(), 2u);
}

ConvAlgoReport report(int algorithm, bool fma, bool deterministic, bool usable = true) {
  ConvAlgoReport r;
  r.algorithm = algorithm;
  r.usable = usable;
  r.fma_math = fma;
  r.default_math = !fma;
  r.deterministic = deterministic;
  r.workspace_bytes = static_cast<size_t>(algorithm) * 10;
  return r;
}

std::vector<int> algorithms(const std::vector<ConvAlgoChoice>& ranked) {
  std::vector<int> out;
  for (const ConvAlgoChoice& choice : ranked) out.push_back(choice.algorithm);
  return out;
}

// Deterministic before not, FMA before default math, the search before the heuristic, each
// algorithm once; failed and tensor-core entries never.
TEST(ConvAlgoRanking, OrdersSearchThenHeuristicDeterministicAndFmaFirst) {
  ConvAlgoReport tensor_cores = report(9, false, true);
  tensor_cores.default_math = false;  // CUDNN_TENSOR_OP_MATH: TF32 inputs
  const std::vector<ConvAlgoReport> searched = {
      report(1, false, false), report(2, false, true),       report(3, true, false),
      report(4, true, true),   report(5, true, true, false), tensor_cores};
  const std::vector<ConvAlgoReport> heuristic = {report(4, true, true), report(6, true, false),
                                                 report(7, true, true)};
  const std::vector<ConvAlgoChoice> ranked = rank_conv_algorithms(searched, heuristic, false);
  EXPECT_EQ(algorithms(ranked), (std::vector<int>{4, 2, 3, 1, 7, 6}));
  EXPECT_EQ(ranked[0].workspace_bytes, 40u);
  EXPECT_TRUE(ranked[0].fma_math && ranked[0].deterministic);
  EXPECT_FALSE(ranked[1].fma_math);
  EXPECT_EQ(algorithms(rank_conv_algorithms(searched, heuristic, true)),
            (std::vector<int>{4, 2, 7}));
  EXPECT_EQ(algorithms(rank_conv_algorithms({}, heuristic, false)), (std::vector<int>{4, 7, 6}));
}

// bf16 operands (ConvMath::kTensorOps): tensor-core, FMA and default math alike, in the search's
// order within deterministic and not, then the heuristic's; failed entries never.
TEST(ConvAlgoRanking, Bf16TakesEveryMathDeterministicFirst) {
  ConvAlgoReport tensor_cores = report(9, false, true);
  tensor_cores.default_math = false;  // CUDNN_TENSOR_OP_MATH
  const std::vector<ConvAlgoReport> searched = {report(1, false, false), tensor_cores,
                                                report(2, true, false), report(3, true, true),
                                                report(5, true, true, false)};
  const std::vector<ConvAlgoReport> heuristic = {report(3, true, true), report(6, true, false)};
  const std::vector<ConvAlgoChoice> ranked =
      rank_conv_algorithms(searched, heuristic, false, ConvMath::kTensorOps);
  EXPECT_EQ(algorithms(ranked), (std::vector<int>{9, 3, 1, 2, 6}));
  for (const ConvAlgoChoice& choice : ranked) EXPECT_EQ(choice.math, ConvMath::kTensorOps);
  EXPECT_EQ(ranked[0].text(), "algorithm 9 (tensor-op math, deterministic, workspace 90 bytes)");
  EXPECT_EQ(algorithms(rank_conv_algorithms(searched, heuristic, true, ConvMath::kTensorOps)),
            (std::vector<int>{9, 3}));
  // The fp32 ranking of the same reports still drops the tensor-core entry.
  EXPECT_EQ(algorithms(rank_conv_algorithms(searched, heuristic, false)),
            (std::vector<int>{3, 2, 1, 6}));
}

ConvAlgoCandidates candidates_of(std::vector<int> ranked) {
  ConvAlgoCandidates candidates;
  for (int algorithm : ranked) {
    ConvAlgoChoice choice;
    choice.algorithm = algorithm;
    candidates.ranked.push_back(choice);
  }
  return candidates;
}

// A refused algorithm gives way to the next, the one that ran is kept (later calls start there)
// and logged once, naming what was refused.
TEST(ConvAlgoFallback, MovesPastRefusalsKeepsAndLogsTheOneThatRan) {
  ConvAlgoCandidates candidates = candidates_of({6, 1, 0});
  std::vector<int> attempts;
  std::vector<std::string> log;
  auto attempt = [&](const ConvAlgoChoice& choice) {
    attempts.push_back(choice.algorithm);
    return choice.algorithm == 6 ? ConvAttempt::kNotSupported : ConvAttempt::kRan;
  };
  auto say = [&](const std::string& line) { log.push_back(line); };
  const ConvAlgoKey key = resnet_key();
  EXPECT_EQ(run_first_supported(candidates, key, attempt, say).algorithm, 1);
  EXPECT_EQ(run_first_supported(candidates, key, attempt, say).algorithm, 1);
  EXPECT_EQ(attempts, (std::vector<int>{6, 1, 1}));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], key.text() +
                        ": algorithm 1 (FMA math, deterministic, workspace 0 bytes), after cuDNN "
                        "refused algorithm 6");
  EXPECT_EQ(candidates.current, 1u);
}

TEST(ConvAlgoFallback, NoCandidateRunsIsAnErrorNamingTheKeyAndTheRefused) {
  ConvAlgoCandidates candidates = candidates_of({6, 1});
  auto refuse = [](const ConvAlgoChoice&) { return ConvAttempt::kNotSupported; };
  try {
    run_first_supported(candidates, resnet_key(), refuse, [](const std::string&) {});
    FAIL() << "no error";
  } catch (const Error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(resnet_key().text()), std::string::npos) << what;
    EXPECT_NE(what.find("refused: 6, 1"), std::string::npos) << what;
  }
  ConvAlgoCandidates none;
  EXPECT_THROW(run_first_supported(none, resnet_key(), refuse, [](const std::string&) {}), Error);
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

// OIHW weights [2][3][2*2] to KRSC and back, each element placed as the nested loops say.
TEST(ChannelsLast, MovesEachElementWhereTheLoopsSay) {
  const int64_t outer = 2, channels = 3, inner = 4;
  std::vector<int64_t> to_last(outer * channels * inner), to_first(to_last.size());
  for (int64_t j = 0; j < static_cast<int64_t>(to_last.size()); ++j) {
    to_last[j] = channels_last_source(j, channels, inner);
    to_first[j] = channels_first_source(j, channels, inner);
  }
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t first = (o * channels + c) * inner + i;  // [o][c][i]
        const int64_t last = (o * inner + i) * channels + c;   // [o][i][c]
        EXPECT_EQ(to_last[last], first) << o << " " << c << " " << i;
        EXPECT_EQ(to_first[first], last) << o << " " << c << " " << i;
      }
  // One channel: both layouts are the same bytes, and the moves copy.
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(channels_last_source(j, 1, 8), j);
    EXPECT_EQ(channels_first_source(j, 1, 8), j);
  }
}

}  // namespace
}  // namespace ft
