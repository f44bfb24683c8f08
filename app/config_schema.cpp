// The config schema table and everything generated from it: value parsing and printing,
// flatten_config, config_to_yaml and config_reference_markdown.
#include "app/config_schema.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

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

std::vector<Field> build_fields() {
  return {
      {FT_KEY(model.arch), one_of({"gpt", "resnet"}),
       "network: byte-level GPT-2 or CIFAR-style ResNet-(6n+2)"},
      {FT_KEY(model.n_layer), in(1, 64), "transformer blocks (gpt)"},
      {FT_KEY(model.n_head), in(1, 128), "attention heads; must divide d_model (gpt)"},
      {FT_KEY(model.d_model), in(8, 4096), "embedding width (gpt)"},
      {FT_KEY(model.seq_len), in(1, 8192), "context length in bytes; at least 2 for gpt"},
      {FT_KEY(model.vocab_size), in(2, 65536), "vocabulary size; must be 256 (bytes) for gpt"},
      {FT_KEY(model.dropout), from_below(0, 1), "dropout probability (gpt)"},
      {FT_KEY(model.qk_norm), true_or_false(), "normalise queries and keys before attention (gpt)"},
      {FT_KEY(model.resnet_blocks), in(1, 64),
       "n in ResNet-(6n+2): residual blocks per stage (resnet)"},
      {FT_KEY(model.resnet_width), in(1, 1024),
       "channels of the first stage, doubled per stage (resnet)"},
      {FT_KEY(model.conv_algorithm), one_of({"auto", "onednn"}),
       "auto: Winograd F(4x4,3x3) for 3x3 stride-1 convs with 16k channels, oneDNN elsewhere; "
       "onednn: oneDNN everywhere (resnet)"},

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
       "runs/<config stem>-<timestamp>, with runs/latest a symlink to it"},
      {FT_KEY(train.checkpoint_dir), any_text(),
       "directory for checkpoints; empty = <run_dir>/checkpoints"},
      {FT_KEY(train.verbose), true_or_false(),
       "progress lines add the learning rate and, with several ranks, communication details"},
      {FT_KEY(train.checkpoint_every), at_least(0),
       "steps between checkpoints; 0 = only at the end"},
      {FT_KEY(train.resume), any_text(), "checkpoint to resume from; empty = fresh start"},
      {FT_KEY(train.grad_accum), in(1, 1024), "micro-batches accumulated per optimizer step"},
      {FT_KEY(train.device), one_of({"cpu"}),
       "where compute runs; only cpu for now (GPU training is not implemented yet)"},
      {FT_KEY(train.profile), true_or_false(),
       "print per-op time (forward and backward apart) and fusion advice at the end; rank 0"},
      {FT_KEY(train.trace), any_text(),
       "write a Chrome trace-event JSON (Perfetto, chrome://tracing) of a few steps after warm-up "
       "here; empty = none"},
      {FT_KEY(train.nan_policy), one_of({"stop", "skip_step"}),
       "a non-finite loss or gradient norm: stop the run there (non-zero exit), or skip that "
       "step's optimizer update"},
      {FT_KEY(train.max_skipped_steps), in(0, 1000000),
       "skip_step: stop once more steps than this have been skipped"},
      {FT_KEY(train.overwrite), true_or_false(),
       "let a fresh run (no train.resume) write into a checkpoint_dir that already holds "
       "checkpoints"},

      {FT_KEY(optim.name), one_of({"adamw", "sgd"}), "optimizer"},
      {FT_KEY(optim.lr), above_up_to(0, 10), "peak learning rate, reached after warmup"},
      {FT_KEY(optim.min_lr), in(0, 10), "learning rate at the end of the cosine decay; at most lr"},
      {FT_KEY(optim.warmup_steps), at_least(0), "linear warmup steps; at most train.steps"},
      {FT_KEY(optim.beta1), from_below(0, 1), "AdamW first-moment decay"},
      {FT_KEY(optim.beta2), from_below(0, 1), "AdamW second-moment decay"},
      {FT_KEY(optim.eps), above_up_to(0, 1), "AdamW denominator epsilon"},
      {FT_KEY(optim.weight_decay), in(0, 10), "weight decay (decoupled for adamw, L2 for sgd)"},
      {FT_KEY(optim.momentum), from_below(0, 1), "SGD momentum"},
      {FT_KEY(optim.nesterov), true_or_false(), "SGD Nesterov momentum"},
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
      {FT_KEY(fusion.vertical.gemm_epilogue), true_or_false(),
       "Linear -> GELU as one op: the GELU runs on row tiles of the GEMM output (gpt)"},
      {FT_KEY(fusion.vertical.residual_layernorm), true_or_false(),
       "dropout -> residual add -> next LayerNorm as one op (gpt)"},
      {FT_KEY(fusion.vertical.classifier), true_or_false(),
       "LM head -> softmax -> cross-entropy row block by row block, no probability tensor (gpt)"},
      {FT_KEY(fusion.vertical.attention), true_or_false(),
       "scores -> causal softmax -> weighted sum as one tiled op with an online softmax (gpt)"},
      {FT_KEY(fusion.vertical.bn_relu), true_or_false(),
       "BatchNorm -> ReLU and residual add -> ReLU as one op each (resnet)"},
      {FT_KEY(fusion.horizontal.qkv), true_or_false(),
       "the q, k and v Linears as one GEMM into a [rows, 3C] buffer (gpt)"},
      {FT_KEY(fusion.horizontal.batched_layernorm), true_or_false(),
       "the per-head q/k LayerNorms of qk_norm as one batched op (gpt)"},
      {FT_KEY(fusion.horizontal.multi_tensor), true_or_false(),
       "optimizer step, gradient zeroing and gradient norm as chunked passes over the flat "
       "buffers"},
      {FT_KEY(fusion.horizontal.conv_shortcut), true_or_false(),
       "a downsampling block's 3x3 conv and 1x1 shortcut as one conv, within max_padding_overhead "
       "(resnet)"},
      {FT_KEY(fusion.horizontal.max_padding_overhead), in(0, 100),
       "horizontal fusion only when padding FLOPs / useful FLOPs is at most this"},
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
      {FT_KEY(comm.emulate.latency_us), in(0, 1e6),
       "added latency per message in microseconds; needs bandwidth_gbps > 0"},
      {FT_KEY(comm.emulate.bandwidth_gbps), in(0, 1e4),
       "emulated link bandwidth in Gbit/s; 0 = emulation off"},

      {FT_KEY(inference.checkpoint), any_text(), "checkpoint to load; empty = none"},
      {FT_KEY(inference.max_new_tokens), in(0, 1000000), "bytes to generate (gpt)"},
      {FT_KEY(inference.temperature), above_up_to(0, 100), "sampling temperature (gpt)"},
      {FT_KEY(inference.top_k), in(0, 65536),
       "sample among the k most likely tokens; 0 = all (gpt)"},
      // Lives in FusionOptions, since the fold is a fusion pass over eval graphs.
      {"inference.fold_bn", +[](Config& c) { return &c.fusion.fold_bn; }, true_or_false(),
       "eval graphs fold BatchNorm into the convolution before it, with the ReLU and residual "
       "add after it as the convolution's epilogue (resnet)"},
  };
}
#undef FT_KEY

