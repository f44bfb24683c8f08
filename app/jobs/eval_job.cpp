// `fusiontrain eval`: loads a checkpoint and reports loss and bits per byte (GPT, over the
// validation split or a given text file) or test accuracy and loss (ResNet).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/jobs/jobs.h"
#include "app/training/checkpoint_model.h"
#include "app/training/device_setup.h"
#include "app/training/trainer.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace ft {

int run_eval(const EvalArgs& args) {
  FT_REQUIRE(!args.checkpoint_path.empty(), "eval needs --checkpoint FILE");
  const SafetensorsFile checkpoint = load_checkpoint_file(args.checkpoint_path);
  const Config config =
      config_for_checkpoint(checkpoint, args.checkpoint_path, args.config_path, args.overrides);
  omp_set_num_threads(resolve_threads(config.train.threads));
  std::unique_ptr<Task> task = make_task(config, 0, 1);
  const Device device = setup_device(config, 0);
  ParamStore params;
  task->register_params(params);
  require_checkpoint_tensors(checkpoint, args.checkpoint_path, params);  // before allocating
  params.allocate(device);
  load_checkpoint_params(checkpoint, args.checkpoint_path, params);
  GraphCache graphs([&task](int batch, GraphMode mode) { return task->build_graph(batch, mode); },
                    params, config.fusion);
  const EvalResult result = args.data_path.empty()
                                ? task->evaluate(graphs, config.train.batch_size, 0)
                                : evaluate_text_file(config, graphs, args.data_path);
  const std::string source =
      args.data_path.empty()
          ? (config.model.arch == "gpt" ? "validation split of " + config.data.path
                                        : "Fashion-MNIST test set")
          : args.data_path;
  nlohmann::json row = {{"type", "eval"},      {"checkpoint", args.checkpoint_path},
                        {"data", source},      {"precision", config.train.precision},
                        {"loss", result.loss}, {"examples", result.examples}};
  // As train's start line: a bf16 evaluation says so, and whether this CPU has the instructions
  // (the same checkpoint's fp32 loss differs in the third or fourth digit).
  const std::string precision =
      config.train.precision == "bf16" ? " | precision bf16, " + bf16_kernels_text(device) : "";
  if (result.accuracy >= 0) {
    row["accuracy"] = result.accuracy;
    std::printf("eval %s on %s: loss %.4f | accuracy %.2f%% (%lld images)%s\n",
                args.checkpoint_path.c_str(), source.c_str(), result.loss, 100 * result.accuracy,
                static_cast<long long>(result.examples), precision.c_str());
  } else {
    row["bits_per_byte"] = result.bits_per_byte;
    std::printf("eval %s on %s: loss %.4f | %.4f bits/byte (%lld windows)%s\n",
                args.checkpoint_path.c_str(), source.c_str(), result.loss, result.bits_per_byte,
                static_cast<long long>(result.examples), precision.c_str());
  }
  if (!args.json_path.empty()) {
    write_output_file(args.json_path, row.dump() + "\n");
  }
  // Finite weights can still overflow (a run caught diverging one step too late): that model is
  // not usable, which a script must see in the exit status, not only in a printed "nan".
  FT_REQUIRE(std::isfinite(result.loss), "eval: the loss of ", args.checkpoint_path, " on ", source,
             " is ", result.loss,
             ": its weights are finite but the model overflows (a checkpoint of a diverging run?);"
             " evaluate an earlier checkpoint");
  return 0;
}

}  // namespace ft
