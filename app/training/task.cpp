#include "app/training/task.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

#include "app/analysis/plan.h"
#include "core/check.h"
#include "core/image_data.h"
#include "core/text_data.h"
#include "model/gpt.h"
#include "model/resnet.h"

namespace ft {

GraphRun& GraphCache::get(int batch, GraphMode mode) {
  const auto key = std::make_pair(batch, mode);
  auto it = runs_.find(key);
  if (it != runs_.end()) return *it->second;
  auto run = std::make_unique<GraphRun>();
  try {
    run->graph = builder_(batch, mode);
    run->eager_ops = run->graph.ops.size();
    run->fusion = pipeline_.run(run->graph, params_, fusion_);
    run->executor = std::make_unique<Executor>(run->graph, params_);
    run->workspace = run->executor->make_workspace();
  } catch (const std::exception& error) {
    // Our allocators throw OutOfMemory, the standard library bad_alloc; anything else passes.
    if (dynamic_cast<const OutOfMemory*>(&error) == nullptr &&
        dynamic_cast<const std::bad_alloc*>(&error) == nullptr)
      throw;
    double peak_bytes = 0;
    if (!run->graph.ops.empty()) peak_bytes = plan_memory(run->graph).peak_bytes;
    run.reset();  // frees what was allocated before formatting the message
    const char* mode_name = mode == GraphMode::kTrain ? "training" : "evaluation";
    const std::string need =
        peak_bytes > 0 ? detail::concat(" (", peak_bytes / double(1 << 20),
                                        " MiB of activations at its peak, see fusiontrain plan)")
                       : std::string();
    FT_FAIL("out of memory allocating the activations of the ", mode_name, " graph for batch ",
            batch, need,
            "; lower train.batch_size (or grow train.grad_accum to keep the examples per step), "
            "model.seq_len or model.d_model (gpt), or model.resnet_width (resnet)");
  }
  return *runs_.emplace(key, std::move(run)).first->second;
}

GptShape gpt_shape(const ModelConfig& model) {
  return GptShape{model.n_layer,    model.n_head,  model.d_model, model.seq_len,
                  model.vocab_size, model.dropout, model.qk_norm};
}

namespace {

// A batcher's state as five decimal numbers: the generator's four words, then the count taken.
std::string encode_data_state(const std::array<uint64_t, 4>& rng, uint64_t taken) {
  std::string text;
  for (uint64_t word : rng) text += std::to_string(word) + " ";
  return text + std::to_string(taken);
}

void decode_data_state(const std::string& text, const std::string& origin,
                       std::array<uint64_t, 4>* rng, uint64_t* taken) {
  std::istringstream in(text);
  for (uint64_t& word : *rng) in >> word;
  in >> *taken;
  std::string rest;
  FT_REQUIRE(!in.fail() && !(in >> rest), origin, ": data state '", text,
             "' is not five non-negative integers (generator state, then batches taken)");
}

void load_tokens(const TokenBatch& batch, Workspace& ws) {
  ws.tokens = batch.inputs;
  ws.targets = batch.targets;
}

// Mean loss over every window of `bytes`, in batches of `batch` (a smaller graph takes the rest).
// `name` says what the bytes are in errors.
EvalResult evaluate_windows(GraphCache& graphs, const uint8_t* bytes, size_t num_bytes, int seq_len,
                            int batch, int max_batches, const std::string& name) {
  const size_t windows = count_eval_windows(num_bytes, seq_len);
  FT_REQUIRE(windows > 0, "evaluation text ", name, " has ", num_bytes,
             " bytes, shorter than one window of model.seq_len + 1 = ", seq_len + 1, " bytes");
  TokenBatch tokens;
  double loss_sum = 0.0;
  size_t done = 0;
  for (int batches = 0; done < windows && (max_batches == 0 || batches < max_batches); ++batches) {
    eval_window_batch(bytes, num_bytes, seq_len, done, batch, &tokens);
    GraphRun& run = graphs.get(tokens.batch, GraphMode::kEval);
    load_tokens(tokens, run.workspace);
    run.executor->forward(run.workspace);
    loss_sum += static_cast<double>(run.executor->loss(run.workspace)) * tokens.batch;
    done += tokens.batch;
  }
  EvalResult result;
  result.loss = loss_sum / done;
  result.bits_per_byte = result.loss / std::log(2.0);
  result.examples = static_cast<int64_t>(done);
  return result;
}

// The corpus, checked now for what evaluation needs later: a validation split too short for one
// window would only fail after every training step, with no checkpoint written.
TextDataset load_text(const Config& config) {
  TextDataset data = TextDataset::load(config.data.path, config.data.val_fraction);
  const size_t window = static_cast<size_t>(config.model.seq_len) + 1;
  if (data.val_size() < window) {
    const double total = static_cast<double>(data.train_size() + data.val_size());
    // The largest val_fraction (0.5) may still hold out too little: then the data is too small.
    FT_REQUIRE(static_cast<double>(window) / total <= 0.5, data.name(), " holds ",
               data.train_size() + data.val_size(),
               " bytes, too few for model.seq_len = ", config.model.seq_len,
               ": its validation split (data.val_fraction, at most 0.5) "
               "needs one window of seq_len + 1 = ",
               window,
               " bytes and training needs more; use a larger corpus or lower model.seq_len");
    FT_FAIL("data.val_fraction = ", config.data.val_fraction, " holds out ", data.val_size(),
            " of the ", data.train_size() + data.val_size(), " bytes of ", data.name(),
            " for validation, less than one evaluation window of model.seq_len + 1 = ", window,
            " bytes; raise data.val_fraction to at least ", window / total,
            " or lower model.seq_len");
  }
  return data;
}

class GptTask : public Task {
 public:
  GptTask(const Config& config, int rank, int world_size)
      : config_(config),
        shape_(gpt_shape(config.model)),
        data_(load_text(config)),
        batcher_(data_, rank, world_size, config.train.batch_size, config.model.seq_len,
                 config.data.shuffle, config.train.seed) {}

