// Export and reload of folded inference models (see inference_model.h for the file's contents).
#include "app/inference/inference_model.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "app/training/task.h"
#include "app/training/trainer.h"
#include "core/check.h"
#include "core/sha256.h"
#include "fusion/ops/conv_bias.h"
#include "fusion/rewrite.h"
#include "model/gpt.h"

namespace ft {
namespace {

// "layer1.0.conv1" for the op folded from the convolution with weight "layer1.0.conv1.weight".
std::string conv_prefix(const ConvBiasOp& op, const ParamStore& params) {
  const std::string& weight = params[op.params[0]].name;
  const std::string suffix = ".weight";
  FT_REQUIRE(weight.size() > suffix.size() &&
                 weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0,
             "conv_bias '", op.name, "': weight '", weight, "' does not end in .weight");
  return weight.substr(0, weight.size() - suffix.size());
}

nlohmann::json plan_of(const Graph& graph, const ParamStore& params) {
  nlohmann::json plan = nlohmann::json::array();
  for (const auto& op : graph.ops)
    if (op->op_kind() == OpKind::kConvBias) {
      const auto& conv = static_cast<const ConvBiasOp&>(*op);
      plan.push_back({{"conv", conv_prefix(conv, params)},
                      {"residual", conv.spec().residual},
                      {"relu", conv.spec().relu},
                      {"eps", conv.spec().eps}});
    }
  return plan;
}

nlohmann::json model_json(const ResnetShape& shape) {
  return {{"resnet_blocks", shape.blocks_per_stage},
          {"resnet_width", shape.width},
          {"image_size", shape.image_size},
          {"in_channels", shape.in_channels},
          {"classes", shape.classes},
          {"bn_eps", shape.bn_eps},
          {"conv_algorithm", conv_algorithm_name(shape.conv_algorithm)}};
}

const std::string& metadata_entry(const std::map<std::string, std::string>& metadata,
                                  const std::string& key, const std::string& path) {
  auto it = metadata.find(key);
  FT_REQUIRE(it != metadata.end(), path, ": export metadata has no '", key, "'");
  return it->second;
}

nlohmann::json metadata_json(const std::map<std::string, std::string>& metadata,
                             const std::string& key, const std::string& path) {
  try {
    return nlohmann::json::parse(metadata_entry(metadata, key, path));
  } catch (const nlohmann::json::parse_error& error) {
    // Our words, not the library's "[json.exception.parse_error.101] ...".
    FT_FAIL(path, ": export metadata '", key, "' is not valid JSON (it breaks at byte ", error.byte,
            "); export the model again");
  }
}

// The library's exception names neither the field nor the file: say which field is wrong.
template <typename T>
T field_of(const nlohmann::json& model, const char* key, const char* type,
           const std::string& path) {
  auto it = model.find(key);
  FT_REQUIRE(it != model.end(), path, ": export metadata 'model' has no '", key, "'");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    FT_FAIL(path, ": export metadata model.", key, " is ", it->dump(), ", not ", type);
  }
}

ResnetShape shape_from_json(const nlohmann::json& model, const std::string& path) {
  FT_REQUIRE(model.is_object(), path, ": export metadata 'model' is not a JSON object");
  {
    ResnetShape shape{field_of<int>(model, "resnet_blocks", "an integer", path),
                      field_of<int>(model, "resnet_width", "an integer", path)};
    shape.image_size = field_of<int>(model, "image_size", "an integer", path);
    shape.in_channels = field_of<int>(model, "in_channels", "an integer", path);
    shape.classes = field_of<int>(model, "classes", "an integer", path);
    shape.bn_eps = field_of<float>(model, "bn_eps", "a number", path);
    const std::string algorithm = field_of<std::string>(model, "conv_algorithm", "a string", path);
    FT_REQUIRE(conv_algorithm_from_name(algorithm, &shape.conv_algorithm), path,
               ": export metadata model.conv_algorithm is '", algorithm,
               "', not one of auto, onednn, measure");
    FT_REQUIRE(shape.blocks_per_stage >= 1 && shape.blocks_per_stage <= 64 && shape.width >= 1 &&
                   shape.width <= 1024 && shape.image_size >= 1 && shape.image_size <= 4096 &&
                   shape.in_channels >= 1 && shape.classes >= 2 && shape.bn_eps > 0,
               path, ": export metadata 'model' holds an impossible shape: ", model.dump());
    return shape;
  }
}

// The tensors an export of `graph` (built over `params`) holds, with their shapes, in op order.
std::vector<std::pair<std::string, Shape>> exported_layout(const Graph& graph,
                                                           const ParamStore& params) {
  std::vector<std::pair<std::string, Shape>> layout;
  for (const auto& op : graph.ops) {
    if (op->op_kind() == OpKind::kConvBias) {
      const auto& conv = static_cast<const ConvBiasOp&>(*op);
      const std::string prefix = conv_prefix(conv, params);
      layout.push_back({prefix + ".weight", conv.weight_shape()});
      layout.push_back({prefix + ".bias", {conv.spec().out_channels}});
      continue;
    }
    for (ParamId id : op->params) layout.push_back({params[id].name, params[id].shape});
  }
  return layout;
}

void export_resnet(const std::string& checkpoint_path, const SafetensorsFile& checkpoint,
                   const Config& config, SafetensorsFile* out, std::string* summary) {
  ResnetShape shape = resnet_shape(config.model);
  ParamStore params;
  const ResnetParamIds ids = register_resnet_params(shape, params);
  for (ParamId id = 0; id < params.size(); ++id)
    if (!params[id].trainable && checkpoint.tensors.count(params[id].name) == 0)
      FT_FAIL(checkpoint_path, ": checkpoint has no BatchNorm running statistics ('",
              params[id].name, "'); folding needs the running mean and variance");
  params.allocate();
  load_checkpoint_params(checkpoint_path, params);
  const Graph graph = build_folded_resnet_graph(shape, 1, ids, params);
  int folded = 0;
  for (const auto& op : graph.ops) {
    if (op->op_kind() == OpKind::kConvBias) {
      const auto& conv = static_cast<const ConvBiasOp&>(*op);
      const std::string prefix = conv_prefix(conv, params);
      SafetensorsEntry weight, bias;
      conv.folded(params, &weight.data, &bias.data);
      weight.shape = conv.weight_shape();
      bias.shape = {conv.spec().out_channels};
      out->tensors[prefix + ".weight"] = std::move(weight);
      out->tensors[prefix + ".bias"] = std::move(bias);
      ++folded;
      continue;
    }
    for (ParamId id : op->params) {
      const Param& param = params[id];
      out->tensors[param.name] = {
          param.shape,
          std::vector<float>(param.value.data(), param.value.data() + param.value.numel())};
    }
  }
  const ImageDataset train = ImageDataset::load_fashion_mnist(config.data.mnist_dir, true);
  const ChannelStats stats = fashion_mnist_train_stats(train);
  out->metadata["model"] = model_json(shape).dump();
  out->metadata["plan"] = plan_of(graph, params).dump();
  out->metadata["bn_eps"] = std::to_string(shape.bn_eps);
  out->metadata["image_mean"] = nlohmann::json(stats.mean).dump();
  out->metadata["image_std"] = nlohmann::json(stats.stddev).dump();
  *summary = std::to_string(folded) + " convolutions with BatchNorm folded in, " +
             std::to_string(out->tensors.size()) + " tensors";
}

void export_gpt(const std::string& checkpoint_path, const Config& config, SafetensorsFile* out,
                std::string* summary) {
  const GptShape shape = gpt_shape(config.model);
  ParamStore params;
  register_gpt_params(shape, params);
  params.allocate();
  load_checkpoint_params(checkpoint_path, params);
  for (ParamId id = 0; id < params.size(); ++id) {
    const Param& param = params[id];
    out->tensors[param.name] = {
        param.shape,
        std::vector<float>(param.value.data(), param.value.data() + param.value.numel())};
  }
  out->metadata["model"] =
      nlohmann::json{{"n_layer", shape.n_layer},       {"n_head", shape.n_head},
                     {"d_model", shape.d_model},       {"seq_len", shape.seq_len},
                     {"vocab_size", shape.vocab_size}, {"qk_norm", shape.qk_norm},
                     {"tied_lm_head", "wte.weight"}}
          .dump();
  out->metadata["plan"] = "[]";  // nothing folds in a GPT: its weights are the trained ones
  *summary = std::to_string(out->tensors.size()) + " tensors (no optimizer state)";
}

}  // namespace

