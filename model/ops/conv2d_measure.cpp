// model.conv_algorithm: measure. Where Winograd applies, Conv2dOp holds two candidates: what
// kOneDnn runs (in bf16, oneDNN's bf16 direct kernel) and our Winograd (in bf16, on the widened
// operands). Which is faster depends on the CPU, the shape and the pass: on a Zen 4 in bf16 the
// direct kernel wins at 28x28 and 14x14 while Winograd's backward wins at 7x7 with 64 channels
// (docs/mixed_precision.md). So each pass times both on its first call, on the op's real
// operands, and keeps the faster, as cuDNN's algorithm search does on a GPU.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/check.h"
#include "model/ops/conv2d.h"
#include "model/ops/conv2d_primitives.h"

namespace ft {
namespace {

// Round 0 warms each candidate's caches and weight transforms; the best of the rest counts.
constexpr int kRounds = 4;

// Runs run(c) for the two candidates in interleaved rounds; returns each one's fastest ms.
template <typename Run>
std::array<double, 2> best_times(Run run) {
  std::array<double, 2> best = {std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::infinity()};
  for (int round = 0; round < kRounds; ++round)
    for (int candidate = 0; candidate < 2; ++candidate) {
      const auto start = std::chrono::steady_clock::now();
      run(candidate);
      const std::chrono::duration<double, std::milli> took =
          std::chrono::steady_clock::now() - start;
      if (round > 0) best[candidate] = std::min(best[candidate], took.count());
    }
  return best;
}

// Times the two candidates with run(candidate), appends "<pass> <faster> <ms> <= <other> <ms>" to
// `record` and returns the faster.
template <typename Candidate, typename Run>
Candidate& faster_of(Candidate* first, Candidate* second, const char* pass, std::string* record,
                     Run run) {
  Candidate* candidates[2] = {first, second};
  const std::array<double, 2> ms = best_times([&](int c) { run(*candidates[c]); });
  const int chosen = ms[1] < ms[0] ? 1 : 0;
  char times[256];
  std::snprintf(times, sizeof(times), "%s%s %s %.3f ms <= %s %.3f ms", record->empty() ? "" : "; ",
                pass, candidates[chosen]->forward_impl.c_str(), ms[chosen],
                candidates[1 - chosen]->forward_impl.c_str(), ms[1 - chosen]);
  *record += times;
  return *candidates[chosen];
}

}  // namespace

Conv2dOp::Primitives& Conv2dOp::measure_forward(float* y, const Tensor& x, const Param& weight,
                                                uint64_t version) {
  return faster_of(primitives_.get(), alternative_.get(), "forward", &measured_choice_,
                   [&](Primitives& candidate) {
                     // A training step re-derives the forward weights (the parameters moved), so
                     // each run does.
                     candidate.forward_weights_valid = false;
                     forward_with(candidate, y, x, weight, version);
                   });
}

Conv2dOp::Primitives& Conv2dOp::measure_backward(bool with_dx, const Param& weight, const float* dy,
                                                 const Tensor& x) {
  // The trials write into scratch, so the real gradients get exactly one contribution.
  std::vector<float> dx_trial(with_dx ? shape_numel(input_shape()) : 0);
  std::vector<float> dweight_trial(shape_numel(weight_shape()));
  return faster_of(primitives_.get(), alternative_.get(), "backward", &measured_choice_,
                   [&](Primitives& candidate) {
                     backward_with(candidate, with_dx ? dx_trial.data() : nullptr, true,
                                   dweight_trial.data(), weight, dy, x);
                   });
}

}  // namespace ft
