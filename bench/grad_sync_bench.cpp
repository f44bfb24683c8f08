// Gradient allreduce of one step in isolation, against one allreduce of the same bytes:
// the target is bucketed <= 1.1x single. Uses each model's real parameter layout and
// backward ready order; gradients are announced back to back (no compute), after a barrier, so
// the times are communication only, without the skew between ranks that a training step adds.
//   mpirun --oversubscribe -np 2 build/bench/grad_sync_bench [iterations=50]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "app/config/config.h"
#include "app/training/task.h"
#include "comm/grad_sync.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_runtime.h"
#include "core/timer.h"
#include "model/gpt.h"
#include "model/resnet.h"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Row {
  const char* mode;
  double median_ms;
  int64_t calls;
};

// Median milliseconds of one GradSync step with `options`.
Row time_grad_sync(ft::Communicator& comm, ft::ParamStore& params,
                   const std::vector<ft::ParamId>& order, ft::GradSyncOptions options,
                   const char* mode, int iterations) {
  ft::GradSync sync(comm, params, order, options);
  std::vector<double> times;
  int64_t calls = 0;
  for (int i = 0; i < iterations + 3; ++i) {
    params.flat_grads().fill(1.0f);
    comm.barrier();
    const double start = ft::now_ms();
    sync.begin_backward(true);
    for (ft::ParamId id : order) sync.on_grad_ready(id);
    sync.finish(1.0f / comm.size());
    if (i >= 3) times.push_back(ft::now_ms() - start);
    calls = sync.last_stats().allreduce_calls;
  }
  return {mode, median(times), calls};
}

double time_single_allreduce(ft::Communicator& comm, ft::Tensor& buffer, int iterations) {
  std::vector<double> times;
  for (int i = 0; i < iterations + 3; ++i) {
    comm.barrier();
    const double start = ft::now_ms();
    comm.allreduce(buffer.data(), buffer.numel(), ft::ReduceOp::kAverage);
    if (i >= 3) times.push_back(ft::now_ms() - start);
  }
  return median(times);
}

void run_model(ft::Communicator& comm, const std::string& config_path, int iterations) {
  const ft::Config config = ft::load_config(config_path);
  ft::ParamStore params;
  ft::Graph graph;
  if (config.model.arch == "gpt") {
    const ft::GptShape shape{config.model.n_layer,
                             config.model.n_head,
                             config.model.d_model,
                             config.model.seq_len,
                             config.model.vocab_size,
                             0.0f,
                             false};
    graph = ft::build_gpt(shape, 1, params);
  } else {
    graph = ft::build_resnet({config.model.resnet_blocks, config.model.resnet_width}, 1, params);
  }
  params.allocate();
  const ft::Executor executor(graph, params);
  const std::vector<ft::ParamId>& order = executor.grad_ready_order();
  ft::GradSyncOptions options;
  options.overlap = false;
  std::vector<Row> rows;
  options.bucketing = false;
  rows.push_back(
      time_grad_sync(comm, params, order, options, "per-tensor (bucketing off)", iterations));
  options.bucketing = true;
  rows.push_back(
      time_grad_sync(comm, params, order, options, "bucketed, zero-copy views", iterations));
  options.bucket_view = false;
  rows.push_back(time_grad_sync(comm, params, order, options,
                                "bucketed, copy through fusion buffer", iterations));
  ft::Tensor whole = ft::Tensor::zeros({params.num_trainable_floats()});
  const double single_ms = time_single_allreduce(comm, whole, iterations);
  if (comm.rank() != 0) return;
  std::printf("\n%s: %lld gradient bytes, %d ranks, median of %d\n", config_path.c_str(),
              static_cast<long long>(whole.bytes()), comm.size(), iterations);
  std::printf(
      "| mode | allreduce calls | ms | vs one allreduce of the same bytes |\n|---|---|---|---|\n");
  for (const Row& row : rows)
    std::printf("| %s | %lld | %.3f | %.2fx |\n", row.mode, static_cast<long long>(row.calls),
                row.median_ms, row.median_ms / single_ms);
  std::printf("| one allreduce of all bytes | 1 | %.3f | 1.00x |\n", single_ms);
}

}  // namespace

int main(int argc, char** argv) {
  ft::MpiRuntime mpi(&argc, &argv);
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  try {
    ft::MpiCommunicator comm;
    for (const char* config : {"configs/gpt_tiny.yaml", "configs/gpt_small.yaml",
                               "configs/resnet8.yaml", "configs/resnet20.yaml"})
      run_model(comm, std::string(FT_SOURCE_DIR) + "/" + config, iterations);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: error: %s\n", mpi.world_rank(), error.what());
    ft::MpiRuntime::abort(1);
  }
  return 0;
}
