// The two GEMM-epilogue fusions against their eager chains, through the ops' free functions with
// the zeroing the executor would do around the eager ops:
//   Linear -> GELU (the MLP's c_fc): linear_forward + gelu_forward, backward gelu_backward into
//     a zeroed dpre + linear_backward into a zeroed dx, against linear_gelu_forward /
//     linear_gelu_backward (row tiles, dx overwritten), and in forward only against the
//     inference form (one GEMM with oneDNN's GELU post-op);
//   LM head -> cross-entropy: linear_forward + softmax_cross_entropy_forward, backward into
//     zeroed dlogits and dx, against classifier_forward / classifier_backward.
// Shapes: gpt_tiny rows 256 and 512 (B = 4, 8; T = 64), C = 128, MLP 512; gpt_small rows 1024
// (B = 8, T = 128), C = 256, MLP 1024; vocabulary 256. Fused ops run at the tile the pass picks
// for tile_kb 1024 (the default) and at tile_kb 64 and 256.
// Counters:
//   bytes       tensor traffic of the step as written (each op reading its inputs and writing its
//               outputs from memory; a fused op's tile is re-read from cache, not counted)
//   GB/s        bytes / time
//   peak_bytes  classifier: the logits path's [rows, V] tensors alive at once (eager: logits,
//               probabilities, dlogits; fused: logits, dlogits)
//   build-gemm/bench/fusion_gemm_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/profiled_steps.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "fusion/ops/classifier.h"
#include "fusion/ops/linear_gelu.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"

namespace {

constexpr int kDefaultTileKb = 1024;

std::vector<float> random_floats(int64_t n, float std, uint64_t seed) {
  ft::Rng rng(seed);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& value : values) value = std * rng.normal();
  return values;
}

void zero(std::vector<float>& values) {
  std::fill(values.begin(), values.end(), 0.0f);
}

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// ---- Linear -> GELU. Args: rows, in, out, variant, tile_kb ----

enum LinearGeluVariant { kEager = 0, kFusedTiled = 1, kFusedPostOp = 2 };

struct MlpTensors {
  int64_t rows, in, out;
  // pre: the eager Linear's output, or the fused op's kept gelu'(pre); pre_tile its scratch tile
  std::vector<float> x, weight, bias, pre, pre_tile, y, dy, dpre, dx, dweight, dbias;
  MlpTensors(int64_t r, int64_t i, int64_t o)
      : rows(r),
        in(i),
        out(o),
        x(random_floats(r * i, 1.0f, 1)),
        weight(random_floats(o * i, 0.1f, 2)),
        bias(random_floats(o, 0.1f, 3)),
        pre(r * o),
        pre_tile(r * o),
        y(r * o),
        dy(random_floats(r * o, 1.0f, 4)),
        dpre(r * o),
        dx(r * i),
        dweight(o * i),
        dbias(o) {}
};

int tile_rows_for(int tile_kb, int64_t row_floats, int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(tile_kb * 1024 / (4 * row_floats), 1, rows));
}

void mlp_forward(MlpTensors& t, int variant, int tile_rows) {
  if (variant == kEager) {
    ft::linear_forward(t.pre.data(), t.x.data(), t.weight.data(), t.bias.data(), t.rows, t.in,
                       t.out);
    ft::gelu_forward(t.y.data(), t.pre.data(), t.rows * t.out);
  } else if (variant == kFusedTiled) {
    ft::linear_gelu_forward(t.y.data(), t.pre.data(), t.pre_tile.data(), t.x.data(),
                            t.weight.data(), t.bias.data(), t.rows, t.in, t.out, tile_rows);
  } else {
    ft::GemmArgs args;
    args.m = t.rows;
    args.n = t.out;
    args.k = t.in;
    args.transpose_b = true;
    args.bias = t.bias.data();
    args.epilogue = ft::Epilogue::kGeluTanh;
    ft::gemm(t.y.data(), t.x.data(), t.weight.data(), args);
  }
}

