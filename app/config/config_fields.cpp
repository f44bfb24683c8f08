// The config schema's table: every key, its type, its allowed values and its one-line doc.
// app/config/config_schema.cpp generates parsing, printing, flattening and the reference from it.
// The keys of fusion passes (and of switches like multi_tensor) come from the pass registry,
// PassRegistry::standard() (fusion/pass_registry.h), with the doc each pass declares in its
// PassInfo.
#include <algorithm>
#include <limits>

#include "app/config/config_schema.h"

namespace ft::config_schema {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Allowed range(double lo, double hi, bool lo_open, bool hi_open) {
  Allowed allowed;
  allowed.lo = lo, allowed.hi = hi, allowed.lo_open = lo_open, allowed.hi_open = hi_open;
  return allowed;
}
Allowed in(double lo, double hi) {
  return range(lo, hi, false, false);
}
Allowed at_least(double lo) {
  return range(lo, kInf, false, false);
}
Allowed above_up_to(double lo, double hi) {
  return range(lo, hi, true, false);
}
Allowed from_below(double lo, double hi) {
  return range(lo, hi, false, true);
}
Allowed one_of(std::vector<std::string> choices) {
  Allowed allowed;
  allowed.choices = std::move(choices);
  return allowed;
}
Allowed any_text() {
  return {};
}
Allowed nonempty_text() {
  Allowed allowed;
  allowed.nonempty = true;
  return allowed;
}
Allowed true_or_false() {
  return {};
}

// Expands to the key's dotted name and an accessor for it, so the two can never disagree.
#define FT_KEY(path) #path, +[](Config & c) { return &c.path; }

}  // namespace

std::vector<Field> pass_fields(const PassRegistry& passes, PassFamily family) {
  std::vector<Field> fields;
  for (const PassInfo* pass : passes.entries())
    if (pass->family == family)
      fields.push_back({pass->key(), PassFlagRef{pass->flag}, true_or_false(), pass->doc});
  return fields;
}

