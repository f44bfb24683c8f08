// Cross-field checks of a parsed config: combinations that cannot work, and keys that were set
// although the chosen configuration never reads them (they would otherwise be silent no-ops).
#include <string>

#include "app/config/config_schema.h"
#include "core/check.h"

namespace ft::config_schema {
namespace {

// A key read only when `selector` has `value`: model.n_layer only builds a gpt. Found by reading
// where each key is used (app/training/task.cpp, app/training/trainer.cpp, app/jobs/sample_job.cpp,
// app/inference/inference_model.cpp, model/); fusion.* pass switches are not listed, since a pass
// that finds nothing to fuse says so in `plan`, and bench and tune switch every pass for both
// architectures.
struct OnlyWith {
  const char* key;
  const char* selector;
  const char* value;
};

constexpr OnlyWith kOnlyWith[] = {
    {"model.n_layer", "model.arch", "gpt"},
    {"model.n_head", "model.arch", "gpt"},
    {"model.d_model", "model.arch", "gpt"},
    {"model.seq_len", "model.arch", "gpt"},
    {"model.vocab_size", "model.arch", "gpt"},
    {"model.dropout", "model.arch", "gpt"},
    {"model.qk_norm", "model.arch", "gpt"},
    {"data.path", "model.arch", "gpt"},
    {"data.val_fraction", "model.arch", "gpt"},
    {"inference.max_new_tokens", "model.arch", "gpt"},
    {"inference.temperature", "model.arch", "gpt"},
    {"inference.top_k", "model.arch", "gpt"},
    {"model.resnet_blocks", "model.arch", "resnet"},
    {"model.resnet_width", "model.arch", "resnet"},
    {"model.conv_algorithm", "model.arch", "resnet"},
    {"data.augment", "model.arch", "resnet"},
    {"data.mnist_dir", "model.arch", "resnet"},
    {"data.test_limit", "model.arch", "resnet"},
    {"inference.fold_bn", "model.arch", "resnet"},  // no BatchNorm in a gpt
    {"optim.beta1", "optim.name", "adamw"},
    {"optim.beta2", "optim.name", "adamw"},
    {"optim.eps", "optim.name", "adamw"},
    {"optim.momentum", "optim.name", "sgd"},
    {"optim.nesterov", "optim.name", "sgd"},
    {"train.max_skipped_steps", "train.nan_policy", "skip_step"},
};

class Checker {
 public:
  Checker(const Config& config, const std::string& origin, const KeySources& sources)
      : c_(config), origin_(origin), sources_(sources) {}