void mlp_backward(MlpTensors& t, int variant, int tile_rows) {
  if (variant == kEager) {
    zero(t.dpre);  // the executor zeroes dpre before GeluOp's backward adds into it
    ft::gelu_backward(t.dpre.data(), t.dy.data(), t.pre.data(), t.rows * t.out);
    // LinearOp overwrites its fresh input gradient, so the executor does not zero dx.
    ft::linear_backward(t.dx.data(), true, t.dweight.data(), t.dbias.data(), t.dpre.data(),
                        t.x.data(), t.weight.data(), t.rows, t.in, t.out);
  } else {
    ft::linear_gelu_backward(t.dx.data(), true, t.dweight.data(), t.dbias.data(), t.dpre.data(),
                             nullptr, t.dy.data(), t.pre.data(), t.x.data(), t.weight.data(),
                             t.rows, t.in, t.out, tile_rows);
  }
}

// Floats moved; see the file comment. r rows, i in, o out.
double mlp_forward_floats(double r, double i, double o, int variant) {
  const double operands = r * i + o * i + o;
  if (variant == kEager) return operands + 3 * r * o;       // pre written, read; y written
  if (variant == kFusedTiled) return operands + 2 * r * o;  // gelu'(pre) (saved) and y written
  return operands + r * o;                                  // y only
}
double mlp_backward_floats(double r, double i, double o, int variant) {
  if (variant == kEager)  // zero + gelu' (dy, pre, dpre rw), dx zero + GEMM, dW GEMM, db
    return 5 * r * o + (r * o + o * i + 3 * r * i) + (r * o + r * i + 2 * o * i) + r * o + o;
  // dpre written from dy and gelu'(pre), dx GEMM from the hot tile, dW GEMM re-reads dpre
  return 3 * r * o + (o * i + r * i) + (r * o + r * i + 2 * o * i) + o;
}

void BM_LinearGelu(benchmark::State& state, bool with_backward) {
  ft::bench::set_threads_from_env();
  MlpTensors t(state.range(0), state.range(1), state.range(2));
  const int variant = static_cast<int>(state.range(3));
  const int tile_rows = tile_rows_for(static_cast<int>(state.range(4)), t.out, t.rows);
  mlp_forward(t, variant, tile_rows);  // builds primitives
  for (auto _ : state) {
    mlp_forward(t, variant, tile_rows);
    if (with_backward) {
      zero(t.dweight);
      zero(t.dbias);
      mlp_backward(t, variant, tile_rows);
    }
    benchmark::DoNotOptimize(t.y.data());
    benchmark::DoNotOptimize(t.dweight.data());
  }
  const double r = t.rows, i = t.in, o = t.out;
  set_bytes(state, 4 * (mlp_forward_floats(r, i, o, variant) +
                        (with_backward ? mlp_backward_floats(r, i, o, variant) : 0)));
  state.counters["tile_rows"] = variant == kFusedTiled ? tile_rows : 0;
}
void BM_LinearGeluForward(benchmark::State& state) {
  BM_LinearGelu(state, false);
}
void BM_LinearGeluForwardBackward(benchmark::State& state) {
  BM_LinearGelu(state, true);
}

void mlp_shapes(benchmark::internal::Benchmark* bench, bool post_op) {
  for (const auto& [rows, C] :
       std::vector<std::pair<int, int>>{{256, 128}, {512, 128}, {1024, 256}}) {
    bench->Args({rows, C, 4 * C, kEager, 0});
    for (int tile_kb : {64, 256, kDefaultTileKb})
      bench->Args({rows, C, 4 * C, kFusedTiled, tile_kb});
    if (post_op) bench->Args({rows, C, 4 * C, kFusedPostOp, 0});
  }
}
BENCHMARK(BM_LinearGeluForward)
    ->ArgNames({"rows", "in", "out", "variant", "tile_kb"})
    ->Apply([](benchmark::internal::Benchmark* b) { mlp_shapes(b, true); })
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_LinearGeluForwardBackward)
    ->ArgNames({"rows", "in", "out", "variant", "tile_kb"})
    ->Apply([](benchmark::internal::Benchmark* b) { mlp_shapes(b, false); })
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- LM head -> cross-entropy. Args: rows, C, V, fused, tile_kb ----

