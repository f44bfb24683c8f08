// `fusiontrain sample`: loads a GPT checkpoint (or export, fp32 or bf16) and generates bytes after
// a prompt with the KV-cache decoder (model/gpt_decode.h), printing the text and tokens/s;
// --no-kv-cache recomputes the window for every byte, --compare-no-cache times both and checks they
// wrote the same text, and --precision bf16 runs the decoder's GEMMs on bf16 operands.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/cli/flag_checks.h"
#include "app/inference/inference_model.h"
#include "app/jobs/jobs.h"
#include "app/training/checkpoint_model.h"
#include "app/training/trainer.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/gemm.h"
#include "model/gpt.h"
#include "model/gpt_decode.h"
#include "model/gpt_sample.h"

namespace ft {

namespace {

// The sampling settings after defaults: a flag wins over its inference.* key.
struct SampleSettings {
  int max_new_tokens = 0;
  SamplingOptions sampling;
  uint64_t seed = 0;
};

// Where a value came from, for error messages.
std::string origin(bool from_flag, const char* flag, const char* key) {
  return from_flag ? std::string(flag) : std::string(key) + " (or the " + flag + " flag)";
}

SampleSettings resolve_settings(const SampleArgs& args, const Config& config) {
  SampleSettings settings;
  settings.max_new_tokens = args.max_new_tokens.value_or(config.inference.max_new_tokens);
  settings.sampling.temperature =
      static_cast<float>(args.temperature.value_or(config.inference.temperature));
  settings.sampling.top_k = args.top_k.value_or(config.inference.top_k);
  settings.seed = args.seed.value_or(config.train.seed);
  const int vocab = config.model.vocab_size;
  if (settings.max_new_tokens <= 0)
    FT_USAGE_FAIL(
        origin(args.max_new_tokens.has_value(), "--max-new-tokens", "inference.max_new_tokens"),
        " = ", settings.max_new_tokens, ": must be a positive number of bytes");
  const float temperature = settings.sampling.temperature;
  if (!(std::isfinite(temperature) && temperature >= 0.0f))
    FT_USAGE_FAIL(origin(args.temperature.has_value(), "--temperature", "inference.temperature"),
                  " = ", temperature, ": must be a finite number >= 0 (0 = greedy)");
  // The config checked its keys' ranges; a flag takes the same (0 = greedy is the flag's own).
  if (args.top_k) require_key_range("--top-k", "inference.top_k", *args.top_k);
  // inference.top_k's cross-key rule (app/config/config_checks.cpp), which a flag must follow as
  // well.
  if (settings.sampling.top_k > vocab)
    FT_USAGE_FAIL(origin(args.top_k.has_value(), "--top-k", "inference.top_k"), " = ",
                  settings.sampling.top_k,
                  ": inference.top_k must not exceed model.vocab_size = ", vocab,
                  " (0 = no truncation); pass a value from 0 to ", vocab);
  if (args.max_new_tokens)
    require_key_range("--max-new-tokens", "inference.max_new_tokens", *args.max_new_tokens);
  if (args.temperature && *args.temperature != 0.0)
    require_key_range("--temperature", "inference.temperature", *args.temperature);
  return settings;
}

GptShape gpt_shape_of(const ModelConfig& model) {
  return GptShape{model.n_layer,    model.n_head,  model.d_model, model.seq_len,
                  model.vocab_size, model.dropout, model.qk_norm};
}

std::string bytes_to_text(const std::vector<int32_t>& tokens) {
  std::string text;
  for (int32_t token : tokens) text.push_back(static_cast<char>(static_cast<uint8_t>(token)));
  return text;
}

// One generation, after an untimed identical one: the first run creates oneDNN's primitives for
// every GEMM shape it meets and faults in fresh buffers, which is not the decoding speed.
GenerateResult timed_generate(GptDecoder& decoder, const std::vector<int32_t>& prompt,
                              const SampleSettings& settings, DecodeMode mode) {
  GenerateOptions options;
  options.max_new_tokens = settings.max_new_tokens;
  options.sampling = settings.sampling;
  options.seed = settings.seed;
  options.mode = mode;
  generate(decoder, prompt, options);
  return generate(decoder, prompt, options);
}

nlohmann::json timing_json(const GenerateResult& result) {
  return {{"seconds", result.seconds},
          {"tokens_per_s", result.new_tokens.size() / result.seconds},
          {"positions_computed", result.positions_computed},
          {"reprimes", result.reprimes}};
}

// Index of the first differing token, or -1.
int first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i] != b[i]) return static_cast<int>(i);
  return a.size() == b.size() ? -1 : static_cast<int>(std::min(a.size(), b.size()));
}

