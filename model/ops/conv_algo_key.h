// ConvAlgoKey: what decides which cuDNN algorithm runs one pass of a convolution (the shape of
// x, y and the filter, stride, padding, dilation, the input's layout and which of the three
// passes), so the choice is made once per key and shared by every convolution of that shape
// (model/ops/conv2d.cu). ConvAlgoCache maps keys to their ranked candidates, and
// run_first_supported moves down them when cuDNN refuses one at execution. None of it needs a
// cuDNN header, so tests/conv_algo_key_test.cpp checks it on any machine.
// Thread safety: ConvAlgoKey is a value; ConvAlgoCache belongs to the training thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/check.h"

namespace ft {

enum class ConvPass { kForward, kBackwardData, kBackwardFilter };

inline const char* conv_pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward:
      return "forward";
    case ConvPass::kBackwardData:
      return "backward_data";
    case ConvPass::kBackwardFilter:
      return "backward_filter";
  }
  return "unknown";
}

// Sizes in cuDNN's names: x [N, C, H, W], filter [K, C, R, S], square stride, padding and
// dilation. No layout: cuDNN sees every operand channels last (model/ops/conv2d_layout.h), an
// NCHW stem input as its NHWC copy. bf16: x, the filter and y (dx, dw) are bf16 with fp32 compute
// (cuDNN's PSEUDO_BFLOAT16_CONFIG), else all fp32; the two search separately, as cuDNN's
// algorithms differ by data type.
struct ConvAlgoKey {
  int n = 0, c = 0, h = 0, w = 0;
  int k = 0, r = 0, s = 0;
  int stride = 1, pad = 0, dilation = 1;
  bool bf16 = false;
  ConvPass pass = ConvPass::kForward;

  auto fields() const {
    return std::make_tuple(n, c, h, w, k, r, s, stride, pad, dilation, bf16,
                           static_cast<int>(pass));
  }
  bool operator==(const ConvAlgoKey& other) const { return fields() == other.fields(); }
  bool operator!=(const ConvAlgoKey& other) const { return !(*this == other); }
  bool operator<(const ConvAlgoKey& other) const { return fields() < other.fields(); }

  // For logs and error messages, e.g. "forward x[64,16,32,32] nhwc w[32,16,3,3] stride 2 pad 1
  // dilation 1", with " bf16" appended for bf16 operands.
  std::string text() const {
    return std::string(conv_pass_name(pass)) + " x[" + std::to_string(n) + "," + std::to_string(c) +
           "," + std::to_string(h) + "," + std::to_string(w) + "] nhwc w[" + std::to_string(k) +
           "," + std::to_string(c) + "," + std::to_string(r) + "," + std::to_string(s) +
           "] stride " + std::to_string(stride) + " pad " + std::to_string(pad) + " dilation " +
           std::to_string(dilation) + (bf16 ? " bf16" : "");
  }
};

// Mixes every field (boost's hash_combine), for unordered containers and log lines.
struct ConvAlgoKeyHash {
  size_t operator()(const ConvAlgoKey& key) const {
    size_t seed = 0;
    const int values[] = {key.n,
                          key.c,
                          key.h,
                          key.w,
                          key.k,
                          key.r,
                          key.s,
                          key.stride,
                          key.pad,
                          key.dilation,
                          key.bf16 ? 1 : 0,
                          static_cast<int>(key.pass)};
    for (int value : values)
      seed ^= std::hash<int>()(value) + 0x9e3779b9u + (seed << 6) + (seed >> 2);
    return seed;
  }
};

// The math a key's algorithms run under. kFma (fp32 operands): CUDNN_FMA_MATH, fp32 FMA kernels
// only, since tensor-core math would round fp32 inputs to TF32. kTensorOps (bf16 operands):
// CUDNN_TENSOR_OP_MATH, tensor cores allowed: a product of two bf16 values is exact in fp32 and
// they accumulate in fp32, so tensor cores round nothing the operands had not.
enum class ConvMath { kFma, kTensorOps };

// One algorithm for a key: cuDNN's enum value of that pass's algorithm type, the workspace it
// needs, and how cuDNN reported it (the log line says it; pinned runs need deterministic ones).
struct ConvAlgoChoice {
  int algorithm = 0;
  size_t workspace_bytes = 0;
  bool fma_math = true;  // reported under CUDNN_FMA_MATH; false: DEFAULT (run under FMA_MATH)
  bool deterministic = true;
  ConvMath math = ConvMath::kFma;  // what it runs under (kTensorOps: whatever it was reported as)

  // e.g. "algorithm 1 (FMA math, deterministic, workspace 6400 bytes)".
  std::string text() const {
    const char* math_text = math == ConvMath::kTensorOps ? "tensor-op math"
                            : fma_math                   ? "FMA math"
                                                         : "reported as default math, run as FMA";
    return "algorithm " + std::to_string(algorithm) + " (" + math_text + ", " +
           (deterministic ? "deterministic" : "not deterministic") + ", workspace " +
           std::to_string(workspace_bytes) + " bytes)";
  }
};

