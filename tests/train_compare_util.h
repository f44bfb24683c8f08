// Two trainers of one config, on the CPU and on the device under test, stepped side by side: each
// step's training loss, then the eval loss, within a relative tolerance of the CPU's. For the
// GPU training tests (tests/cuda_*_test.cpp) whose tolerance is bf16-sized.
// Thread safety: the calling thread only.
#pragma once
#include <gtest/gtest.h>

#include <cmath>

#include "app/training/trainer.h"

namespace ft::test {

inline void expect_training_tracks_cpu(Trainer& on_cpu, Trainer& on_gpu, int steps, double rtol,
                                       int eval_batches) {
  for (int step = 1; step <= steps; ++step) {
    const float cpu_loss = on_cpu.train_step().loss, gpu_loss = on_gpu.train_step().loss;
    ASSERT_TRUE(std::isfinite(gpu_loss)) << "step " << step;
    EXPECT_NEAR(gpu_loss, cpu_loss, rtol * std::fabs(cpu_loss)) << "step " << step;
  }
  const double cpu_eval = on_cpu.evaluate(eval_batches).loss;
  const double gpu_eval = on_gpu.evaluate(eval_batches).loss;
  EXPECT_NEAR(gpu_eval, cpu_eval, rtol * std::fabs(cpu_eval));
}

}  // namespace ft::test