// The GPT's weights and config: a training checkpoint (--checkpoint) or an export (--model),
// which hold the parameters under the same names and the config in their metadata.
struct GptWeights {
  std::string path;
  SafetensorsFile file;
};

GptWeights load_gpt_weights(const SampleArgs& args) {
  GptWeights weights;
  const bool from_export = !args.model_path.empty();
  weights.path = from_export ? args.model_path : args.checkpoint_path;
  if (weights.path.empty())
    FT_FAIL(
        "sample needs --checkpoint CKPT (a training checkpoint) or --model FILE (a GPT export)");
  if (from_export) {
    weights.file = load_safetensors(weights.path);
    const auto& metadata = weights.file.metadata;
    auto format = metadata.find("format");
    FT_REQUIRE(format != metadata.end() && format->second == kExportFormat, weights.path,
               ": not a fusiontrain export (metadata 'format' should be '", kExportFormat,
               "'); a training checkpoint goes to --checkpoint");
    auto arch = metadata.find("arch");
    FT_REQUIRE(arch != metadata.end() && arch->second == "gpt", weights.path, ": is a ",
               arch == metadata.end() ? std::string("model without 'arch'") : arch->second,
               " export; sample generates text from GPT exports (`fusiontrain infer --model` runs "
               "ResNet ones)");
  } else {
    weights.file = load_safetensors(weights.path);
    auto format = weights.file.metadata.find("format");
    FT_REQUIRE(format == weights.file.metadata.end() || format->second != kExportFormat,
               weights.path, " is an export (metadata 'format' '", kExportFormat,
               "'); pass it as --model ", weights.path,
               " (--checkpoint takes training checkpoints)");
    require_checkpoint(weights.file, weights.path);
  }
  return weights;
}

// An export's 'model' metadata is what other tools read to rebuild the network without our
// config parser: it must exist, be well formed and agree with the embedded config (which sample
// builds the model from, and whose shapes load_checkpoint_params holds the tensors to); every
// tensor must be finite, as a checkpoint's must. Returns how the tensors are stored.
DType check_gpt_export(const SafetensorsFile& file, const std::string& path,
                       const ModelConfig& model) {
  const DType stored = export_dtype(file, path);
  auto entry = file.metadata.find("model");
  FT_REQUIRE(entry != file.metadata.end(), path,
             ": export metadata has no 'model' (the network's shape); export it again");
  const nlohmann::json described = nlohmann::json::parse(entry->second, nullptr, false);
  FT_REQUIRE(described.is_object(), path,
             ": export metadata 'model' is not a JSON object of the network's shape; export it "
             "again");
  const std::pair<const char*, int> sizes[] = {{"n_layer", model.n_layer},
                                               {"n_head", model.n_head},
                                               {"d_model", model.d_model},
                                               {"seq_len", model.seq_len},
                                               {"vocab_size", model.vocab_size}};
  for (const auto& [key, expected] : sizes) {
    auto field = described.find(key);
    FT_REQUIRE(field != described.end() && field->is_number_integer(), path,
               ": export metadata model.", key, " is missing or not an integer");
    FT_REQUIRE(field->get<int64_t>() == expected, path, ": export metadata model.", key, " is ",
               field->get<int64_t>(), ", but its config says model.", key, ": ", expected,
               "; the export contradicts itself: export it again");
  }
  auto qk_norm = described.find("qk_norm");
  FT_REQUIRE(qk_norm != described.end() && qk_norm->is_boolean(), path,
             ": export metadata model.qk_norm is missing or not true/false");
  FT_REQUIRE(qk_norm->get<bool>() == model.qk_norm, path, ": export metadata model.qk_norm is ",
             qk_norm->get<bool>() ? "true" : "false",
             ", but its config says model.qk_norm: ", model.qk_norm ? "true" : "false",
             "; the export contradicts itself: export it again");
  for (const auto& [name, tensor] : file.tensors)
    for (size_t i = 0; i < tensor.data.size(); ++i)
      FT_REQUIRE(std::isfinite(tensor.data[i]), path, ": tensor '", name,
                 "' holds a non-finite value (", tensor.data[i], " at element ", i,
                 "); the export is unusable: export again from a finite checkpoint");
  return stored;
}

}  // namespace