// What cuDNN's search (Find, timed) or heuristic (Get_v7) said of one algorithm, in its order
// (fastest or most promising first).
struct ConvAlgoReport {
  int algorithm = 0;
  bool usable = false;        // status SUCCESS
  bool fma_math = false;      // mathType CUDNN_FMA_MATH
  bool default_math = false;  // mathType CUDNN_DEFAULT_MATH; anything else means tensor cores
  bool deterministic = false;
  size_t workspace_bytes = 0;
};

// The candidates for a key, best first: the search's usable fp32 algorithms (no tensor-core
// math, which would round inputs to TF32), deterministic before not, FMA before default math,
// then the heuristic's that the search did not list, ranked the same way, each algorithm once.
// deterministic_only drops the rest (set_deterministic_algorithms, core/determinism.h).
// math kTensorOps (bf16 operands) takes every usable algorithm whatever its math, in the
// search's order within deterministic and not.
inline std::vector<ConvAlgoChoice> rank_conv_algorithms(
    const std::vector<ConvAlgoReport>& searched, const std::vector<ConvAlgoReport>& heuristic,
    bool deterministic_only, ConvMath math = ConvMath::kFma) {
  std::vector<ConvAlgoChoice> ranked;
  auto listed = [&ranked](int algorithm) {
    for (const ConvAlgoChoice& choice : ranked)
      if (choice.algorithm == algorithm) return true;
    return false;
  };
  for (const std::vector<ConvAlgoReport>* reports : {&searched, &heuristic}) {
    for (int rank = 0; rank < 4; ++rank) {
      const bool want_deterministic = rank < 2, want_fma = rank % 2 == 0;
      if (deterministic_only && !want_deterministic) break;
      const bool any_math = math == ConvMath::kTensorOps;
      if (any_math && !want_fma) continue;  // one pass per determinism takes every math
      for (const ConvAlgoReport& report : *reports) {
        if (!report.usable) continue;
        if (!any_math && (want_fma ? !report.fma_math : !report.default_math)) continue;
        if (report.deterministic != want_deterministic || listed(report.algorithm)) continue;
        ranked.push_back(ConvAlgoChoice{report.algorithm, report.workspace_bytes, report.fma_math,
                                        report.deterministic, math});
      }
    }
  }
  return ranked;
}

// The ranked candidates of one key and the one in use. cuDNN may refuse at execution an
// algorithm its search offered (one timed under default math that exists only as a TF32 engine
// under FMA math, say); the next one is then tried, and the one that ran is kept for the key.
struct ConvAlgoCandidates {
  std::vector<ConvAlgoChoice> ranked;
  size_t current = 0;        // index into ranked of the algorithm to run
  bool confirmed = false;    // ranked[current] has run (and was logged)
  std::vector<int> refused;  // algorithms refused at execution, in order
};

enum class ConvAttempt { kRan, kNotSupported };

// Runs attempt(choice) with the key's current candidate, moving down the list while cuDNN refuses
// it (kNotSupported: a refusal launches nothing, so even an accumulating pass is untouched), and
// calls log(line) once, when a candidate first runs. Other failures are attempt's to throw.
// Throws ft::Error naming the key and every refused algorithm when none runs.
template <typename Attempt, typename Log>
const ConvAlgoChoice& run_first_supported(ConvAlgoCandidates& candidates, const ConvAlgoKey& key,
                                          Attempt&& attempt, Log&& log) {
  while (candidates.current < candidates.ranked.size()) {
    const ConvAlgoChoice& choice = candidates.ranked[candidates.current];
    if (attempt(choice) == ConvAttempt::kRan) {
      if (!candidates.confirmed) {
        candidates.confirmed = true;
        std::string line = key.text() + ": " + choice.text();
        if (!candidates.refused.empty()) {
          line += ", after cuDNN refused algorithm";
          for (int refused : candidates.refused) line += " " + std::to_string(refused);
        }
        log(line);
      }
      return choice;
    }
    candidates.refused.push_back(choice.algorithm);
    candidates.confirmed = false;
    ++candidates.current;
  }
  std::string tried;
  for (int refused : candidates.refused)
    tried += (tried.empty() ? "" : ", ") + std::to_string(refused);
  FT_FAIL("conv2d: cuDNN refused every ", key.bf16 ? "bf16" : "fp32", " algorithm for ", key.text(),
          tried.empty() ? std::string(" (none was offered)") : " (refused: " + tried + ")");
}

// Candidates by key; `rank` runs only for a key not seen before. Entries never move, so a
// convolution may keep a pointer to its key's entry.
class ConvAlgoCache {
 public:
  template <typename Rank>
  ConvAlgoCandidates& get(const ConvAlgoKey& key, Rank&& rank) {
    auto found = entries_.find(key);
    if (found == entries_.end()) {
      ConvAlgoCandidates entry;
      entry.ranked = rank(key);
      found = entries_.emplace(key, std::move(entry)).first;
    }
    return found->second;
  }
  size_t size() const { return entries_.size(); }

 private:
  std::map<ConvAlgoKey, ConvAlgoCandidates> entries_;
};

}  // namespace ft
