// fusion.horizontal.conv_shortcut: a 3x3 convolution (padding 1) and a 1x1 convolution
// (padding 0) of the same input, stride and output channels, as a ResNet downsampling block's
// conv1 and downsample.0, become one ConvShortcutOp with twice the output channels and the 1x1
// kernel zero-padded into the centre tap. The padding overhead, extra FLOPs over useful FLOPs,
// is (9 - 1) 1x1-FLOPs / (3x3-FLOPs + 1x1-FLOPs) = 8 / 10 = 0.8 for equal shapes; the pair is
// fused only when that is at most fusion.horizontal.max_padding_overhead (default 0.25, so by
// default every pair is skipped with the figure). The unfused twin is the two Conv2dOps;
// tests/fusion_resnet_test.cpp checks the two agree.
// A candidate is a 3x3 convolution with a 1x1 convolution reading the same value.
// Order: after fold_bn (PassInfo::after): in eval graphs folding takes each convolution with its
// BatchNorm first.
// Thread safety: stateless.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "fusion/ops/conv_shortcut.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/conv2d.h"

namespace ft {
namespace {

const char* const kPass = conv_shortcut_info().name;
constexpr int kPairOps = 2;

bool is_conv(const Op& op, int kernel) {
  return op.op_kind() == OpKind::kConv2d && static_cast<const Conv2dOp&>(op).kernel() == kernel;
}

double forward_flops(const Conv2dOp& conv) {
  return 2.0 * conv.batch() * conv.out_height() * conv.out_width() * conv.out_channels() *
         conv.in_channels() * conv.kernel() * conv.kernel();
}

// Why the two convolutions cannot share one padded kernel; empty when they can.
std::string geometry_refusal(const Conv2dOp& wide, const Conv2dOp& narrow) {
  if (wide.padding() != 1 || narrow.padding() != 0)
    return "paddings " + std::to_string(wide.padding()) + " and " +
           std::to_string(narrow.padding()) + ", need 1 (3x3) and 0 (1x1)";
  if (wide.stride() != narrow.stride())
    return "strides " + std::to_string(wide.stride()) + " and " + std::to_string(narrow.stride()) +
           " differ";
  if (wide.out_channels() != narrow.out_channels())
    return "output channels " + std::to_string(wide.out_channels()) + " and " +
           std::to_string(narrow.out_channels()) + " differ";
  if (wide.input_layout != ActivationLayout::kNhwc ||
      narrow.input_layout != ActivationLayout::kNhwc)
    return "input is not channels-last";
  if (wide.needs_input_grad != narrow.needs_input_grad)
    return "only one of the two needs the input gradient";
  return "";
}

// The 1x1 convolution reading the 3x3's input, or -1.
int shortcut_of(const Graph& graph, const GraphIndex& index, int wide_index) {
  for (int reader : index.consumers(graph.ops[wide_index]->inputs[0]))
    if (reader != wide_index && is_conv(*graph.ops[reader], 1)) return reader;
  return -1;
}

class ConvShortcutPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return conv_shortcut_info(); }

 protected:
  bool is_candidate(const Op& op) const override { return is_conv(op, 3); }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const int shortcut_index = shortcut_of(graph, index, op_index);
    if (shortcut_index < 0) return std::nullopt;
    const auto& wide = static_cast<const Conv2dOp&>(*graph.ops[op_index]);
    const auto& narrow = static_cast<const Conv2dOp&>(*graph.ops[shortcut_index]);
    const std::string site = wide.name;
    const std::string refusal = geometry_refusal(wide, narrow);
    if (!refusal.empty()) {
      context.skipped(kPass, site, "with '" + narrow.name + "': " + refusal);
      return std::nullopt;
    }
    if (!within_max_ops(context, kPass, site, kPairOps)) return std::nullopt;
    // The 1x1 run as a 3x3 does kernel^2 - 1 = 8 zero multiplies per useful one.
    const double useful = forward_flops(wide) + forward_flops(narrow);
    const double overhead = (9.0 - 1.0) * forward_flops(narrow) / useful;
    const double allowed = context.options.horizontal.max_padding_overhead;
    char figures[64];
    std::snprintf(figures, sizeof figures, "%.2f %s %.2f", overhead,
                  overhead > allowed ? ">" : "<=", allowed);
    if (overhead > allowed) {
      context.skipped(kPass, site, std::string("padding overhead ") + figures);
      return std::nullopt;
    }
    auto replacement =
        std::make_unique<ConvShortcutOp>(wide.batch(), wide.in_channels(), wide.out_channels(),
                                         wide.height(), wide.width(), wide.stride());
    replacement->needs_input_grad = wide.needs_input_grad;
    replacement->algorithm = wide.algorithm;
    replacement->winograd_tile = wide.winograd_tile;
    Fusion fusion;
    fusion.absorbed = {op_index, shortcut_index};
    fusion.op = std::move(replacement);
    // At the earlier of the two: both read the same input, and readers of either output come
    // after it.
    fusion.placement = Placement::kFirst;
    fusion.name = site + "_shortcut";
    fusion.inputs = wide.inputs;
    fusion.outputs = {wide.outputs[0], narrow.outputs[0]};
    fusion.params = {wide.params[0], narrow.params[0]};
    fusion.site = site;
    fusion.what =
        "conv3x3+conv1x1 '" + narrow.name + "' -> conv_shortcut (padding overhead " + figures + ")";
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_conv_shortcut_pass() {
  return std::make_unique<ConvShortcutPass>();
}

}  // namespace ft