  void register_params(ParamStore& params) override {
    ids_ = register_gpt_params(shape_, params);
    if (gemm_dtype() == DType::kBF16) params.enable_bf16_copies();
  }
  Graph build_graph(int batch, GraphMode mode) const override {
    return build_gpt_graph(shape_, batch, ids_, mode, gemm_dtype());
  }

  DType gemm_dtype() const {
    return config_.train.precision == "bf16" ? DType::kBF16 : DType::kF32;
  }

  void next_train_batch(Workspace& ws, const Graph&) override {
    batcher_.next(&batch_);
    load_tokens(batch_, ws);
  }

  void skip_train_batches(int64_t count) override {
    for (int64_t i = 0; i < count; ++i) batcher_.next(&batch_);
  }
  std::string data_state() const override {
    return encode_data_state(batcher_.rng_state(), batcher_.batches_taken());
  }
  void set_data_state(const std::string& state, const std::string& origin) override {
    std::array<uint64_t, 4> rng{};
    uint64_t taken = 0;
    decode_data_state(state, origin, &rng, &taken);
    batcher_.set_rng_state(rng);
    batcher_.set_batches_taken(taken);
  }

  EvalResult evaluate(GraphCache& graphs, int batch, int max_batches) override {
    return evaluate_windows(graphs, data_.val_bytes(), data_.val_size(), config_.model.seq_len,
                            batch, max_batches, "(the validation split of " + data_.name() + ")");
  }

  int64_t items_per_batch() const override {
    return static_cast<int64_t>(config_.train.batch_size) * config_.model.seq_len;
  }
  const char* item_unit() const override { return "tokens"; }
  std::string describe() const override {
    return "gpt " + std::to_string(config_.model.n_layer) + "x" +
           std::to_string(config_.model.d_model) + ", seq_len " +
           std::to_string(config_.model.seq_len);
  }

 private:
  Config config_;
  GptShape shape_;
  TextDataset data_;
  TextBatcher batcher_;
  GptParamIds ids_;
  TokenBatch batch_;
};

}  // namespace

ResnetShape resnet_shape(const ModelConfig& model) {
  ResnetShape shape{model.resnet_blocks, model.resnet_width};
  // The schema admits exactly the names conv_algorithm_from_name knows.
  FT_CHECK(conv_algorithm_from_name(model.conv_algorithm, &shape.conv_algorithm),
           "model.conv_algorithm '", model.conv_algorithm, "' passed the schema but is unknown");
  return shape;
}

namespace {

class ResnetTask : public Task {
 public:
  ResnetTask(const Config& config, int rank, int world_size)
      : config_(config),
        shape_(resnet_shape(config.model)),
        train_(ImageDataset::load_fashion_mnist(config.data.mnist_dir, true)),
        test_(ImageDataset::load_fashion_mnist(config.data.mnist_dir, false)),
        stats_(fashion_mnist_train_stats(train_)),
        batcher_(train_, stats_, rank, world_size, config.train.batch_size, config.data.shuffle,
                 config.data.augment == "flip", config.train.seed) {}

