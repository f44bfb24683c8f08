// The exported inference model shared by `fusiontrain export` and `fusiontrain infer`: one
// safetensors file that needs no config and no checkpoint.
// ResNet exports hold, for every convolution, the weight and bias with its BatchNorm folded in
// (`layer1.0.conv1.weight`, `layer1.0.conv1.bias`; `downsample.0` for a shortcut's 1x1), and
// `fc.weight` / `fc.bias`; no `bn` entries. GPT exports hold the trained parameters. Neither holds
// optimizer state. Metadata (all strings, as safetensors requires):
//   format          "fusiontrain-export-1"
//   arch            "resnet" | "gpt"
//   model           JSON of the architecture (resnet: blocks, width, image_size, in_channels,
//                   classes, bn_eps, conv_algorithm)
//   plan            JSON array, one object per folded convolution: conv, residual, relu, eps
//   image_mean, image_std   the input normalisation (resnet)
//   config          the training config as YAML
//   source_checkpoint, source_sha256   what was exported
//   bn_eps          the BatchNorm eps folded in
//   dtype           "fp32" | "bf16": how every tensor is stored (export --dtype); bf16 tensors are
//                   the fp32 values (masters, or folded weights) rounded to nearest, ties to even.
//                   Absent in exports from before --dtype existed, which are fp32.
// The folded graph is rebuilt the same way on both sides: the eval graph, then the fold pass
// with inference_fusion_options(); `infer` checks the rebuilt plan against the file's.
// Thread safety: an ExportedResnet is used by one thread.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "app/config/config.h"
#include "app/training/file_formats.h"
#include "core/image_data.h"
#include "core/safetensors.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/resnet.h"

namespace ft {

// The pipeline settings of every inference graph: defaults, BN folding on.
FusionOptions inference_fusion_options();

// The ResNet eval graph for `batch` after the inference pipeline, over `params` (registered by
// register_resnet_params), its convolutions and fc reading bf16 operands when gemm_dtype is kBF16
// (model/resnet.h). Throws ft::Error naming the BatchNorm and the reason when one could not be
// folded.
Graph build_folded_resnet_graph(const ResnetShape& shape, int batch, const ResnetParamIds& ids,
                                const ParamStore& params, FusionResult* fusion = nullptr,
                                DType gemm_dtype = DType::kF32);

// Writes the export of `checkpoint_path` (trained with `config`) to `out_path`, atomically, its
// tensors stored as `dtype`; `summary` gets one line on what was written. Throws ft::Error on a
// checkpoint without BatchNorm running statistics, or one that does not match config.
void export_model(const std::string& checkpoint_path, const Config& config,
                  const std::string& out_path, std::string* summary, DType dtype = DType::kF32);

// The dtype an export's tensors are stored in: its metadata 'dtype' (fp32 when absent), checked
// against every tensor's. Throws ft::Error naming `path` on another value or a tensor that
// disagrees. Readers get fp32 values either way (core/safetensors.h widens bf16 exactly).
DType export_dtype(const SafetensorsFile& file, const std::string& path);

// A ResNet export loaded for inference.
class ExportedResnet {
 public:
  // Throws ft::Error naming `path` when the file is unreadable, truncated, corrupt, not an export,
  // a GPT export, or its tensors do not match its own metadata. The tensors, and every run's
  // workspace, live on `device` (cuda: REQUIRES setup_device already chose the GPU). `precision`
  // kBF16 runs every graph's GEMMs on bf16 operands (cpu or cuda), whatever the file
  // stores: fp32 and bf16 exports both load as fp32 values.
  explicit ExportedResnet(const std::string& path, Device device = Device::kCpu,
                          DType precision = DType::kF32);
  ExportedResnet(const ExportedResnet&) = delete;
  ExportedResnet& operator=(const ExportedResnet&) = delete;

  const ResnetShape& shape() const { return shape_; }
  ChannelStats image_stats() const { return stats_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // How the file stores the tensors; they are fp32 in memory either way.
  DType stored_dtype() const { return stored_dtype_; }
  DType precision() const { return precision_; }

  struct Run {
    Graph graph;
    std::unique_ptr<Executor> executor;
    Workspace ws;
  };
  // The folded graph for `batch` over the exported tensors, built on first use.
  Run& run(int batch);

 private:
  std::string path_;
  ResnetShape shape_;
  ChannelStats stats_{0.0f, 1.0f};
  std::map<std::string, std::string> metadata_;
  DType stored_dtype_ = DType::kF32;
  DType precision_;
  ParamStore layout_;  // the training parameters' names and shapes, never filled: graph wiring
  ResnetParamIds layout_ids_;
  ParamStore tensors_;  // the exported tensors
  std::map<int, std::unique_ptr<Run>> runs_;
};

}  // namespace ft
