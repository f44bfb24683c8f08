// Task: what differs between the two models for training and evaluation: which parameters exist,
// how a graph of a given batch size is built, where batches come from, and what evaluation
// reports. The Trainer drives a Task; it never names GPT or ResNet itself.
// Thread safety: a Task is owned and used by the training thread.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "app/config/config.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/graph.h"
#include "model/params.h"
#include "model/resnet.h"

namespace ft {

struct EvalResult {
  double loss = 0.0;            // mean cross-entropy (nats)
  double accuracy = -1.0;       // classification only
  double bits_per_byte = -1.0;  // byte-level text only
  int64_t examples = 0;         // windows or images evaluated
};

// A graph, its executor and buffers for one batch size and mode; built on first use.
struct GraphRun {
  Graph graph;           // after the fusion passes; frozen: the executor's tables derive from it
  size_t eager_ops = 0;  // op count of the graph as model/ built it
  FusionResult fusion;   // what every pass did
  std::unique_ptr<Executor> executor;
  Workspace workspace;
};

// Builds graphs as build -> FusionPipeline -> validate -> Executor, keyed on (batch, mode), so
// evaluation never reuses the training graph.
class GraphCache {
 public:
  using Builder = std::function<Graph(int batch, GraphMode mode)>;
  GraphCache(Builder builder, ParamStore& params, const FusionOptions& fusion)
      : builder_(std::move(builder)), params_(params), fusion_(fusion) {}
  GraphRun& get(int batch, GraphMode mode);

 private:
  Builder builder_;
  ParamStore& params_;
  FusionOptions fusion_;
  FusionPipeline pipeline_ = FusionPipeline::standard();
  std::map<std::pair<int, GraphMode>, std::unique_ptr<GraphRun>> runs_;
};

class Task {
 public:
  virtual ~Task() = default;
  // Registers every parameter and buffer under its canonical name.
  virtual void register_params(ParamStore& params) = 0;
  // The eager graph (no fusion). REQUIRES: register_params was called.
  virtual Graph build_graph(int batch, GraphMode mode) const = 0;
  // Loads the next training batch of this rank into `ws` (tokens/targets, or the input image).
  virtual void next_train_batch(Workspace& ws, const Graph& graph) = 0;
  // Advances the training data stream by `count` batches without using them: resume from a
  // checkpoint without this rank's data state (an older one, or another world size).
  virtual void skip_train_batches(int64_t count) = 0;
  // This rank's position in its training data stream as text (generator state and batches or
  // samples taken), stored in checkpoints so resume restores it in O(1), bit-exact.
  virtual std::string data_state() const = 0;
  // Restores data_state(); throws ft::Error naming `origin` when `state` is malformed.
  virtual void set_data_state(const std::string& state, const std::string& origin) = 0;
  // Forward over up to max_batches evaluation batches (0 = all), in eval mode.
  virtual EvalResult evaluate(GraphCache& graphs, int batch, int max_batches) = 0;
  // Tokens (GPT) or images (ResNet) in one training batch of this rank.
  virtual int64_t items_per_batch() const = 0;
  virtual const char* item_unit() const = 0;
  // The model in a few words for the start line: "gpt 6x256, seq_len 128", "resnet20 width 16".
  virtual std::string describe() const = 0;
};

// The model.* keys as the builders take them.
GptShape gpt_shape(const ModelConfig& model);
ResnetShape resnet_shape(const ModelConfig& model);

// Builds the task `config.model.arch` names, loading its data shard for `rank` of `world_size`.
std::unique_ptr<Task> make_task(const Config& config, int rank, int world_size);

// GPT only: evaluates every window of a text file (eval job's --data).
EvalResult evaluate_text_file(const Config& config, GraphCache& graphs, const std::string& path);

}  // namespace ft