FusionOptions inference_fusion_options() {
  FusionOptions options;
  options.fold_bn = true;
  return options;
}

Graph build_folded_resnet_graph(const ResnetShape& shape, int batch, const ResnetParamIds& ids,
                                const ParamStore& params, FusionResult* fusion, DType gemm_dtype) {
  Graph graph = build_resnet_graph(shape, batch, ids, GraphMode::kEval, gemm_dtype);
  FusionResult result = FusionPipeline::standard().run(graph, params, inference_fusion_options());
  for (const auto& op : graph.ops) {
    const OpKind kind = op->op_kind();
    if (kind != OpKind::kBatchNormInference && kind != OpKind::kBatchNormInferenceRelu) continue;
    std::string reasons;
    for (const FusionDecision& decision : result.decisions)
      if (decision.pass == "fold_bn" && !decision.fused)
        reasons += "; " + decision.site + ": " + decision.reason;
    FT_FAIL("BatchNorm '", op->name, "' could not be folded into a convolution", reasons);
  }
  if (fusion != nullptr) *fusion = std::move(result);
  return graph;
}

void export_model(const std::string& checkpoint_path, const Config& config,
                  const std::string& out_path, std::string* summary, DType dtype) {
  const SafetensorsFile checkpoint = load_safetensors(checkpoint_path);  // bounded, validated
  SafetensorsFile out;
  if (config.model.arch == "resnet")
    export_resnet(checkpoint_path, checkpoint, config, &out, summary);
  else
    export_gpt(checkpoint_path, config, &out, summary);
  // Rounded once, from the fp32 values (folded ones for a ResNet), as the file is written.
  for (auto& [name, tensor] : out.tensors) tensor.dtype = dtype;
  out.metadata["dtype"] = dtype_name(dtype);
  if (dtype == DType::kBF16) *summary += ", stored as bf16";
  out.metadata["format"] = kExportFormat;
  out.metadata["arch"] = config.model.arch;
  out.metadata["config"] = config_to_yaml(config);
  out.metadata["source_checkpoint"] = checkpoint_path;
  out.metadata["source_sha256"] = sha256_hex_of_file(checkpoint_path);
  save_safetensors(out_path, out);
}

