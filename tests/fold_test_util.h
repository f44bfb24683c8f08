// Shared by the BN-folding and export tests: real test images, BatchNorm statistics far from
// identity, and checkpoints written without training.
// Thread safety: test-only; one thread.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/image_data.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "model/params.h"

namespace ft::fold_test {

// The first `count` Fashion-MNIST test images, normalised as training does.
inline const ImageBatch& test_images(int count) {
  static ImageBatch batch;
  if (batch.batch != count) {
    const ImageDataset train = ImageDataset::load_fashion_mnist(kFashionMnistDir, true);
    const ImageDataset test = ImageDataset::load_fashion_mnist(kFashionMnistDir, false);
    image_eval_batch(test, fashion_mnist_train_stats(train), 0, count, &batch);
  }
  return batch;
}

// Gives every BatchNorm statistics far from identity: means N(0, 0.5), variances exp(U(-12, 2))
// with every seventh exactly 0, gammas N(1, 0.5), betas N(0, 0.3).
inline void randomize_batchnorms(ParamStore& params, uint64_t seed) {
  Rng rng(seed);
  const auto ends_with = [](const std::string& name, const std::string& suffix) {
    return name.size() > suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    const bool conv = param.shape.size() == 4;
    if (conv || param.name.rfind("fc.", 0) == 0) continue;
    float* values = param.value.data();
    for (int64_t i = 0; i < param.value.numel(); ++i) {
      if (ends_with(param.name, "running_mean")) values[i] = 0.5f * rng.normal();
      if (ends_with(param.name, "running_var"))
        values[i] = i % 7 == 3 ? 0.0f : std::exp(-12.0f + 14.0f * rng.uniform());
      if (ends_with(param.name, ".weight")) values[i] = 1.0f + 0.5f * rng.normal();
      if (ends_with(param.name, ".bias")) values[i] = 0.3f * rng.normal();
    }
  }
  params.mark_changed();
}

// Saves `params` as a fusiontrain checkpoint of `config` (no optimizer state: enough for eval,
// export and infer, which read parameters and the embedded config only). Without
// `with_buffers` the BatchNorm running statistics are left out, as in a broken checkpoint.
inline void write_checkpoint(const std::string& path, const Config& config,
                             const ParamStore& params, bool with_buffers = true) {
  std::vector<SafetensorsView> views;
  for (ParamId id = 0; id < params.size(); ++id)
    if (with_buffers || params[id].trainable)
      views.push_back({params[id].name, params[id].shape, params[id].value.data()});
  save_safetensors(path,
                   {{"format", "fusiontrain-checkpoint-1"},
                    {"step", "0"},
                    {"optimizer_steps", "0"},
                    {"arch", config.model.arch},
                    {"config", config_to_yaml(config)}},
                   views);
}

}  // namespace ft::fold_test
