// `fusiontrain export`: a checkpoint's inference weights (BatchNorm folded into the convolutions
// of a ResNet) as one self-contained safetensors file; see app/inference_model.h.
#include <cstdio>

#include "app/inference_model.h"
#include "app/jobs.h"
#include "app/trainer.h"
#include "core/check.h"

namespace ft {

int run_export(const ExportArgs& args) {
  FT_REQUIRE(!args.checkpoint_path.empty(), "export needs --checkpoint FILE");
  FT_REQUIRE(!args.out_path.empty(), "export needs --out FILE.safetensors");
  const Config config = args.config_path.empty()
                            ? checkpoint_config(args.checkpoint_path, args.overrides)
                            : load_config(args.config_path, args.overrides);
  std::string summary;
  export_model(args.checkpoint_path, config, args.out_path, &summary);
  std::printf("export: wrote %s from %s (%s, %s)\n", args.out_path.c_str(),
              args.checkpoint_path.c_str(), config.model.arch.c_str(), summary.c_str());
  return 0;
}

}  // namespace ft