DType export_dtype(const SafetensorsFile& file, const std::string& path) {
  auto entry = file.metadata.find("dtype");
  const std::string name = entry == file.metadata.end() ? "fp32" : entry->second;
  FT_REQUIRE(name == "fp32" || name == "bf16", path, ": export metadata dtype is '", name,
             "', not fp32 or bf16; export the model again");
  const DType dtype = name == "bf16" ? DType::kBF16 : DType::kF32;
  for (const auto& [tensor_name, tensor] : file.tensors)
    FT_REQUIRE(tensor.dtype == dtype, path, ": tensor '", tensor_name, "' is stored as ",
               dtype_name(tensor.dtype), ", but the export's metadata says dtype ", name,
               "; the export contradicts itself: export it again");
  return dtype;
}

ExportedResnet::ExportedResnet(const std::string& path, Device device, DType precision)
    : path_(path), precision_(precision) {
  SafetensorsFile file = load_safetensors(path);
  metadata_ = file.metadata;
  auto format = metadata_.find("format");
  FT_REQUIRE(format != metadata_.end() && format->second == kExportFormat, path,
             ": not a fusiontrain export (metadata 'format' should be '", kExportFormat,
             "'); make one with `fusiontrain export --checkpoint CKPT --out FILE`");
  const std::string& arch = metadata_entry(metadata_, "arch", path);
  FT_REQUIRE(arch == "resnet", path, ": is a ", arch,
             " export; infer runs ResNet exports (`fusiontrain sample --model FILE` generates "
             "text from a GPT export)");
  stored_dtype_ = export_dtype(file, path);
  shape_ = shape_from_json(metadata_json(metadata_, "model", path), path);
  const nlohmann::json mean = metadata_json(metadata_, "image_mean", path);
  const nlohmann::json stddev = metadata_json(metadata_, "image_std", path);
  FT_REQUIRE(mean.is_number() && std::isfinite(mean.get<double>()), path,
             ": export metadata image_mean is ", mean.dump(), ", not a finite number");
  // A denormal or tiny stddev would scale every pixel to infinity (and flushes to 0 on CPUs
  // that treat denormals as zero, as this process does).
  FT_REQUIRE(
      stddev.is_number() && std::isfinite(stddev.get<double>()) && stddev.get<double>() >= 1e-6,
      path, ": export metadata image_std is ", stddev.dump(),
      "; it must be a finite number >= 1e-06 (the pixel standard deviation the model "
      "was trained with); export the model again");
  stats_.mean = mean.get<float>();
  stats_.stddev = stddev.get<float>();

  layout_ids_ = register_resnet_params(shape_, layout_);
  // Before allocating the model the metadata describes: every convolution and the classifier
  // keep their weight's name and shape in an export, so a file that lacks them (metadata of a
  // huge model over a few bytes of tensors) is refused without allocating anything.
  for (ParamId id = 0; id < layout_.size(); ++id) {
    const Param& param = layout_[id];
    const bool exported = param.name.size() > 7 &&
                          param.name.compare(param.name.size() - 7, 7, ".weight") == 0 &&
                          param.shape.size() != 1;  // not a BatchNorm's scale
    if (!exported) continue;
    auto it = file.tensors.find(param.name);
    FT_REQUIRE(it != file.tensors.end(), path, ": export has no tensor '", param.name,
               "' for the model its metadata describes");
    FT_REQUIRE(it->second.shape == param.shape, path, ": tensor '", param.name, "' has shape ",
               shape_str(it->second.shape), ", expected ", shape_str(param.shape),
               " for the model its metadata describes");
  }
  layout_.allocate();
  const Graph graph = build_folded_resnet_graph(shape_, 1, layout_ids_, layout_);
  const nlohmann::json plan = plan_of(graph, layout_);
  const nlohmann::json file_plan = metadata_json(metadata_, "plan", path);
  FT_REQUIRE(file_plan.is_array(), path, ": export metadata 'plan' is not a JSON list");
  FT_REQUIRE(plan.size() == file_plan.size(), path, ": the export's plan folds ", file_plan.size(),
             " convolutions; this build folds ", plan.size());
  // Compared as JSON values: a field of another type differs, it does not throw.
  auto field = [](const nlohmann::json& entry, const char* key) {
    return entry.is_object() && entry.contains(key) ? entry.at(key) : nlohmann::json();
  };
  for (size_t i = 0; i < plan.size(); ++i)
    FT_REQUIRE(field(file_plan[i], "conv") == plan[i]["conv"] &&
                   field(file_plan[i], "residual") == plan[i]["residual"] &&
                   field(file_plan[i], "relu") == plan[i]["relu"],
               path, ": the export's plan entry ", file_plan[i].dump(),
               " differs from this build's ", plan[i].dump());

  const auto layout = exported_layout(graph, layout_);
  for (const auto& [name, shape] : layout) {
    auto it = file.tensors.find(name);
    FT_REQUIRE(it != file.tensors.end(), path, ": export has no tensor '", name, "'");
    FT_REQUIRE(it->second.shape == shape, path, ": tensor '", name, "' has shape ",
               shape_str(it->second.shape), ", expected ", shape_str(shape));
    tensors_.add(name, shape, ParamInit::kZeros, 0.0f, false);
  }
  FT_REQUIRE(file.tensors.size() == layout.size(), path, ": export holds ", file.tensors.size(),
             " tensors; a ResNet of this shape has ", layout.size());
  // bf16 GEMMs read the copies, which the executor casts before the first forward (the values
  // are marked changed below).
  if (precision == DType::kBF16) tensors_.enable_bf16_copies();
  tensors_.allocate(device);
  for (const auto& [name, shape] : layout) {
    std::vector<float>& data = file.tensors[name].data;
    // As a checkpoint's: a NaN or infinity would turn every logit into NaN without an error.
    for (size_t i = 0; i < data.size(); ++i)
      FT_REQUIRE(std::isfinite(data[i]), path, ": tensor '", name, "' holds a non-finite value (",
                 data[i], " at element ", i,
                 "); the export is unusable: export again from a finite checkpoint");
    tensors_[tensors_.find(name)].value.copy_from(Tensor::wrap(data.data(), shape));
  }
  tensors_.mark_changed();
}

