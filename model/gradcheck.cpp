// Finite-difference gradient checker (see gradcheck.h).
#include "model/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"

namespace ft {
namespace {

struct CheckedTensor {
  std::string name;
  float* values;  // perturbed in place
  std::vector<float> analytic;
};

// The entry with the largest |analytic| (so a real signal is always checked) plus random others.
std::vector<int64_t> sample_entries(const std::vector<float>& analytic, int samples, Rng& rng) {
  const int64_t numel = static_cast<int64_t>(analytic.size());
  std::vector<int64_t> entries;
  if (numel <= samples) {
    for (int64_t i = 0; i < numel; ++i) entries.push_back(i);
    return entries;
  }
  int64_t largest = 0;
  for (int64_t i = 1; i < numel; ++i)
    if (std::fabs(analytic[i]) > std::fabs(analytic[largest])) largest = i;
  entries.push_back(largest);
  while (static_cast<int>(entries.size()) < samples)
    entries.push_back(static_cast<int64_t>(rng.below_u64(static_cast<uint64_t>(numel))));
  return entries;
}

}  // namespace

GradcheckReport gradcheck(Graph& graph, ParamStore& params, Workspace& ws,
                          const std::vector<ValueId>& input_values,
                          const GradcheckOptions& options) {
  FT_CHECK(options.eps > 0.0f && options.floor > 0.0f && options.samples_per_tensor > 0,
           "gradcheck: eps, floor and samples_per_tensor must be positive");
  for (ValueId id : input_values)
    for (const auto& op : graph.ops)
      FT_CHECK(std::find(op->outputs.begin(), op->outputs.end(), id) == op->outputs.end(),
               "gradcheck: value '", graph.values.at(id).name, "' is written by op '", op->name,
               "', so perturbing it has no effect");
  Executor executor(graph, params);
  params.zero_grads();
  executor.forward(ws);
  executor.backward(ws);

  std::vector<CheckedTensor> tensors;
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    if (!param.trainable) continue;
    const float* grad = param.grad.data();
    tensors.push_back(
        {param.name, param.value.data(), std::vector<float>(grad, grad + param.grad.numel())});
  }
  for (ValueId id : input_values) {
    const float* grad = ws.grads[id].data();
    tensors.push_back({graph.values[id].name, ws.values[id].data(),
                       std::vector<float>(grad, grad + ws.grads[id].numel())});
  }

  auto loss_at = [&](float* entry, float value) {
    *entry = value;
    executor.forward(ws);
    return static_cast<double>(executor.loss(ws));
  };
  GradcheckReport report;
  Rng rng(options.seed);
  for (CheckedTensor& tensor : tensors) {
    for (int64_t index : sample_entries(tensor.analytic, options.samples_per_tensor, rng)) {
      float* entry = tensor.values + index;
      const float original = *entry;
      // Five-point stencil: [8 (L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))] / 12h, exact through
      // fourth-order polynomials, so truncation is O(h^4) instead of the O(h^2) of a central
      // difference; the step h is the float-rounded one actually taken.
      const double near_plus = loss_at(entry, original + options.eps);
      const double near_minus = loss_at(entry, original - options.eps);
      const double far_plus = loss_at(entry, original + 2.0f * options.eps);
      const double far_minus = loss_at(entry, original - 2.0f * options.eps);
      *entry = original;
      const double h = (static_cast<double>(original + options.eps) -
                        static_cast<double>(original - options.eps)) /
                       2.0;
      const double numeric = (8.0 * (near_plus - near_minus) - (far_plus - far_minus)) / (12.0 * h);
      const double analytic = tensor.analytic[index];
      const double denominator =
          std::max({std::fabs(analytic), std::fabs(numeric), static_cast<double>(options.floor)});
      const float rel_error = static_cast<float>(std::fabs(analytic - numeric) / denominator);
      ++report.entries_checked;
      report.max_abs_grad = std::max(report.max_abs_grad, static_cast<float>(std::fabs(analytic)));
      if (report.worst.empty() || rel_error > report.max_rel_error) {
        report.max_rel_error = rel_error;
        std::ostringstream worst;
        worst << tensor.name << "[" << index << "]: analytic " << analytic << ", numeric "
              << numeric;
        report.worst = worst.str();
      }
    }
  }
  executor.forward(ws);
  return report;
}

WeightedSumLossOp::WeightedSumLossOp(int64_t numel, uint64_t seed) {
  FT_CHECK(numel > 0, "WeightedSumLossOp: non-positive numel ", numel);
  weights_ = Tensor::empty({numel});
  Rng rng(seed);
  for (int64_t i = 0; i < numel; ++i) weights_.data()[i] = rng.normal();
}

// A test op, so on cuda it copies through the host instead of having kernels: the sum is then
// the same double-precision loop on both devices, and device comparisons see only the op under
// test.
void WeightedSumLossOp::forward(Workspace& ws, ParamStore&) {
  const Tensor& x = ws.values[inputs.at(0)];
  FT_CHECK(x.numel() == weights_.numel(), "weighted_sum_loss '", name, "': input has ", x.numel(),
           " elements, expected ", weights_.numel());
  const std::vector<float> x_host = x.to_host_vector();
  double sum = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i)
    sum += static_cast<double>(x_host[i]) * weights_.data()[i];
  float loss = static_cast<float>(sum);
  ws.values[outputs.at(0)].copy_from(Tensor::wrap(&loss, {1}));
}

// loss = sum_i x_i w_i  =>  dx_i += dloss * w_i.
void WeightedSumLossOp::backward(Workspace& ws, ParamStore&) {
  Tensor& dx = ws.grads[inputs.at(0)];
  const float dloss = ws.grads[outputs.at(0)].to_host_vector()[0];
  std::vector<float> dx_host = dx.to_host_vector();
  for (int64_t i = 0; i < dx.numel(); ++i) dx_host[i] += dloss * weights_.data()[i];
  dx.copy_from(Tensor::wrap(dx_host.data(), dx.shape()));
}

ValueId add_weighted_sum_loss(Graph& graph, ValueId value, uint64_t seed) {
  const ValueId loss = graph.add_value("weighted_sum_loss", {1});
  graph.add_op<WeightedSumLossOp>("weighted_sum_loss", {value}, {loss}, {},
                                  shape_numel(graph.shape(value)), seed);
  graph.loss = loss;
  return loss;
}

float backward_accumulation_error(Op& op, Workspace& ws, ParamStore& params) {
  std::vector<Tensor*> grads;
  for (ValueId id : op.inputs) grads.push_back(&ws.grads[id]);
  for (ParamId id : op.params) grads.push_back(&params[id].grad);
  std::vector<std::vector<float>> before;
  float scale = 0.0f;
  for (Tensor* grad : grads) {
    before.emplace_back(grad->data(), grad->data() + grad->numel());
    for (float value : before.back()) scale = std::max(scale, std::fabs(value));
  }
  FT_CHECK(scale > 0.0f, "backward_accumulation_error: op '", op.name,
           "' has all-zero gradients; run the executor's backward first");
  op.backward(ws, params);
  float max_error = 0.0f;
  for (size_t t = 0; t < grads.size(); ++t)
    for (int64_t i = 0; i < grads[t]->numel(); ++i)
      max_error = std::max(max_error, std::fabs(grads[t]->data()[i] - 2.0f * before[t][i]));
  return max_error / scale;
}

}  // namespace ft