struct ClassifierTensors {
  int64_t rows, channels, vocab;
  std::vector<float> x, wte, logits, probs, dlogits, dx, dwte;
  std::vector<int32_t> targets;
  ClassifierTensors(int64_t r, int64_t c, int64_t v)
      : rows(r),
        channels(c),
        vocab(v),
        x(random_floats(r * c, 1.0f, 5)),
        wte(random_floats(v * c, 0.1f, 6)),
        logits(r * v),
        probs(r * v),
        dlogits(r * v),
        dx(r * c),
        dwte(v * c),
        targets(r) {
    ft::Rng rng(7);
    for (int32_t& target : targets) target = static_cast<int32_t>(rng.next_u64() % v);
  }
};

void BM_Classifier(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  ClassifierTensors t(state.range(0), state.range(1), state.range(2));
  const bool fused = state.range(3) != 0;
  const int tile_rows = tile_rows_for(static_cast<int>(state.range(4)), t.vocab, t.rows);
  float loss = 0.0f;
  for (auto _ : state) {
    zero(t.dwte);
    if (fused) {
      loss = ft::classifier_forward(t.logits.data(), t.dlogits.data(), t.x.data(), t.wte.data(),
                                    t.targets.data(), t.rows, t.channels, t.vocab, tile_rows);
      ft::classifier_backward(t.dx.data(), true, t.dwte.data(), 1.0f, t.dlogits.data(), t.x.data(),
                              t.wte.data(), t.rows, t.channels, t.vocab);
    } else {
      ft::linear_forward(t.logits.data(), t.x.data(), t.wte.data(), nullptr, t.rows, t.channels,
                         t.vocab);
      loss = ft::softmax_cross_entropy_forward(t.probs.data(), t.logits.data(), t.targets.data(),
                                               t.rows, t.vocab);
      zero(t.dlogits);
      ft::softmax_cross_entropy_backward(t.dlogits.data(), 1.0f, t.probs.data(), t.targets.data(),
                                         t.rows, t.vocab);
      ft::linear_backward(t.dx.data(), true, t.dwte.data(), nullptr, t.dlogits.data(), t.x.data(),
                          t.wte.data(), t.rows, t.channels, t.vocab);
    }
    benchmark::DoNotOptimize(loss);
    benchmark::DoNotOptimize(t.dwte.data());
  }
  const double r = t.rows, c = t.channels, v = t.vocab;
  // Forward: x, wte read; logits and probs (eager) or dlogits (fused) written, eager CE re-reads
  // logits. Backward: eager zeroes and accumulates dlogits from probs, zeroes dx; both GEMMs read
  // dlogits, wte or x, and read-modify-write dx (eager) and dwte.
  const double floats = fused ? (r * c + v * c + 2 * r * v) + (2 * r * v + 2 * r * c + 3 * v * c)
                              : (r * c + v * c + 3 * r * v) + (6 * r * v + 4 * r * c + 3 * v * c);
  set_bytes(state, 4 * floats);
  state.counters["peak_bytes"] =
      ft::classifier_logits_path_bytes(t.rows, t.vocab, fused, ft::GraphMode::kTrain);
  state.counters["tile_rows"] = fused ? tile_rows : 0;
}
BENCHMARK(BM_Classifier)
    ->ArgNames({"rows", "C", "V", "fused", "tile_kb"})
    ->Apply([](benchmark::internal::Benchmark* bench) {
      for (const auto& [rows, C] :
           std::vector<std::pair<int, int>>{{256, 128}, {512, 128}, {1024, 256}}) {
        bench->Args({rows, C, 256, 0, 0});
        for (int tile_kb : {64, 256, kDefaultTileKb}) bench->Args({rows, C, 256, 1, tile_kb});
      }
    })
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
