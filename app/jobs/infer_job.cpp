// `fusiontrain infer`: runs an exported ResNet (app/inference/inference_model.h) over the
// Fashion-MNIST test set or an IDX file, reporting accuracy, loss, latency per batch and images/s.
// With
// --compare-unfolded CKPT the unfolded eval model of the checkpoint (every fusion off: conv, BN
// with running statistics, ReLU and residual add as separate ops) runs on the same batches,
// interleaved with the export, and the report adds the largest logit differences, prediction
// agreement and the speedup as the median of per-batch time ratios. An fp32 or bf16 export loads
// as fp32 values (bf16 widens exactly); --precision bf16 runs both models' GEMMs on bf16 operands.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "app/analysis/bench.h"
#include "app/cli/flag_checks.h"
#include "app/inference/inference_model.h"
#include "app/inference/inference_profile.h"
#include "app/jobs/jobs.h"
#include "app/training/device_setup.h"
#include "app/training/task.h"
#include "app/training/trainer.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/idx.h"
#include "core/sha256.h"
#include "core/timer.h"

namespace ft {
namespace {

ImageDataset load_images(const InferArgs& args, bool* has_labels, std::string* source) {
  if (args.data == "test") {
    *has_labels = true;
    *source = "Fashion-MNIST test set";
    return ImageDataset::load_fashion_mnist(kFashionMnistDir, false);
  }
  IdxArray images = read_idx(args.data);
  FT_REQUIRE(images.dims.size() == 3, args.data, ": --data needs an IDX file of images [N, H, W]; ",
             "it has ", images.dims.size(), " dimensions");
  *has_labels = !args.labels_path.empty();
  *source = args.data;
  IdxArray labels;
  if (*has_labels) {
    labels = read_idx(args.labels_path);
  } else {
    labels.dims = {images.dims[0]};
    labels.data.assign(images.dims[0], 0);
  }
  return ImageDataset::from_idx(std::move(images), std::move(labels), 28, 28, args.data);
}

// The export's metadata decides the input tensor's size, and its weights do not pin the image
// size (a global average pool ends the convolutions): images of another size would be copied
// past the input's end, or only in part.
void check_export_fits_data(const ResnetShape& shape, const ImageDataset& data, bool has_labels,
                            const std::string& model_path, const std::string& source) {
  FT_REQUIRE(shape.image_size == data.height() && shape.image_size == data.width(), model_path,
             ": the export's metadata says model.image_size ", shape.image_size, ", but ", source,
             " holds ", data.height(), "x", data.width(), " images");
  FT_REQUIRE(shape.in_channels == 1, model_path, ": the export's metadata says model.in_channels ",
             shape.in_channels, ", but ", source, " holds 1-channel (grey) images");
  int largest_label = 0;
  for (int i = 0; has_labels && i < data.size(); ++i)
    largest_label = std::max(largest_label, data.label(i));
  FT_REQUIRE(largest_label < shape.classes, model_path, ": the export classifies ", shape.classes,
             " classes (model.classes in its metadata), but ", source, " has label ",
             largest_label);
}

// The unfolded eval model of a checkpoint, for --compare-unfolded.
struct UnfoldedModel {
  Config config;
  ResnetShape shape{1, 1};
  ResnetParamIds ids;
  ParamStore params;
  std::unique_ptr<GraphCache> graphs;
};

std::unique_ptr<UnfoldedModel> load_unfolded(const std::string& checkpoint,
                                             const std::string& exported_path,
                                             const ExportedResnet& exported, Device device) {
  // The unfolded model runs in the export's precision, so the comparison measures folding alone.
  const DType precision = exported.precision();
  auto model = std::make_unique<UnfoldedModel>();
  // Another checkpoint would compare two different models, and its logit differences and
  // agreement would read as folding error: only the export's own source is compared.
  const std::map<std::string, std::string>& metadata = exported.metadata();
  auto source = metadata.find("source_checkpoint");
  auto digest = metadata.find("source_sha256");
  const std::string source_path =
      source == metadata.end() ? std::string("(not recorded)") : source->second;
  FT_REQUIRE(digest != metadata.end(), exported_path, ": the export records no source_sha256, so ",
             "--compare-unfolded cannot check that ", checkpoint,
             " is the checkpoint it was exported from (", source_path, "); re-export it with ",
             "`fusiontrain export --checkpoint CKPT --out FILE`");
  const std::string sha256 = sha256_hex_of_file(checkpoint);
  FT_USAGE_REQUIRE(sha256 == digest->second, "--compare-unfolded ", checkpoint, " (sha256 ", sha256,
                   ") is not the checkpoint ", exported_path, " was exported from ", source_path,
                   " (source_sha256 ", digest->second,
                   "); pass that checkpoint, or export this one ", "and compare with its export");
  model->config = checkpoint_config(checkpoint, {});
  FT_REQUIRE(model->config.model.arch == "resnet", checkpoint, ": --compare-unfolded needs a ",
             "ResNet checkpoint; this one is ", model->config.model.arch);
  model->shape = resnet_shape(model->config.model);
  const ResnetShape& shape = model->shape;
  const ResnetShape& exported_shape = exported.shape();
  FT_REQUIRE(shape.blocks_per_stage == exported_shape.blocks_per_stage &&
                 shape.width == exported_shape.width,
             checkpoint, ": --compare-unfolded checkpoint is a ResNet with ",
             shape.blocks_per_stage, " blocks per stage and width ", shape.width,
             "; the export has ", exported_shape.blocks_per_stage, " and ", exported_shape.width);
  model->ids = register_resnet_params(shape, model->params);
  if (precision == DType::kBF16) model->params.enable_bf16_copies();
  model->params.allocate(device);
  load_checkpoint_params(checkpoint, model->params);
  FusionOptions unfused;
  unfused.enabled = false;
  const UnfoldedModel* built = model.get();
  model->graphs = std::make_unique<GraphCache>(
      [built, precision](int batch, GraphMode mode) {
        return build_resnet_graph(built->shape, batch, built->ids, mode, precision);
      },
      model->params, unfused);
  return model;
}

// Copies `batch` into a graph's input and targets, runs one forward and copies the logits to
// `logits` (on cuda that waits for the forward); returns the milliseconds all of it took.
double timed_forward(Executor& executor, Workspace& ws, const Graph& graph, const ImageBatch& batch,
                     std::vector<float>* logits) {
  const double start = now_ms();
  Tensor& input = ws.values[graph.input];
  upload_to_workspace(ws, input, batch.images.data(), input.numel());
  ws.targets = batch.labels;
  executor.forward(ws);
  const Tensor& output = ws.values[graph.output];
  if (output.device() == Device::kCpu)
    logits->assign(output.data(), output.data() + output.numel());
  else
    *logits = output.to_host_vector();
  return now_ms() - start;
}

void progress(int64_t done, int64_t total) {
  if (!isatty(fileno(stderr))) return;
  const int width = 40, filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld images", filled,
               "########################################", width - filled, "",
               static_cast<long long>(done), static_cast<long long>(total));
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

struct LogitDiff {
  double max_abs = 0, max_logit = 0;
  int64_t agree = 0;
};

void compare_logits(const float* folded, const float* unfolded, int rows, int classes,
                    LogitDiff* diff) {
  for (int r = 0; r < rows; ++r) {
    const float* a = folded + static_cast<int64_t>(r) * classes;
    const float* b = unfolded + static_cast<int64_t>(r) * classes;
    for (int c = 0; c < classes; ++c) {
      diff->max_abs = std::max(diff->max_abs, static_cast<double>(std::fabs(a[c] - b[c])));
      diff->max_logit = std::max(diff->max_logit, static_cast<double>(std::fabs(b[c])));
    }
    diff->agree += std::max_element(a, a + classes) - a == std::max_element(b, b + classes) - b;
  }
}

// --compare-unfolded interleaves the two models in blocks of this many images (whole batches, at
// least one): at batch 1 a model's weights and buffers (about 1.3 MB for resnet8) fit in L2, and
// taking turns every batch would make each model start every batch with the other's data in
// cache, a cost that serving one model never pays. Blocks are short enough (16 batches of 0.15 ms
// at batch 1) that drift still hits both models alike.
constexpr int kBlockImages = 16;

}  // namespace

int run_infer(const InferArgs& args) {
  FT_REQUIRE(!args.model_path.empty(), "infer needs --model FILE.safetensors");
  const DType precision = dtype_flag("--precision", args.precision);
  // Before OpenMP sees the count: libgomp crashes or prints its own error on a huge one.
  require_key_range("--threads", "train.threads", args.threads);
  // --batch has its own range (count_check in app/cli/main.cpp), not train.batch_size's.
  FT_USAGE_REQUIRE(
      args.labels_path.empty() || args.data != "test", "--labels '", args.labels_path,
      "' goes with --data PATH (an IDX images file); the test set brings its own labels");
  const int threads = args.threads > 0 ? args.threads : resolve_threads(0);
  omp_set_num_threads(threads);
  const Device device = setup_device(args.device, "infer --device", "--device cpu", 0);
  ExportedResnet model(args.model_path, device, precision);
  bool has_labels = false;
  std::string source;
  const ImageDataset data = load_images(args, &has_labels, &source);
  check_export_fits_data(model.shape(), data, has_labels, args.model_path, source);
  const int total = args.limit > 0 ? std::min(args.limit, data.size()) : data.size();
  std::unique_ptr<UnfoldedModel> unfolded;
  if (!args.compare_checkpoint.empty())
    unfolded = load_unfolded(args.compare_checkpoint, args.model_path, model, device);

  const int classes = model.shape().classes;
  std::vector<double> folded_ms, unfolded_ms, ratios;
  LogitDiff diff;
  double loss_sum = 0;
  int64_t correct = 0;
  ImageBatch batch;  // the warm-up batch
  std::vector<float> logits, other_logits;
  // One untimed batch first: the export folds nothing, but primitives and transformed weights are
  // built on the first forward of each graph.
  image_eval_batch(data, model.image_stats(), 0, std::min(args.batch, total), &batch);
  {
    ExportedResnet::Run& run = model.run(batch.batch);
    timed_forward(*run.executor, run.ws, run.graph, batch, &logits);
    if (unfolded) {
      GraphRun& other = unfolded->graphs->get(batch.batch, GraphMode::kEval);
      timed_forward(*other.executor, other.workspace, other.graph, batch, &other_logits);
    }
  }
  // --profile: the graphs of the full batch size; a smaller last batch runs other graphs.
  const int profiled_batch = std::min(args.batch, total);
  std::unique_ptr<InferenceProfile> folded_profile, unfolded_profile;
  if (args.profile) {
    ExportedResnet::Run& run = model.run(profiled_batch);
    folded_profile = std::make_unique<InferenceProfile>(*run.executor, run.graph);
    if (unfolded) {
      GraphRun& other = unfolded->graphs->get(profiled_batch, GraphMode::kEval);
      unfolded_profile = std::make_unique<InferenceProfile>(*other.executor, other.graph);
    }
  }
  // Times one model's forward on the batch, as one profiled batch when it has the full size.
  auto timed = [&](InferenceProfile* profile, Executor& executor, Workspace& ws, const Graph& graph,
                   const ImageBatch& images, std::vector<float>* out) {
    const bool profiled = profile != nullptr && images.batch == profiled_batch;
    if (profiled) profile->begin_batch();
    const double ms = timed_forward(executor, ws, graph, images, out);
    if (profiled) profile->end_batch(ms);
    return ms;
  };
  // The models take turns a block of batches at a time (see kBlockImages), each batch of a block
  // run by both; which model goes first alternates per block.
  const int block_batches = unfolded ? std::clamp(kBlockImages / args.batch, 1, kBlockImages) : 1;
  std::vector<ImageBatch> block(block_batches);
  std::vector<std::vector<float>> block_logits(block_batches), block_other_logits(block_batches);
  std::vector<double> block_ms(block_batches), block_other_ms(block_batches);
  for (int first = 0, block_index = 0; first < total; ++block_index) {
    int count = 0;
    for (; count < block_batches && first < total; ++count, first += args.batch)
      image_eval_batch(data, model.image_stats(), first, std::min(args.batch, total - first),
                       &block[count]);
    auto run_folded = [&] {
      for (int i = 0; i < count; ++i) {
        ExportedResnet::Run& run = model.run(block[i].batch);
        block_ms[i] = timed(folded_profile.get(), *run.executor, run.ws, run.graph, block[i],
                            &block_logits[i]);
        loss_sum += static_cast<double>(run.executor->loss(run.ws)) * block[i].batch;
      }
    };
    auto run_unfolded = [&] {
      for (int i = 0; i < count; ++i) {
        GraphRun& other = unfolded->graphs->get(block[i].batch, GraphMode::kEval);
        block_other_ms[i] = timed(unfolded_profile.get(), *other.executor, other.workspace,
                                  other.graph, block[i], &block_other_logits[i]);
      }
    };
    const bool unfolded_first = unfolded && block_index % 2 == 1;
    if (unfolded_first) run_unfolded();
    run_folded();
    if (unfolded && !unfolded_first) run_unfolded();
    for (int i = 0; i < count; ++i) {
      const ImageBatch& images = block[i];
      folded_ms.push_back(block_ms[i]);
      if (unfolded) {
        unfolded_ms.push_back(block_other_ms[i]);
        ratios.push_back(block_other_ms[i] / block_ms[i]);
        compare_logits(block_logits[i].data(), block_other_logits[i].data(), images.batch, classes,
                       &diff);
      }
      for (int r = 0; r < images.batch; ++r) {
        const float* row = block_logits[i].data() + static_cast<int64_t>(r) * classes;
        correct += std::max_element(row, row + classes) - row == images.labels[r];
      }
    }
    progress(first, total);
  }

  double folded_total = 0;
  for (double ms : folded_ms) folded_total += ms;
  const double median = bench_percentile(folded_ms, 0.5), p90 = bench_percentile(folded_ms, 0.9);
  const double images_per_s = 1000.0 * total / folded_total;
  const bool bf16_weights = model.stored_dtype() == DType::kBF16;
  std::printf("infer %s on %s: %d images, batch %d, %s%s\n", args.model_path.c_str(),
              source.c_str(), total, args.batch,
              device == Device::kCuda
                  ? "cuda"
                  : (std::to_string(threads) + (threads == 1 ? " thread" : " threads")).c_str(),
              bf16_weights ? ", bf16 weights widened to fp32" : "");
  if (precision == DType::kBF16)
    std::printf("precision bf16: GEMM and convolution operands in bf16, fp32 sums; %s\n",
                bf16_kernels_text(device).c_str());
  nlohmann::json row = {{"type", "infer"},
                        {"model", args.model_path},
                        {"data", source},
                        {"images", total},
                        {"batch", args.batch},
                        {"threads", threads},
                        {"device", args.device},
                        {"latency_median_ms", median},
                        {"latency_p90_ms", p90},
                        {"images_per_s", images_per_s},
                        {"precision", dtype_name(model.precision())},
                        {"weights_dtype", dtype_name(model.stored_dtype())}};
  if (has_labels) {
    row["accuracy"] = static_cast<double>(correct) / total;
    row["loss"] = loss_sum / total;
    std::printf("accuracy %.2f%% | loss %.4f\n", 100.0 * correct / total, loss_sum / total);
  }
  std::printf("latency per batch: median %.3f ms, p90 %.3f ms | %.0f images/s\n", median, p90,
              images_per_s);
  if (unfolded) {
    const double relative = diff.max_logit > 0 ? diff.max_abs / diff.max_logit : diff.max_abs;
    const double unfolded_median = bench_percentile(unfolded_ms, 0.5);
    const double speedup = bench_percentile(ratios, 0.5);
    std::printf(
        "unfolded %s: max |logit diff| %.3g, max relative %.3g, predictions agree "
        "%lld/%d (%.2f%%)\n",
        args.compare_checkpoint.c_str(), diff.max_abs, relative, static_cast<long long>(diff.agree),
        total, 100.0 * diff.agree / total);
    std::printf(
        "unfolded latency per batch: median %.3f ms, p90 %.3f ms | folded speedup %.3fx "
        "(p10-p90 %.3f-%.3f, %zu batches, the models taking turns every %s)\n",
        unfolded_median, bench_percentile(unfolded_ms, 0.9), speedup, bench_percentile(ratios, 0.1),
        bench_percentile(ratios, 0.9), ratios.size(),
        block_batches == 1 ? "batch" : (std::to_string(block_batches) + " batches").c_str());
    row["compare"] = {{"checkpoint", args.compare_checkpoint},
                      {"max_abs_logit_diff", diff.max_abs},
                      {"max_rel_logit_diff", relative},
                      {"prediction_agreement", static_cast<double>(diff.agree) / total},
                      {"unfolded_latency_median_ms", unfolded_median},
                      {"unfolded_latency_p90_ms", bench_percentile(unfolded_ms, 0.9)},
                      {"speedup", speedup},
                      {"speedup_p10", bench_percentile(ratios, 0.1)},
                      {"speedup_p90", bench_percentile(ratios, 0.9)},
                      {"batches_per_turn", block_batches}};
  }
  if (folded_profile) {
    std::printf("%s", folded_profile->format("folded").c_str());
    row["profile"] = folded_profile->json();
  }
  if (unfolded_profile) {
    std::printf("%s", unfolded_profile->format("unfolded").c_str());
    row["compare"]["profile"] = unfolded_profile->json();
  }
  if (!args.json_path.empty()) {
    write_output_file(args.json_path, row.dump() + "\n");
  }
  return 0;
}

}  // namespace ft