std::vector<Field> build_fields(const PassRegistry& passes) {
  std::vector<Field> table = {
      {FT_KEY(model.arch), one_of({"gpt", "resnet"}),
       "network: byte-level GPT-2 or CIFAR-style ResNet-(6n+2)"},
      {FT_KEY(model.n_layer), in(1, 64), "transformer blocks (gpt)"},
      {FT_KEY(model.n_head), in(1, 128), "attention heads; must divide d_model (gpt)"},
      {FT_KEY(model.d_model), in(8, 4096), "embedding width (gpt)"},
      {FT_KEY(model.seq_len), in(1, 8192), "context length in bytes; at least 2 (gpt)"},
      {FT_KEY(model.vocab_size), in(2, 65536), "vocabulary size; must be 256, one per byte (gpt)"},
      {FT_KEY(model.dropout), from_below(0, 1), "dropout probability (gpt)"},
      {FT_KEY(model.qk_norm), true_or_false(), "normalise queries and keys before attention (gpt)"},
      {FT_KEY(model.resnet_blocks), in(1, 64),
       "n in ResNet-(6n+2): residual blocks per stage (resnet)"},
      {FT_KEY(model.resnet_width), in(1, 1024),
       "channels of the first stage, doubled per stage (resnet)"},
      {FT_KEY(model.conv_algorithm), one_of({"auto", "onednn", "measure"}),
       "auto: Winograd F(4x4,3x3) for 3x3 stride-1 convs with 16k channels (in bf16 with bf16 "
       "instructions: oneDNN's bf16 kernels), oneDNN elsewhere; onednn: oneDNN everywhere; "
       "measure: where Winograd applies, time it against oneDNN on each conv's first forward and "
       "backward and keep the faster per pass (resnet)"},

      {FT_KEY(train.steps), at_least(1), "optimizer steps"},
      {FT_KEY(train.batch_size), in(1, 65536), "examples per rank per micro-batch"},
      {FT_KEY(train.seed), at_least(0), "seed for initialisation, data order and dropout"},
      {FT_KEY(train.threads), in(0, 256),
       "CPU threads per rank; 0 = cores / local ranks, at least 1"},
      {FT_KEY(train.eval_every), at_least(0),
       "steps between evaluations; 0 = no periodic evaluation"},
      {FT_KEY(train.eval_batches), in(1, 1000000), "batches per evaluation"},
      {FT_KEY(train.log_every), at_least(1), "steps between log lines"},
      {FT_KEY(train.run_dir), any_text(),
       "directory of the run: config.yaml, log.txt, metrics.jsonl; empty = "
       "runs/<config stem>-<timestamp> (-2, -3, ... when taken), with runs/latest a symlink to "
       "it"},
      {FT_KEY(train.checkpoint_dir), any_text(),
       "directory for checkpoints; empty = <run_dir>/checkpoints"},
      {FT_KEY(train.verbose), true_or_false(),
       "progress lines add the learning rate and the gradient norm (before clipping) and, with "
       "several ranks, communication details"},
      {FT_KEY(train.checkpoint_every), at_least(0),
       "steps between checkpoints; 0 = only at the end"},
      {FT_KEY(train.resume), any_text(),
       "run dir or checkpoint to resume from (as train --resume); empty = fresh start"},
      {FT_KEY(train.grad_accum), in(1, 1024), "micro-batches accumulated per optimizer step"},
      {FT_KEY(train.device), one_of({"cpu", "cuda"}),
       "where parameters, activations and every kernel live; cuda needs a CUDA build and a GPU "
       "(checked at start-up)"},
      {FT_KEY(train.tf32), true_or_false(),
       "cuda only: GEMMs round their inputs to TF32 (faster on tensor cores); false keeps fp32, "
       "so cpu and cuda agree to fp32 rounding"},
      {FT_KEY(train.precision), one_of({"fp32", "bf16"}),
       "bf16: GEMM operands (activations, weight copies, output gradients) in bf16 with fp32 "
       "accumulation; master weights, optimizer state, gradients and every reduction stay fp32. "
       "Both models, cpu and cuda (cuda compiled, not yet run on a GPU); on the cpu slow without "
       "bf16 instructions (said at start-up)"},
      {FT_KEY(train.profile), true_or_false(),
       "print per-op time (forward and backward apart) and fusion advice at the end; rank 0"},
      {FT_KEY(train.trace), any_text(),
       "write a Chrome trace-event JSON (Perfetto, chrome://tracing) of a few steps after warm-up "
       "here; empty = none"},
      {FT_KEY(train.nan_policy), one_of({"stop", "skip_step"}),
       "a non-finite loss or gradient norm: stop the run there (non-zero exit), or skip that "
       "step's optimizer update"},
      {FT_KEY(train.max_skipped_steps), in(0, 1000000),
       "nan_policy skip_step only: stop once more steps than this have been skipped"},
      {FT_KEY(train.overwrite), true_or_false(),
       "let a fresh run (no train.resume) write into a checkpoint_dir that already holds "
       "checkpoints (moved into its replaced-TIME subdirectory first), or a run_dir that "
       "holds another run's config.yaml or metrics.jsonl"},

      {FT_KEY(optim.name), one_of({"adamw", "sgd"}), "optimizer"},
      {FT_KEY(optim.lr), above_up_to(0, 10), "peak learning rate, reached after warmup"},
      {FT_KEY(optim.min_lr), in(0, 10), "learning rate at the end of the cosine decay; at most lr"},
      {FT_KEY(optim.warmup_steps), at_least(0), "linear warmup steps; at most train.steps"},
      {FT_KEY(optim.beta1), from_below(0, 1), "AdamW first-moment decay"},
      {FT_KEY(optim.beta2), from_below(0, 1), "AdamW second-moment decay"},
      {FT_KEY(optim.eps), above_up_to(0, 1), "AdamW denominator epsilon"},
      {FT_KEY(optim.weight_decay), in(0, 10), "weight decay (decoupled for adamw, L2 for sgd)"},
      {FT_KEY(optim.momentum), from_below(0, 1), "SGD momentum"},
      {FT_KEY(optim.nesterov), true_or_false(), "SGD Nesterov momentum; needs momentum > 0"},
      {FT_KEY(optim.grad_clip), in(0, 1e6), "clip the global gradient norm to this; 0 = off"},

      {FT_KEY(data.path), nonempty_text(), "text corpus (gpt)"},
      {FT_KEY(data.val_fraction), above_up_to(0, 0.5),
       "tail fraction of the corpus held out for validation (gpt)"},
      {FT_KEY(data.shuffle), true_or_false(), "shuffle training examples"},
      {FT_KEY(data.augment), one_of({"none", "flip"}),
       "training augmentation; flip = random horizontal flips (resnet)"},
      {FT_KEY(data.mnist_dir), nonempty_text(), "Fashion-MNIST directory (resnet)"},
      {FT_KEY(data.test_limit), at_least(0), "test images used for evaluation; 0 = all (resnet)"},

      {FT_KEY(fusion.enabled), true_or_false(),
       "compute fusion at all; false runs the eager graph exactly as model/ builds it"},
      // fusion.vertical.* and fusion.horizontal.* pass switches: pass_fields() splices them in.
      {FT_KEY(fusion.horizontal.max_padding_overhead), in(0, 100),
       "horizontal fusion only when padding FLOPs / useful FLOPs is at most this"},
      {FT_KEY(fusion.cuda_graph), true_or_false(),
       "capture the whole training step (forward, backward, bucket allreduces, clipping, "
       "optimizer) as one CUDA graph and replay it every step; needs train.device cuda, "
       "train.grad_accum 1, one rank or NCCL, and train.profile and train.trace off"},
      {FT_KEY(fusion.max_ops), in(1, 64),
       "eager ops one fused op may absorb; 1 fuses nothing; longer chains are split greedily"},
      {FT_KEY(fusion.tile_kb), in(4, 65536),
       "KiB of live intermediates per row tile of a fused row-tiled op; chains that cannot fit are "
       "split"},

      {FT_KEY(comm.backend), one_of({"auto", "mpi", "nccl"}),
       "gradient all-reduce backend; auto picks one for train.device"},
      {FT_KEY(comm.bucketing), true_or_false(),
       "fuse gradients into buckets; false = one allreduce per parameter tensor"},
      {FT_KEY(comm.bucket_mb), above_up_to(0, 4096), "bucket size in MB"},
      {FT_KEY(comm.first_bucket_mb), above_up_to(0, 4096),
       "first bucket size in MB, small so communication starts early; at most bucket_mb"},
      {FT_KEY(comm.bucket_view), true_or_false(),
       "buckets are views into the gradient buffer, not copies"},
      {FT_KEY(comm.overlap), true_or_false(), "overlap all-reduce with the backward pass"},
      {FT_KEY(comm.reorder_buckets), true_or_false(),
       "order buckets by when their gradients become ready"},
      {FT_KEY(comm.deterministic), true_or_false(),
       "sum gradients in rank order, so bucketing never changes a bit (from 3 ranks a "
       "point-to-point fold instead of the MPI library's collective); false = MPI's own tuned, "
       "topology-aware allreduce"},
      {FT_KEY(comm.timeout_s), in(0, 86400),
       "seconds a rank may wait on the others inside one collective before it reports a stalled "
       "or dead rank and exits, which stops the job (mpi backend); 0 = wait for ever"},
      {FT_KEY(comm.single_rank_allreduce), true_or_false(),
       "run the gradient allreduce even on one rank (a check of the backend path on a one-GPU "
       "machine, as scripts/gpu_check.sh does); no effect on the result"},
      {FT_KEY(comm.grad_dtype), one_of({"fp32", "bf16"}),
       "element type of the gradient allreduce: bf16 rounds each bucket to bf16 for the wire "
       "(half the bytes; sums add in fp32 and round once per hop) and widens the result back; "
       "gradients, optimizer and scaling stay fp32"},
      {FT_KEY(comm.emulate.latency_us), in(0, 1e6),
       "added latency per message in microseconds; needs bandwidth_gbps > 0"},
      {FT_KEY(comm.emulate.bandwidth_gbps), in(0, 1e4),
       "emulated link bandwidth in Gbit/s; 0 = emulation off"},

      // No inference.checkpoint: sample, eval and export take --checkpoint, and read the model's
      // config from it (app/config/config.cpp's kRetiredKeys explains the key to whoever still sets
      // it).
      {FT_KEY(inference.max_new_tokens), in(1, 1000000), "bytes to generate (gpt)"},
      {FT_KEY(inference.temperature), above_up_to(0, 100), "sampling temperature (gpt)"},
      {FT_KEY(inference.top_k), in(0, 65536),
       "sample among the k most likely tokens; 0 = all (gpt)"},
      // inference.fold_bn (FusionOptions::fold_bn, a fusion pass over eval graphs): appended
      // from the pass registry.
  };
  std::vector<Field> switches = pass_fields(passes, PassFamily::kVertical);
  for (Field& field : pass_fields(passes, PassFamily::kHorizontal))
    switches.push_back(std::move(field));
  const auto enabled = std::find_if(
      table.begin(), table.end(), [](const Field& field) { return field.key == "fusion.enabled"; });
  table.insert(enabled + 1, switches.begin(), switches.end());
  for (Field& field : pass_fields(passes, PassFamily::kInference))
    table.push_back(std::move(field));
  return table;
}
#undef FT_KEY

}  // namespace ft::config_schema
