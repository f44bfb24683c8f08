// The CIFAR-style ResNet-(6n+2) for 28x28 grey images (He et al. 2016, section 4.2), with
// torchvision parameter names so checkpoints line up with a PyTorch reference:
//   stem   conv1 3x3 (in -> w) -> bn1 -> relu                               28x28
//   layer1 n BasicBlocks, width w, stride 1                                 28x28
//   layer2 n BasicBlocks, width 2w; block 0 has stride 2 and a 1x1 conv+BN shortcut   14x14
//   layer3 n BasicBlocks, width 4w; same                                      7x7
//   head   global average pool -> fc (4w -> classes) -> softmax cross-entropy on ws.targets
// BasicBlock: conv3x3 -> BN -> ReLU -> conv3x3 -> BN, + shortcut, -> ReLU.
// Every activation after the images is stored channels-last, [batch, height, width, channels]
// (see ActivationLayout in model/ops/conv2d.h); parameters keep PyTorch's layouts (conv weights
// [out, in, k, k]), so checkpoints are unaffected.
// Registration (parameter order) is separate from graph building, so one ParamStore can serve
// graphs of several batch sizes (training and evaluation).
// Thread safety: builders are pure functions of their arguments; the results belong to the caller.
#pragma once
#include <string>
#include <vector>

#include "model/graph.h"
#include "model/ops/conv2d.h"
#include "model/params.h"

namespace ft {

struct ResnetShape {
  int blocks_per_stage;  // n: depth is 6n + 2
  int width;             // w: channels of the first stage
  int image_size = 28;
  int in_channels = 1;
  int classes = 10;
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kAuto;  // for every convolution
  float bn_eps = 1e-5f;                                 // every BatchNorm's, as PyTorch's default
};

// model.conv_algorithm's values (auto, onednn, measure) and back; false for any other name.
const char* conv_algorithm_name(ConvAlgorithm algorithm);
bool conv_algorithm_from_name(const std::string& name, ConvAlgorithm* algorithm);

struct BatchNormParamIds {
  ParamId weight = -1, bias = -1;
  ParamId running_mean = -1, running_var = -1;  // buffers
};

struct BasicBlockParamIds {
  ParamId conv1 = -1;
  BatchNormParamIds bn1;
  ParamId conv2 = -1;
  BatchNormParamIds bn2;
  bool has_downsample = false;
  ParamId downsample_conv = -1;  // when has_downsample
  BatchNormParamIds downsample_bn;
};

struct ResnetParamIds {
  ParamId conv1 = -1;
  BatchNormParamIds bn1;
  std::vector<std::vector<BasicBlockParamIds>> layers;  // [stage][block], 3 stages
  ParamId fc_weight = -1, fc_bias = -1;
};

// REQUIRES: params not yet allocated. Throws ft::Error on a non-positive size or classes < 2.
ResnetParamIds register_resnet_params(const ResnetShape& shape, ParamStore& params);

// graph.input = images [batch, in_channels, image_size, image_size] (NCHW, as the data loader
// writes them; the caller fills it), graph.output = logits [batch, classes],
// graph.loss = mean cross-entropy [1]. Activations in between are [batch, h, w, channels].
// An eval graph normalises with the running statistics (BatchNormInferenceOp).
// gemm_dtype bf16 (train.precision: bf16) reads every convolution's and the fc's x through a cast
// op, one per value however many convolutions read it (a downsampling block's conv1 and
// downsample.0 share one), as CPU autocast launches them; BatchNorm, ReLU, the residual adds,
// the pooling and the loss stay fp32. REQUIRES for bf16: params.enable_bf16_copies().
Graph build_resnet_graph(const ResnetShape& shape, int batch, const ResnetParamIds& ids,
                         GraphMode mode = GraphMode::kTrain, DType gemm_dtype = DType::kF32);

// register_resnet_params + build_resnet_graph.
Graph build_resnet(const ResnetShape& shape, int batch, ParamStore& params,
                   GraphMode mode = GraphMode::kTrain, DType gemm_dtype = DType::kF32);

}  // namespace ft