// The shortest text that reads back to exactly `value`.
template <typename T>
std::string format_number(T value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// A value inside the allowed range as a double can still leave it once stored as a float: 1e-50
// becomes 0, 0.99999999999 becomes 1, and 1e-40 becomes a subnormal that flush-to-zero turns into
// 0. Returns what is wrong ("" when the float keeps the value in range).
std::string float_rounding_problem(const Allowed& allowed, const std::string& text, double value) {
  const float stored = static_cast<float>(value);
  const double back = static_cast<double>(stored);
  const std::string lo = format_number(allowed.lo), hi = format_number(allowed.hi);
  if (allowed.lo_open && back <= allowed.lo)
    return text + " rounds to " + format_number(stored) + " as a float; must be above " + lo;
  if (allowed.hi_open && back >= allowed.hi)
    return text + " rounds to " + format_number(stored) + " as a float; must be below " + hi;
  if (back < allowed.lo || back > allowed.hi)
    return text + " rounds to " + format_number(stored) + " as a float, outside [" + lo + ", " +
           hi + "]";
  const float smallest = std::numeric_limits<float>::min();
  const bool zero_allowed = allowed.lo < 0 || (allowed.lo == 0 && !allowed.lo_open);
  if (stored != 0.0f && std::fabs(stored) < smallest)
    return text + " is too small for a float: below " + format_number(smallest) +
           ", the smallest normal float, it would be flushed to 0; use " +
           (zero_allowed ? "0 or " : "") + "at least " + format_number(smallest);
  return "";
}

// Why a choice the schema once had or a user may expect is refused, appended to the error.
std::string refusal_hint(const std::string& key, const std::string& text) {
  if (key == "train.device" && text == "cuda")
    return "; GPU training is not there yet: the trainer runs on the CPU only for now, so use "
           "train.device: cpu";
  return "";
}

// Config is only read here; the accessors take a mutable Config so one table serves both ways.
template <typename T>
const T& read(T* (*accessor)(Config&), const Config& config) {
  return *accessor(const_cast<Config&>(config));
}

}  // namespace