ExportedResnet::Run& ExportedResnet::run(int batch) {
  auto it = runs_.find(batch);
  if (it != runs_.end()) return *it->second;
  auto run = std::make_unique<Run>();
  run->graph = build_folded_resnet_graph(shape_, batch, layout_ids_, layout_, nullptr, precision_);
  // Rewire every op from the layout's parameters onto the exported tensors: a folded convolution
  // becomes one that reads the export's weight and bias, with its name, values and eager ops.
  Graph& graph = run->graph;
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
    Op& op = *graph.ops[op_index];
    if (op.op_kind() == OpKind::kConvBias) {
      const auto& folded = static_cast<const ConvBiasOp&>(op);
      const std::string prefix = conv_prefix(folded, layout_);
      Fusion rebound = fusion_like(folded);
      rebound.absorbed = {op_index};
      rebound.op = std::make_unique<ConvBiasOp>(folded.spec(), ConvBiasSource::kFolded);
      rebound.params = {tensors_.find(prefix + ".weight"), tensors_.find(prefix + ".bias")};
      apply_fusion(graph, std::move(rebound));
      continue;
    }
    for (ParamId& id : op.params) id = tensors_.find(layout_[id].name);
  }
  validate(graph);
  run->executor = std::make_unique<Executor>(run->graph, tensors_);
  run->ws = run->executor->make_workspace();
  return *runs_.emplace(batch, std::move(run)).first->second;
}

}  // namespace ft
