// The metadata 'format' tags of the safetensors files fusiontrain writes, which tell a checkpoint
// (fp32 masters and optimizer state, app/training/checkpoint.h) from an export (inference weights,
// app/inference/inference_model.h) before any tensor is read.
#pragma once

namespace ft {

inline constexpr const char* kCheckpointFormat = "fusiontrain-checkpoint-1";
inline constexpr const char* kExportFormat = "fusiontrain-export-1";

}  // namespace ft