  void register_params(ParamStore& params) override {
    ids_ = register_resnet_params(shape_, params);
    if (gemm_dtype() == DType::kBF16) params.enable_bf16_copies();
  }
  Graph build_graph(int batch, GraphMode mode) const override {
    return build_resnet_graph(shape_, batch, ids_, mode, gemm_dtype());
  }

  DType gemm_dtype() const {
    return config_.train.precision == "bf16" ? DType::kBF16 : DType::kF32;
  }

  void next_train_batch(Workspace& ws, const Graph& graph) override {
    batcher_.next(&batch_);
    load_images(batch_, ws, graph);
  }

  void skip_train_batches(int64_t count) override {
    for (int64_t i = 0; i < count; ++i) batcher_.next(&batch_);
  }
  std::string data_state() const override {
    return encode_data_state(batcher_.rng_state(), batcher_.position());
  }
  void set_data_state(const std::string& state, const std::string& origin) override {
    std::array<uint64_t, 4> rng{};
    uint64_t samples = 0;
    decode_data_state(state, origin, &rng, &samples);
    batcher_.set_rng_state(rng);
    batcher_.set_position(samples);
  }

  EvalResult evaluate(GraphCache& graphs, int batch, int max_batches) override {
    int limit = test_.size();
    if (config_.data.test_limit > 0) limit = std::min(limit, config_.data.test_limit);
    double loss_sum = 0.0;
    int64_t correct = 0, done = 0;
    for (int batches = 0; done < limit && (max_batches == 0 || batches < max_batches); ++batches) {
      image_eval_batch(test_, stats_, static_cast<int>(done),
                       std::min<int>(batch, limit - static_cast<int>(done)), &batch_);
      GraphRun& run = graphs.get(batch_.batch, GraphMode::kEval);
      load_images(batch_, run.workspace, run.graph);
      run.executor->forward(run.workspace);
      loss_sum += static_cast<double>(run.executor->loss(run.workspace)) * batch_.batch;
      const std::vector<float> logits_on_host =
          run.workspace.values[run.graph.output].to_host_vector();
      const float* logits = logits_on_host.data();
      const int classes = static_cast<int>(run.graph.shape(run.graph.output).back());
      for (int row = 0; row < batch_.batch; ++row) {
        const float* row_logits = logits + static_cast<int64_t>(row) * classes;
        const int predicted =
            static_cast<int>(std::max_element(row_logits, row_logits + classes) - row_logits);
        correct += predicted == batch_.labels[row];
      }
      done += batch_.batch;
    }
    EvalResult result;
    result.loss = loss_sum / done;
    result.accuracy = static_cast<double>(correct) / done;
    result.examples = done;
    return result;
  }

  int64_t items_per_batch() const override { return config_.train.batch_size; }
  const char* item_unit() const override { return "images"; }
  std::string describe() const override {
    return "resnet" + std::to_string(6 * config_.model.resnet_blocks + 2) + " width " +
           std::to_string(config_.model.resnet_width);
  }

 private:
  static void load_images(const ImageBatch& batch, Workspace& ws, const Graph& graph) {
    Tensor& input = ws.values[graph.input];
    FT_CHECK(static_cast<int64_t>(batch.images.size()) == input.numel(), "image batch of ",
             batch.images.size(), " floats for an input of ", shape_str(input.shape()));
    upload_to_workspace(ws, input, batch.images.data(), static_cast<int64_t>(batch.images.size()));
    ws.targets = batch.labels;
  }

  Config config_;
  ResnetShape shape_;
  ImageDataset train_, test_;
  ChannelStats stats_;
  ImageBatcher batcher_;
  ResnetParamIds ids_;
  ImageBatch batch_;
};

}  // namespace

std::unique_ptr<Task> make_task(const Config& config, int rank, int world_size) {
  if (config.model.arch == "gpt") return std::make_unique<GptTask>(config, rank, world_size);
  if (config.model.arch == "resnet") return std::make_unique<ResnetTask>(config, rank, world_size);
  FT_FAIL("model.arch '", config.model.arch, "' is not one of: gpt, resnet");
}

EvalResult evaluate_text_file(const Config& config, GraphCache& graphs, const std::string& path) {
  FT_REQUIRE(config.model.arch == "gpt", "eval --data ", path,
             ": --data (a text file) applies to GPT checkpoints only; this one is model.arch ",
             config.model.arch,
             ", evaluated on the Fashion-MNIST test set in data.mnist_dir (for an IDX file, "
             "export the model and run fusiontrain infer --data)");
  const TextDataset text = TextDataset::load(path, 0.0f);
  return evaluate_windows(graphs, text.train_bytes(), text.train_size(), config.model.seq_len,
                          config.train.batch_size, 0, path);
}

}  // namespace ft