int run_sample(const SampleArgs& args) {
  const DType precision = dtype_flag("--precision", args.precision);
  // With --config the flags are checked before the weights file is read; without, the config is
  // the one the file embeds.
  std::optional<GptWeights> weights;
  if (args.config_path.empty()) weights = load_gpt_weights(args);
  const Config config = weights ? checkpoint_config(weights->file, weights->path, args.overrides)
                                : load_config(args.config_path, args.overrides);
  if (config.model.arch != "gpt")
    FT_FAIL("sample needs a GPT checkpoint; model.arch is ", config.model.arch, " in ",
            args.config_path.empty() ? weights->path : args.config_path);
  if (config.model.vocab_size != 256)
    FT_FAIL("sample generates bytes: model.vocab_size must be 256, is ", config.model.vocab_size);
  if (args.no_kv_cache && args.compare_no_cache)
    FT_USAGE_FAIL(
        "--no-kv-cache and --compare-no-cache exclude each other (the comparison runs both)");
  const SampleSettings settings = resolve_settings(args, config);
  const int seq_len = config.model.seq_len;
  // An empty prompt starts from a newline: the model needs one token to predict from, and a line
  // start is the most neutral place in running text.
  const std::string prompt_text = args.prompt.empty() ? std::string("\n") : args.prompt;
  // The model sees at most seq_len bytes, so a longer prompt conditions on its last seq_len (as
  // nanoGPT crops to block_size); the printed text still starts with the whole prompt.
  const size_t kept = std::min(prompt_text.size(), static_cast<size_t>(seq_len));
  if (kept < prompt_text.size())
    std::fprintf(stderr,
                 "note: --prompt is %zu bytes; the model's context holds model.seq_len = %d, so it "
                 "continues from the prompt's last %d bytes\n",
                 prompt_text.size(), seq_len, seq_len);
  std::vector<int32_t> prompt;
  for (unsigned char byte : prompt_text.substr(prompt_text.size() - kept)) prompt.push_back(byte);

  const int threads = resolve_threads(config.train.threads);
  omp_set_num_threads(threads);
  const GptShape shape = gpt_shape_of(config.model);
  ParamStore params;
  const GptParamIds ids = register_gpt_params(shape, params);
  if (!weights) weights = load_gpt_weights(args);
  require_same_model(weights->file, weights->path, config,
                     model_config_source(args.overrides, args.config_path));
  // A bf16 export's tensors arrive widened to fp32 (exactly), so either precision runs either file.
  const DType stored = args.model_path.empty()
                           ? DType::kF32
                           : check_gpt_export(weights->file, weights->path, config.model);
  require_checkpoint_tensors(weights->file, weights->path, params);  // before allocating
  if (precision == DType::kBF16) params.enable_bf16_copies();
  params.allocate();
  load_checkpoint_params(weights->file, weights->path, params);
  if (precision == DType::kBF16) params.refresh_bf16_copies();
  GptDecoder decoder(shape, ids, params, precision);

  const bool run_cached = !args.no_kv_cache;
  const bool run_recomputed = args.no_kv_cache || args.compare_no_cache;
  GenerateResult cached, recomputed;
  if (run_cached) cached = timed_generate(decoder, prompt, settings, DecodeMode::kKvCache);
  if (run_recomputed)
    recomputed = timed_generate(decoder, prompt, settings, DecodeMode::kRecompute);
  const GenerateResult& shown = run_cached ? cached : recomputed;

  const std::string new_text = bytes_to_text(shown.new_tokens);
  const std::string text = prompt_text + new_text;
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (text.back() != '\n') std::fputc('\n', stdout);
  const double tokens_per_s = shown.new_tokens.size() / shown.seconds;
  // fp32 runs print the line as they always have; bf16 says so, and which CPU path it took.
  const std::string precision_text =
      precision == DType::kBF16 ? std::string(" | precision bf16, ") + bf16_gemm_path() : "";
  std::printf(
      "sample: %zu new bytes in %.4f s | %.1f tokens/s %s | %lld positions, %d re-primes of %d | "
      "temperature %g, top_k %d, seed %llu, %d thread(s)%s\n",
      shown.new_tokens.size(), shown.seconds, tokens_per_s,
      run_cached ? "with the KV cache" : "without the KV cache",
      static_cast<long long>(shown.positions_computed), shown.reprimes, reprime_keep(seq_len),
      settings.sampling.temperature, settings.sampling.top_k,
      static_cast<unsigned long long>(settings.seed), threads, precision_text.c_str());

  nlohmann::json row = {{"type", "sample"},
                        {args.model_path.empty() ? "checkpoint" : "model", weights->path},
                        {"prompt", prompt_text},
                        // What the model conditioned on: the prompt, or its cropped tail.
                        {"prompt_in_context", bytes_to_text(prompt)},
                        {"text", text},
                        {"new_tokens", shown.new_tokens},
                        {"settings",
                         {{"max_new_tokens", settings.max_new_tokens},
                          {"temperature", settings.sampling.temperature},
                          {"top_k", settings.sampling.top_k},
                          {"seed", settings.seed},
                          {"kv_cache", run_cached},
                          {"seq_len", seq_len},
                          {"reprime_keep", reprime_keep(seq_len)},
                          {"threads", threads},
                          {"precision", dtype_name(decoder.gemm_dtype())},  // what ran
                          {"weights_dtype", dtype_name(stored)}}}};
  if (run_cached) row["kv_cache"] = timing_json(cached);
  if (run_recomputed) row["no_kv_cache"] = timing_json(recomputed);

  int difference = -1;
  if (args.compare_no_cache) {
    difference = first_difference(cached.new_tokens, recomputed.new_tokens);
    const double speedup = recomputed.seconds / cached.seconds;
    row["speedup"] = speedup;
    row["same_text"] = difference < 0;
    std::printf(
        "no KV cache: %.4f s | %.1f tokens/s | %lld positions | KV cache speedup %.2fx | %s\n",
        recomputed.seconds, recomputed.new_tokens.size() / recomputed.seconds,
        static_cast<long long>(recomputed.positions_computed), speedup,
        difference < 0 ? "same text" : "TEXT MISMATCH");
  }
  if (!args.json_path.empty()) {
    // Generated bytes need not be valid UTF-8; replace keeps the JSON valid (new_tokens is exact).
    write_output_file(args.json_path,
                      row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  // Both paths see the same windows, so only float rounding (GEMMs of 1 row against GEMMs of the
  // window) can split them: under greedy in fp32 that needs a near-tie, and any split is reported
  // as an error. A sampled draw can also land on a boundary, and in bf16 an fp32 difference in
  // the last bit can round a GEMM input to the neighbouring bf16 value (2^-8 apart), which widens
  // a near-tie 256-fold: there it is only a note.
  if (difference >= 0) {
    if (settings.sampling.temperature == 0.0f && precision == DType::kF32)
      FT_FAIL("--compare-no-cache: greedy texts with and without the KV cache differ at new byte ",
              difference);
    std::fprintf(stderr,
                 "note: %s texts with and without the KV cache differ from new byte %d (float "
                 "rounding at a %s)\n",
                 settings.sampling.temperature == 0.0f ? "greedy" : "sampled", difference,
                 precision == DType::kBF16 ? "near-tie, wider in bf16" : "sampling boundary");
  }
  return 0;
}

}  // namespace ft
