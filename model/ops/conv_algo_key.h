// ConvAlgoKey: what decides which cuDNN algorithm runs one pass of a convolution (the shape of
// x, y and the filter, stride, padding, dilation, the input's layout and which of the three
// passes), so the choice is made once per key and shared by every convolution of that shape
// (model/ops/conv2d.cu). ConvAlgoCache maps keys to choices. Neither needs a cuDNN header, so
// tests/conv_algo_key_test.cpp checks them on any machine.
// Thread safety: ConvAlgoKey is a value; ConvAlgoCache belongs to the training thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>

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
// dilation. nchw_input: x is stored NCHW (the stem reading images), else NHWC like y.
struct ConvAlgoKey {
  int n = 0, c = 0, h = 0, w = 0;
  int k = 0, r = 0, s = 0;
  int stride = 1, pad = 0, dilation = 1;
  bool nchw_input = false;
  ConvPass pass = ConvPass::kForward;

  auto fields() const {
    return std::make_tuple(n, c, h, w, k, r, s, stride, pad, dilation, nchw_input,
                           static_cast<int>(pass));
  }
  bool operator==(const ConvAlgoKey& other) const { return fields() == other.fields(); }
  bool operator!=(const ConvAlgoKey& other) const { return !(*this == other); }
  bool operator<(const ConvAlgoKey& other) const { return fields() < other.fields(); }

  // For logs and error messages, e.g. "forward x[64,16,32,32] nhwc w[32,16,3,3] stride 2 pad 1
  // dilation 1".
  std::string text() const {
    return std::string(conv_pass_name(pass)) + " x[" + std::to_string(n) + "," + std::to_string(c) +
           "," + std::to_string(h) + "," + std::to_string(w) + "] " +
           (nchw_input ? "nchw" : "nhwc") + " w[" + std::to_string(k) + "," + std::to_string(c) +
           "," + std::to_string(r) + "," + std::to_string(s) + "] stride " +
           std::to_string(stride) + " pad " + std::to_string(pad) + " dilation " +
           std::to_string(dilation);
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
                          key.nchw_input ? 1 : 0,
                          static_cast<int>(key.pass)};
    for (int value : values)
      seed ^= std::hash<int>()(value) + 0x9e3779b9u + (seed << 6) + (seed >> 2);
    return seed;
  }
};

// The algorithm picked for a key: cuDNN's enum value of that pass's algorithm type, and the
// workspace it needs.
struct ConvAlgoChoice {
  int algorithm = 0;
  size_t workspace_bytes = 0;
};

// Choices by key; `choose` runs only for a key not seen before.
class ConvAlgoCache {
 public:
  template <typename Choose>
  const ConvAlgoChoice& get(const ConvAlgoKey& key, Choose&& choose) {
    auto found = choices_.find(key);
    if (found == choices_.end()) found = choices_.emplace(key, choose(key)).first;
    return found->second;
  }
  size_t size() const { return choices_.size(); }

 private:
  std::map<ConvAlgoKey, ConvAlgoChoice> choices_;
};

}  // namespace ft