const std::vector<Field>& fields() {
  static const std::vector<Field> table = build_fields();
  return table;
}

const std::vector<Section>& sections() {
  static const std::vector<Section> table = {
      {"model", "Network architecture."},
      {"train", "Training loop, logging, checkpoints and device."},
      {"optim",
       "Optimizer and learning-rate schedule (linear warmup, then cosine decay to min_lr)."},
      {"data", "Data sets and augmentation."},
      {"fusion",
       "Compute fusion: graph passes between model/ and the executor, each with its unfused twin."},
      {"fusion.vertical", "Chains of ops whose intermediates no longer round-trip through memory."},
      {"fusion.horizontal", "Independent ops of one kind in one launch."},
      {"comm", "Gradient communication between data-parallel ranks."},
      {"comm.emulate", "Slow-network emulation: both keys 0 = off."},
      {"inference", "Text generation and evaluation from a checkpoint."},
  };
  return table;
}

const Field* find_field(const std::string& key) {
  for (const Field& field : fields())
    if (field.key == key) return &field;
  return nullptr;
}

bool is_section(const std::string& name) {
  return std::any_of(sections().begin(), sections().end(),
                     [&](const Section& section) { return section.name == name; });
}

std::vector<std::string> children(const std::string& section) {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::vector<std::string> names;
  auto add_direct_child = [&](const std::string& dotted) {
    if (dotted.compare(0, prefix.size(), prefix) != 0) return;
    std::string rest = dotted.substr(prefix.size());
    if (rest.empty() || rest.find('.') != std::string::npos) return;
    names.push_back(rest);
  };
  for (const Field& field : fields()) add_direct_child(field.key);
  for (const Section& sub : sections()) add_direct_child(sub.name);
  return names;
}

std::string type_name(const Field& field) {
  static const char* const kNames[] = {"int", "uint64", "float", "float", "bool", "string"};
  return kNames[field.ref.index()];
}

std::string describe_allowed(const Field& field) {
  const Allowed& allowed = field.allowed;
  if (std::holds_alternative<bool* (*)(Config&)>(field.ref)) return "true or false";
  if (std::holds_alternative<std::string* (*)(Config&)>(field.ref)) {
    if (!allowed.choices.empty()) return "one of: " + join(allowed.choices, ", ");
    return allowed.nonempty ? "a non-empty string" : "any string";
  }
  // Whole bounds print as integers: "[1, 1000000]" reads better than "[1, 1e+06]".
  auto bound = [](double value) {
    return value == std::floor(value) ? std::to_string(static_cast<long long>(value))
                                      : format_number(value);
  };
  std::string what = field.ref.index() <= 1 ? "an integer" : "a number";
  if (allowed.hi == kInf) return what + (allowed.lo_open ? " > " : " >= ") + bound(allowed.lo);
  return what + " in " + (allowed.lo_open ? "(" : "[") + bound(allowed.lo) + ", " +
         bound(allowed.hi) + (allowed.hi_open ? ")" : "]");
}

std::string format_value(const Field& field, const Config& config) {
  return std::visit(
      [&](auto accessor) -> std::string {
        const auto& value = read(accessor, config);
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return value;
        else if constexpr (std::is_same_v<T, bool>)
          return value ? "true" : "false";
        else if constexpr (std::is_integral_v<T>)
          return std::to_string(value);
        else
          return format_number(value);
      },
      field.ref);
}

