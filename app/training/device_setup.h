// train.device for this process: cpu, or cuda once a GPU is known to be usable. Called at the
// start of every job that computes (train, bench, tune, eval), so `train.device: cuda` on a
// machine without a GPU, or with a build without the CUDA path, stops with one clear sentence
// before any data is read.
// Thread safety: call from the main thread, before any tensor is made on the device.
#pragma once
#include <string>

#include "app/config/config.h"
#include "core/device.h"

namespace ft {

// cpu: nothing to do. cuda: throws a user error (no source path) when no device can be used;
// otherwise selects this rank's GPU (local_rank modulo the devices) and applies train.tf32.
Device setup_device(const Config& config, int local_rank);
// The same for a job without a config: `device` is "cpu" or "cuda" as `setting` names it
// ("infer --device"); `instead` is what the error suggests ("--device cpu"). Throws a user error
// for any other name.
Device setup_device(const std::string& device, const std::string& setting,
                    const std::string& instead, int local_rank);

// What runs bf16 GEMMs and convolutions on `device`, for the lines that say a job runs in bf16
// (train's start line, eval's result, infer's): the GPU's cuDNN and cuBLASLt kernels, or
// core/gemm.h's bf16_gemm_path() on the CPU (oneDNN's bf16 kernels, or the widening notice on a
// CPU without bf16 instructions).
std::string bf16_kernels_text(Device device);

}  // namespace ft
