// Data parallelism is exact: N ranks with batch b each must train like one process with batch N*b.
// For a tiny GPT, every combination of bucketing / bucket_view / overlap after 5 steps matches a
// local big-batch run (the union of every rank's batches, computed here without communication),
// and so does gradient accumulation. ResNet's BatchNorm uses per-rank statistics, so there each
// combination is compared with the plainest N-rank run instead.
// Both comm.deterministic settings run. Bucketing is bitwise neutral (every combination gives the
// plain per-tensor run's exact bits) only with comm.deterministic: true; with the native MPI
// allreduce, rounding follows bucket sizes from 3 ranks up, so there it is relative 1e-5. In both,
// every rank must end with the same parameters (bitwise with deterministic, else relative 1e-6).
// ctest runs this under mpirun with 2 and 3 ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/training/task.h"
#include "app/training/trainer.h"
#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/image_data.h"
#include "model/optimizer.h"
#include "tests/mpi_test_main.h"

namespace ft {
namespace {

constexpr int kSteps = 5;

// SGD without clipping keeps the update proportional to the gradient, so a wrong scale shows.
const char* const kSgdYaml =
    "optim: {name: sgd, lr: 0.2, min_lr: 0.0, warmup_steps: 0, momentum: 0.9,\n"
    "        weight_decay: 0.0, grad_clip: 0}\n";

const std::string kGptYaml =
    std::string(
        "model: {arch: gpt, n_layer: 1, n_head: 2, d_model: 32, seq_len: 16}\n"
        "train: {steps: 5, batch_size: 2, seed: 11, eval_every: 0}\n"
        "comm: {bucket_mb: 0.02, first_bucket_mb: 0.005}\n") +
    kSgdYaml + "data: {path: \"" + FT_SOURCE_DIR + "/data/moby_dick.txt\"}\n";

const std::string kResnetYaml = std::string(
                                    "model: {arch: resnet, resnet_blocks: 1, resnet_width: 4}\n"
                                    "train: {steps: 5, batch_size: 4, seed: 5, eval_every: 0}\n"
                                    "comm: {bucket_mb: 0.005, first_bucket_mb: 0.001}\n") +
                                kSgdYaml + "data: {mnist_dir: \"" + kFashionMnistDir + "\"}\n";

struct Mode {
  bool bucketing, bucket_view, overlap;
};

std::vector<Mode> all_modes() {
  std::vector<Mode> modes;
  for (bool bucketing : {false, true}) {
    for (bool view : {false, true}) {
      for (bool overlap : {false, true}) modes.push_back({bucketing, view, overlap});
    }
  }
  return modes;
}

std::string describe(const Mode& mode) {
  return std::string("bucketing=") + (mode.bucketing ? "on" : "off") +
         " bucket_view=" + (mode.bucket_view ? "on" : "off") +
         " overlap=" + (mode.overlap ? "on" : "off");
}

std::string describe(bool deterministic) {
  return deterministic ? "deterministic" : "native";
}

Config make_config(const std::string& yaml, const Mode& mode, int grad_accum, bool deterministic) {
  auto flag = [](bool on) { return on ? std::string("true") : std::string("false"); };
  return parse_config(
      yaml, "mpi_dp_equivalence_test",
      {"comm.bucketing=" + flag(mode.bucketing), "comm.bucket_view=" + flag(mode.bucket_view),
       "comm.overlap=" + flag(mode.overlap), "train.grad_accum=" + std::to_string(grad_accum),
       "comm.deterministic=" + flag(deterministic)});
}

// Forwards to the MPI communicator and counts the allreduces that ask for rank-order sums, so a
// test sees whether comm.deterministic reached the gradient reduction.
class SummationCounter final : public Communicator {
 public:
  explicit SummationCounter(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int local_rank() const override { return inner_.local_rank(); }
  const char* backend_name() const override { return inner_.backend_name(); }
  void allreduce(float* buffer, size_t count, const AllreduceOptions& options) override {
    if (options.summation == Summation::kRankOrder) ++rank_order;
    inner_.allreduce(buffer, count, options);
  }
  std::unique_ptr<CommHandle> allreduce_async(float* buffer, size_t count,
                                              const AllreduceOptions& options) override {
    if (options.summation == Summation::kRankOrder) ++rank_order;
    return inner_.allreduce_async(buffer, count, options);
  }
  void allreduce_bf16(bf16_bits* buffer, size_t count, const AllreduceOptions& options) override {
    if (options.summation == Summation::kRankOrder) ++rank_order;
    inner_.allreduce_bf16(buffer, count, options);
  }
  std::unique_ptr<CommHandle> allreduce_bf16_async(bf16_bits* buffer, size_t count,
                                                   const AllreduceOptions& options) override {
    if (options.summation == Summation::kRankOrder) ++rank_order;
    return inner_.allreduce_bf16_async(buffer, count, options);
  }
  void broadcast(float* buffer, size_t count, int root) override {
    inner_.broadcast(buffer, count, root);
  }
  void barrier() override { inner_.barrier(); }

  std::atomic<int64_t> rank_order{0};  // read after training, written by any thread

 private:
  Communicator& inner_;
};

struct Trained {
  std::vector<float> values;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> tensors;  // name, offset, numel
  int64_t allreduce_calls = 0;
  int64_t rank_order_calls = 0;  // of any collective, from the Trainer's start-up on
};

Trained snapshot(ParamStore& params) {
  Trained trained;
  const Tensor& values = params.flat_values();
  trained.values.assign(values.data(), values.data() + values.numel());
  for (ParamId id = 0; id < params.size(); ++id) {
    if (!params[id].trainable) continue;
    trained.tensors.push_back(
        {params[id].name, {params[id].offset, shape_numel(params[id].shape)}});
  }
  return trained;
}

Trained train_data_parallel(const Config& config, Communicator& comm) {
  SummationCounter counter(comm);
  Trainer trainer(config, &counter);
  int64_t calls = 0;
  for (int step = 0; step < kSteps; ++step) calls += trainer.train_step().comm.allreduce_calls;
  Trained trained = snapshot(trainer.params());
  trained.allreduce_calls = calls;
  trained.rank_order_calls = counter.rank_order.load();
  return trained;
}

// The Trainer's step on one process, fed the union of what every rank's shard yields (all
// micro-batches of every rank) as one batch: what N ranks must reproduce.
Trained train_big_batch(const Config& config, int ranks) {
  std::unique_ptr<Task> model = make_task(config, 0, 1);
  ParamStore params;
  model->register_params(params);
  params.allocate();
  params.initialize(config.train.seed);
  const int micro_batches = config.train.grad_accum;
  GraphCache graphs([&](int batch, GraphMode mode) { return model->build_graph(batch, mode); },
                    params, config.fusion);
  GraphRun& run = graphs.get(ranks * micro_batches * config.train.batch_size, GraphMode::kTrain);
  std::vector<std::unique_ptr<Task>> shards;
  for (int rank = 0; rank < ranks; ++rank) shards.push_back(make_task(config, rank, ranks));
  OptimizerOptions options;
  options.name = config.optim.name;
  options.momentum = config.optim.momentum;
  options.nesterov = config.optim.nesterov;
  options.weight_decay = config.optim.weight_decay;
  std::unique_ptr<Optimizer> optimizer = make_optimizer(options, params);
  const LrSchedule schedule{config.optim.lr, config.optim.min_lr, config.optim.warmup_steps,
                            config.train.steps};
  Workspace shard_batch;
  const Graph no_graph;  // GPT batches need no graph
  for (int step = 0; step < kSteps; ++step) {
    Workspace& ws = run.workspace;
    ws.tokens.clear();
    ws.targets.clear();
    for (auto& shard : shards) {
      for (int micro = 0; micro < micro_batches; ++micro) {
        shard->next_train_batch(shard_batch, no_graph);
        ws.tokens.insert(ws.tokens.end(), shard_batch.tokens.begin(), shard_batch.tokens.end());
        ws.targets.insert(ws.targets.end(), shard_batch.targets.begin(), shard_batch.targets.end());
      }
    }
    params.zero_grads();
    run.executor->forward(ws);
    run.executor->backward(ws);
    clip_grad_norm(params, config.optim.grad_clip);
    optimizer->step(params, schedule.at(step));
  }
  return snapshot(params);
}

// Largest per-tensor ||a - b|| / ||b||, and the tensor it occurs in.
std::pair<double, std::string> worst_relative_error(const Trained& a, const Trained& b) {
  std::pair<double, std::string> worst{0.0, "(none)"};
  if (a.values.size() != b.values.size()) return {INFINITY, "(different parameter counts)"};
  for (const auto& [name, range] : b.tensors) {
    double diff = 0, norm = 0;
    for (int64_t i = range.first; i < range.first + range.second; ++i) {
      diff += std::pow(static_cast<double>(a.values[i]) - b.values[i], 2);
      norm += std::pow(static_cast<double>(b.values[i]), 2);
    }
    const double relative = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    if (!(relative <= worst.first)) worst = {relative, name};
  }
  return worst;
}

// ||a - b|| / ||b|| over every trainable float at once.
double whole_model_relative_error(const Trained& a, const Trained& b) {
  if (a.values.size() != b.values.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (const auto& [name, range] : b.tensors) {
    for (int64_t i = range.first; i < range.first + range.second; ++i) {
      diff += std::pow(static_cast<double>(a.values[i]) - b.values[i], 2);
      norm += std::pow(static_cast<double>(b.values[i]), 2);
    }
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Floats whose bits differ between a and b (all of them when the layouts differ).
size_t differing_floats(const Trained& a, const Trained& b) {
  if (a.values.size() != b.values.size()) return std::max(a.values.size(), b.values.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.values.size(); ++i) differing += a.values[i] != b.values[i];
  return differing;
}

// `b` equals `a` bitwise with comm.deterministic: true, and within `tolerance` otherwise.
void expect_same_training(const Trained& a, const Trained& b, bool deterministic, double tolerance,
                          const std::string& what) {
  if (deterministic) {
    EXPECT_EQ(differing_floats(a, b), 0u) << what << " (" << describe(deterministic) << ")";
  } else {
    const auto [error, tensor] = worst_relative_error(a, b);
    EXPECT_LE(error, tolerance) << what << " (" << describe(deterministic) << "): worst tensor "
                                << tensor;
  }
}

// Every rank holds rank 0's parameters: bitwise with deterministic sums, else relative 1e-6.
// Also checks that comm.deterministic decided which summation the gradients used.
void expect_replicas_agree(Communicator& comm, const Trained& trained, bool deterministic,
                           const std::string& what) {
  Trained root = trained;
  comm.broadcast(root.values.data(), root.values.size(), 0);
  expect_same_training(trained, root, deterministic, 1e-6,
                       what + ": rank " + std::to_string(comm.rank()) + " against rank 0");
  if (deterministic) {
    EXPECT_GE(trained.rank_order_calls, trained.allreduce_calls)
        << what << ": comm.deterministic: true did not reach the gradient allreduces (is "
        << "GradSyncOptions::deterministic set from CommConfig in app/training/trainer.cpp?)";
  } else {
    EXPECT_EQ(trained.rank_order_calls, 0) << what << ": native run asked for rank order";
  }
}

// Parameters really moved, so equality after training means something.
double relative_change(const Trained& trained, const Config& config) {
  std::unique_ptr<Task> model = make_task(config, 0, 1);
  ParamStore params;
  model->register_params(params);
  params.allocate();
  params.initialize(config.train.seed);
  return worst_relative_error(trained, snapshot(params)).first;
}

const Mode kPlain = {false, true, false};  // one allreduce per tensor, in place, no overlap

class DpEquivalence : public ::testing::TestWithParam<bool> {};  // comm.deterministic

TEST_P(DpEquivalence, GptEveryModeMatchesBigBatch) {
  const bool deterministic = GetParam();
  MpiCommunicator comm;
  const Config reference_config = make_config(kGptYaml, kPlain, 1, deterministic);
  const Trained reference = train_big_batch(reference_config, comm.size());
  EXPECT_GT(relative_change(reference, reference_config), 1e-3);
  const Trained plain = train_data_parallel(reference_config, comm);
  for (const Mode& mode : all_modes()) {
    const Trained trained =
        train_data_parallel(make_config(kGptYaml, mode, 1, deterministic), comm);
    const auto [error, tensor] = worst_relative_error(trained, reference);
    EXPECT_LE(error, 1e-5) << describe(mode) << ": worst tensor " << tensor;
    EXPECT_GT(trained.allreduce_calls, 0) << describe(mode);
    expect_same_training(trained, plain, deterministic, 1e-5, describe(mode) + " against plain");
    expect_replicas_agree(comm, trained, deterministic, describe(mode));
  }
}

TEST_P(DpEquivalence, GptGradAccumulationMatchesBigBatch) {
  const bool deterministic = GetParam();
  MpiCommunicator comm;
  const int micro_batches = 3;
  const Config config = make_config(kGptYaml, {true, true, true}, micro_batches, deterministic);
  const Trained reference = train_big_batch(config, comm.size());
  const Trained trained = train_data_parallel(config, comm);
  const auto [error, tensor] = worst_relative_error(trained, reference);
  EXPECT_LE(error, 1e-5) << "grad_accum " << micro_batches << ": worst tensor " << tensor;
  expect_replicas_agree(comm, trained, deterministic, "grad_accum");
}

// train.precision bf16: N ranks train as one rank on the whole batch does, with the gradients
// reduced in fp32 and in bf16 (comm.grad_dtype). A rank's shorter GEMMs add in another order, and
// a 1e-7 difference can flip a bf16 rounding of an activation: measured worst tensors (small
// biases) 1.6e-6 at 2 ranks and 1.7e-3 at 3 with fp32 sums; the bf16 reduction adds a rounding
// of every gradient (2^-9 relative): 2.6e-3 and 3.2e-3. A lost scale or bucket is off by far more.
TEST_P(DpEquivalence, GptBf16MatchesBigBatch) {
  const bool deterministic = GetParam();
  MpiCommunicator comm;
  for (const char* grad_dtype : {"fp32", "bf16"}) {
    const Config config =
        parse_config(kGptYaml, "mpi_dp_equivalence_test",
                     {"comm.deterministic=" + std::string(deterministic ? "true" : "false"),
                      "train.precision=bf16", std::string("comm.grad_dtype=") + grad_dtype});
    const Trained reference = train_big_batch(config, comm.size());
    EXPECT_GT(relative_change(reference, config), 1e-2);
    const Trained trained = train_data_parallel(config, comm);
    const auto [error, tensor] = worst_relative_error(trained, reference);
    const double tolerance = std::string(grad_dtype) == "fp32" ? 5e-3 : 1e-2;
    EXPECT_LE(error, tolerance) << "grad_dtype " << grad_dtype << ": worst tensor " << tensor;
    if (comm.rank() == 0)
      std::printf("bf16 precision, grad_dtype %s, %d ranks: worst relative error %.2e (%s)\n",
                  grad_dtype, comm.size(), error, tensor.c_str());
    expect_replicas_agree(comm, trained, deterministic, std::string("bf16/") + grad_dtype);
  }
}

TEST_P(DpEquivalence, ResnetEveryModeMatchesPlainDataParallel) {
  const bool deterministic = GetParam();
  MpiCommunicator comm;
  const Config plain_config = make_config(kResnetYaml, kPlain, 1, deterministic);
  const Trained plain = train_data_parallel(plain_config, comm);
  EXPECT_GT(relative_change(plain, plain_config), 1e-3);
  expect_replicas_agree(comm, plain, deterministic, "plain");
  for (const Mode& mode : all_modes()) {
    if (!mode.bucketing && mode.bucket_view && !mode.overlap) continue;  // the plain run itself
    const Trained trained =
        train_data_parallel(make_config(kResnetYaml, mode, 1, deterministic), comm);
    if (deterministic) {
      EXPECT_EQ(differing_floats(trained, plain), 0u) << describe(mode) << " against plain";
    } else {
      // ReLU has kinks: from 3 ranks, bucketing's rounding (1e-7 after step 1) flips a ReLU
      // derivative at step 4 here, and per-tensor errors reach 8e-3 (bn1.bias, whose gradient
      // nearly cancels) while the whole model moves 2e-4. A smooth GPT stays within 1e-5 above.
      EXPECT_LE(whole_model_relative_error(trained, plain), 1e-3)
          << describe(mode) << " against plain (native)";
    }
    expect_replicas_agree(comm, trained, deterministic, describe(mode));
  }
}

INSTANTIATE_TEST_SUITE_P(CommDeterministic, DpEquivalence, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Deterministic" : "Native";
                         });

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  return ft::run_mpi_gtest(argc, argv);
}