  void run() const {
    refuse_ignored_keys();
    const Config& c = c_;
    if (c.model.arch == "gpt") {
      require(c.model.d_model % c.model.n_head == 0,
              show("model.d_model") + " must be divisible by " + show("model.n_head") +
                  " so that every attention head gets the same width");
      require(c.model.vocab_size == 256,
              show("model.vocab_size") + " must be 256 for gpt: the model reads raw bytes");
      require(c.model.seq_len >= 2,
              show("model.seq_len") +
                  " must be at least 2 for gpt: a sequence needs inputs and next-byte targets");
      require(c.inference.top_k <= c.model.vocab_size,
              show("inference.top_k") + " must not exceed " + show("model.vocab_size"));
    }
    // PyTorch's SGD refuses the same ("Nesterov momentum requires a momentum"): with momentum 0
    // the Nesterov step is plain SGD, so the flag would do nothing.
    require(c.optim.name != "sgd" || !c.optim.nesterov || c.optim.momentum > 0,
            show("optim.nesterov") + " requires optim.momentum > 0, got " + show("optim.momentum") +
                ": Nesterov momentum needs a momentum; set one, or optim.nesterov false");
    require(c.optim.warmup_steps <= c.train.steps,
            show("optim.warmup_steps") + " must not exceed " + show("train.steps"));
    require(c.optim.min_lr <= c.optim.lr,
            show("optim.min_lr") + " must not exceed " + show("optim.lr"));
    require(c.comm.first_bucket_mb <= c.comm.bucket_mb,
            show("comm.first_bucket_mb") + " must not exceed " + show("comm.bucket_mb"));
    require(c.comm.emulate.bandwidth_gbps > 0 || c.comm.emulate.latency_us == 0,
            show("comm.emulate.latency_us") + " requires comm.emulate.bandwidth_gbps > 0, got " +
                show("comm.emulate.bandwidth_gbps") +
                ": bandwidth 0 turns emulation off, so the latency would be silently ignored; "
                "set both to emulate a slow link, or both to 0");
    require(c.comm.backend != "nccl" || c.train.device == "cuda",
            show("comm.backend") + " requires train.device = cuda, got " + show("train.device") +
                "; NCCL reduces GPU memory only: use comm.backend auto or mpi on the cpu");
    require(!c.fusion.cuda_graph || c.train.device == "cuda",
            show("fusion.cuda_graph") + " requires train.device = cuda, got " +
                show("train.device") + "; a CUDA graph replays GPU work only");
    require(!c.fusion.cuda_graph || (!c.train.profile && c.train.trace.empty()),
            show("fusion.cuda_graph") + " cannot go with train.profile or train.trace: they time " +
                "each op on the host, and a replayed graph runs no host code per op; turn "
                "one of them off");
    require(!c.fusion.cuda_graph || c.train.grad_accum == 1,
            show("fusion.cuda_graph") + " requires train.grad_accum = 1, got " +
                show("train.grad_accum") +
                "; the graph captures one micro-batch's forward and backward per step");
    require(!c.train.tf32 || c.train.device == "cuda",
            show("train.tf32") + " requires train.device = cuda, got " + show("train.device") +
                "; the CPU GEMMs are fp32 only");
    // train.precision: bf16 needs no check of its own: every bf16 op of both models has a cuda
    // path (compiled, not yet run on a GPU; scripts/gpu_check.sh trains gpt_tiny and resnet8 in
    // bf16 on cuda), the ResNet's convolutions on cuDNN's bf16 configuration
    // (model/ops/conv2d_bf16.cu).
  }

 private:
  void require(bool ok, const std::string& message) const {
    if (!ok) FT_FAIL(origin_, ": invalid config: ", message);
  }

  // A key the configuration does not read would be a silent no-op: the user meant something by it.
  void refuse_ignored_keys() const {
    for (const OnlyWith& rule : kOnlyWith) {
      if (!is_set(rule.key)) continue;
      const std::string selected = format_value(*find_field(rule.selector), c_);
      require(selected == rule.value, show(rule.key) + " has no effect: it applies only to " +
                                          rule.selector + " " + rule.value + ", and " +
                                          show(rule.selector) + "; remove the key, or set " +
                                          rule.selector + " to " + rule.value);
    }
  }

  // Set by a --set or by a hand-written file whatever its value; in a resolved dump, which lists
  // every key, only when it differs from the default.
  bool is_set(const std::string& key) const {
    if (sources_.set_at.count(key) == 0) return false;
    if (sources_.from_dump.count(key) == 0) return true;
    const Field& field = *find_field(key);
    return format_value(field, c_) != format_value(field, Config{});
  }

  // "model.d_model = 100 (gpt.yaml:4:12)": the value and where it was set.
  std::string show(const std::string& key) const {
    auto source = sources_.set_at.find(key);
    return key + " = " + format_value(*find_field(key), c_) + " (" +
           (source == sources_.set_at.end() ? "default" : source->second) + ")";
  }

  const Config& c_;
  const std::string& origin_;
  const KeySources& sources_;
};

}  // namespace

void check_config(const Config& config, const std::string& origin, const KeySources& sources) {
  Checker(config, origin, sources).run();
}

}  // namespace ft::config_schema
