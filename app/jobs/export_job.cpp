// `fusiontrain export`: a checkpoint's inference weights (BatchNorm folded into the convolutions
// of a ResNet) as one self-contained safetensors file, stored as fp32 or (--dtype bf16) rounded to
// bf16; see app/inference/inference_model.h.
#include <cstdio>

#include "app/cli/flag_checks.h"
#include "app/inference/inference_model.h"
#include "app/jobs/jobs.h"
#include "app/training/checkpoint_model.h"
#include "app/training/trainer.h"
#include "core/check.h"

namespace ft {
namespace {

// Where the config export uses got inference.fold_bn = false, for the refusal.
std::string fold_bn_source(const ExportArgs& args) {
  const std::string key = "inference.fold_bn=";
  for (auto it = args.overrides.rbegin(); it != args.overrides.rend(); ++it)
    if (it->compare(0, key.size(), key) == 0) return "--set '" + *it + "'";
  if (!args.config_path.empty()) return "--config " + args.config_path;
  return "the config embedded in " + args.checkpoint_path + " (the run was trained with it)";
}

}  // namespace

int run_export(const ExportArgs& args) {
  FT_REQUIRE(!args.checkpoint_path.empty(), "export needs --checkpoint FILE");
  FT_REQUIRE(!args.out_path.empty(), "export needs --out FILE.safetensors");
  const DType dtype = dtype_flag("--dtype", args.dtype);
  // The atomic write would succeed and leave inference weights where the training state was.
  FT_USAGE_REQUIRE(
      !same_file(args.checkpoint_path, args.out_path), "--out '", args.out_path,
      "' is the --checkpoint file; writing the export there would replace the checkpoint, ",
      "so choose another --out");
  const SafetensorsFile checkpoint = load_checkpoint_file(args.checkpoint_path);
  const Config config =
      config_for_checkpoint(checkpoint, args.checkpoint_path, args.config_path, args.overrides);
  // An export is the folded model by definition: it holds no BatchNorm tensors and infer rebuilds
  // the folded graph, so inference.fold_bn false could only be ignored here.
  FT_REQUIRE(
      config.fusion.fold_bn, "export: inference.fold_bn = false (", fold_bn_source(args),
      "), but an export always folds BatchNorm into the convolutions; pass --set "
      "inference.fold_bn=true (or drop the false) to export, and run the unfolded model with "
      "eval --set inference.fold_bn=false or infer --compare-unfolded");
  std::string summary;
  export_model(args.checkpoint_path, config, args.out_path, &summary, dtype);
  std::printf("export: wrote %s from %s (%s, %s)\n", args.out_path.c_str(),
              args.checkpoint_path.c_str(), config.model.arch.c_str(), summary.c_str());
  return 0;
}

}  // namespace ft