std::string assign_value(const Field& field, Config& config, const std::string& text, bool quoted) {
  const Allowed& allowed = field.allowed;
  const std::string expected = "expected " + describe_allowed(field) + ", got ";
  const std::string got = "'" + text + "'";
  return std::visit(
      [&](auto accessor) -> std::string {
        auto& target = *accessor(config);
        using T = std::decay_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (allowed.nonempty && text.empty()) return expected + "an empty string";
          if (!allowed.choices.empty() && std::find(allowed.choices.begin(), allowed.choices.end(),
                                                    text) == allowed.choices.end())
            return expected + got + did_you_mean(nearest(text, allowed.choices)) +
                   refusal_hint(field.key, text);
          target = text;
          return "";
        } else {
          if (quoted) return expected + "the quoted string " + got + " (remove the quotes)";
          if constexpr (std::is_same_v<T, bool>) {
            if (text != "true" && text != "false") return expected + got;
            target = text == "true";
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            uint64_t value = 0;
            const char* end = text.data() + text.size();
            auto result = std::from_chars(text.data(), end, value);
            if (result.ec != std::errc() || result.ptr != end || text.empty())
              return expected + got;
            target = value;
          } else {
            double value = 0;
            const char* end = text.data() + text.size();
            std::from_chars_result result{};
            if constexpr (std::is_integral_v<T>) {
              long long integer = 0;
              result = std::from_chars(text.data(), end, integer);
              value = static_cast<double>(integer);
            } else {
              result = std::from_chars(text.data(), end, value);
            }
            if (result.ec == std::errc::invalid_argument || result.ptr != end ||
                !std::isfinite(value))
              return expected + got;
            const double hi =
                std::is_integral_v<T> ? std::min(allowed.hi, double(INT_MAX)) : allowed.hi;
            if (result.ec != std::errc() || value < allowed.lo || value > hi ||
                (allowed.lo_open && value == allowed.lo) || (allowed.hi_open && value == hi))
              return expected + text;
            if constexpr (std::is_same_v<T, float>) {
              const std::string problem = float_rounding_problem(allowed, text, value);
              if (!problem.empty()) return problem + " (" + expected + text + ")";
            }
            target = static_cast<T>(value);
          }
          return "";
        }
      },
      field.ref);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      current[j] = std::min(
          {previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  // Beyond this distance a "suggestion" is noise; the caller lists every valid key anyway.
  size_t best_distance = std::max<size_t>(3, word.size() / 2) + 1;
  std::string best;
  for (const std::string& candidate : candidates) {
    size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  return best;
}

std::string did_you_mean(const std::string& suggestion) {
  return suggestion.empty() ? "" : " (did you mean '" + suggestion + "'?)";
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string joined;
  for (size_t i = 0; i < items.size(); ++i) joined += (i ? separator : "") + items[i];
  return joined;
}

}  // namespace ft::config_schema

namespace ft {
using namespace config_schema;

namespace {

// A YAML double-quoted scalar, so any path or name reads back unchanged.
std::string yaml_quote(const std::string& text) {
  std::string quoted = "\"";
  for (unsigned char ch : text) {
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\x%02x", ch);
      quoted += escape;
    } else {
      quoted += static_cast<char>(ch);
    }
  }
  return quoted + "\"";
}

std::string parent_of(const std::string& dotted) {
  size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? "" : dotted.substr(0, dot);
}

std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (char ch : text) cell += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return cell;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> flatten_config(const Config& config) {
  std::vector<std::pair<std::string, std::string>> flat;
  for (const Field& field : fields()) flat.emplace_back(field.key, format_value(field, config));
  return flat;
}

std::string config_to_yaml(const Config& config) {
  std::ostringstream out;
  out << "# Resolved fusiontrain config: every key, with defaults filled in.\n";
  for (const Section& section : sections()) {
    const std::string indent(2 * std::count(section.name.begin(), section.name.end(), '.'), ' ');
    const std::string short_name = section.name.substr(section.name.rfind('.') + 1);
    out << indent << short_name << (children(section.name).empty() ? ": {}\n" : ":\n");
    for (const Field& field : fields()) {
      if (parent_of(field.key) != section.name) continue;
      const std::string value = format_value(field, config);
      const bool is_string = std::holds_alternative<std::string* (*)(Config&)>(field.ref);
      out << indent << "  " << field.key.substr(section.name.size() + 1) << ": "
          << (is_string ? yaml_quote(value) : value) << "\n";
    }
  }
  return out.str();
}

std::string config_reference_markdown() {
  const Config defaults;
  std::ostringstream out;
  out << "# Configuration reference\n\n"
         "Generated from the schema in `app/config_schema.cpp` by "
         "`ft::config_reference_markdown()`;\n"
         "do not edit by hand. After changing the schema, regenerate it by running the "
         "`config_test`\n"
         "binary with `FT_UPDATE_DOCS=1` set.\n\n"
         "Every key can be set in the YAML file (nested by section) or overridden on the command "
         "line\n"
         "with `--set section.key=value` (nested: `--set comm.emulate.latency_us=20`). Unknown "
         "keys,\n"
         "values of the wrong type and values outside the allowed range are errors. Integers must "
         "be\n"
         "written as integers, booleans as `true` or `false`.\n";
  for (const Section& section : sections()) {
    out << "\n## " << section.name << "\n\n" << section.doc << "\n";
    bool header_written = false;
    for (const Field& field : fields()) {
      if (parent_of(field.key) != section.name) continue;
      if (!header_written) {
        out << "\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
        header_written = true;
      }
      const std::string value = format_value(field, defaults);
      out << "| `" << field.key << "` | " << type_name(field) << " | "
          << (value.empty() ? "`\"\"`" : "`" + markdown_cell(value) + "`") << " | "
          << markdown_cell(describe_allowed(field)) << " | " << markdown_cell(field.doc) << " |\n";
    }
  }
  return out.str();
}

}  // namespace ft
