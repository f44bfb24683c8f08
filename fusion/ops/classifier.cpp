// Fused classifier: per row block, the logits GEMM, then softmax, loss and dlogits over the block
// while its logits are in cache. The softmax subtracts the row maximum before exp and the loss is
// logsumexp - logit[target], as in model/ops/cross_entropy.cpp, so no logit can overflow and an
// underflowing target probability still gives a finite loss.
#include "fusion/ops/classifier.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/gemm.h"
#include "core/math/fast_exp.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// Below this many logits a block's softmax costs less than waking OpenMP's team.
constexpr int64_t kThreadedElements = 16384;

}  // namespace

float classifier_forward(float* logits, float* dlogits, GemmOperand x, GemmOperand wte,
                         const int32_t* targets, int64_t rows, int64_t channels, int64_t vocab,
                         int tile_rows) {
  check_class_targets("classifier", targets, rows, vocab);
  const float inv_rows = 1.0f / static_cast<float>(rows);
  double loss_sum = 0.0;
  for (int64_t first = 0; first < rows; first += tile_rows) {
    const int64_t block = std::min<int64_t>(tile_rows, rows - first);
    float* logit_block = logits + first * vocab;
    GemmArgs args;
    args.m = block;
    args.n = vocab;
    args.k = channels;
    args.transpose_b = true;  // wte is stored [V, C] = [N, K]
    gemm(logit_block, x.at(first * channels), wte, args);
    // loss = (1/R) sum_r [logsumexp(z_r) - z_r[t_r]]  =>  dz_r[c] = (p_r[c] - [c == t_r]) / R,
    // since d logsumexp(z)/dz[c] = softmax(z)[c]; p is written straight into dlogits.
#pragma omp parallel for reduction(+ : loss_sum) if (block * vocab >= kThreadedElements)
    for (int64_t row = 0; row < block; ++row) {
      const float* logit_row = logit_block + row * vocab;
      const float max_logit = row_max(logit_row, vocab);
      float sum = 0.0f;
      const int32_t target = targets[first + row];
      if (dlogits != nullptr) {
        float* dlogit_row = dlogits + (first + row) * vocab;
        for (int64_t c = 0; c < vocab; ++c) {
          dlogit_row[c] = fast_exp(logit_row[c] - max_logit);
          sum += dlogit_row[c];
        }
        const float scale = inv_rows / sum;
        for (int64_t c = 0; c < vocab; ++c) dlogit_row[c] *= scale;
        dlogit_row[target] -= inv_rows;
      } else {
        for (int64_t c = 0; c < vocab; ++c) sum += fast_exp(logit_row[c] - max_logit);
      }
      loss_sum += std::log(static_cast<double>(sum)) + max_logit - logit_row[target];
    }
  }
  return static_cast<float>(loss_sum / static_cast<double>(rows));
}

void classifier_backward(float* dx, bool overwrite_dx, float* dwte, float dloss,
                         const float* dlogits_fp32, GemmOperand x, GemmOperand wte, int64_t rows,
                         int64_t channels, int64_t vocab) {
  // bf16 GEMMs multiply a bf16 copy of dlogits, as the Linear family does (model/ops/linear.h).
  const GemmOperand dlogits =
      x.dtype == DType::kBF16 ? GemmOperand(bf16_gradient_copy(dlogits_fp32, rows, vocab, vocab))
                              : GemmOperand(dlogits_fp32);
  // logits = x wte^T  =>  dx = dlogits wte   ([rows, V] · [V, C])
  if (dx != nullptr) {
    GemmArgs args;
    args.m = rows;
    args.n = channels;
    args.k = vocab;
    args.alpha = dloss;  // 1 in every training step, so one cached primitive
    args.accumulate = !overwrite_dx;
    gemm(dx, dlogits, wte, args);
  }
  //                      dwte = dlogits^T x   ([V, rows] · [rows, C])
  GemmArgs args;
  args.m = vocab;
  args.n = channels;
  args.k = rows;
  args.transpose_a = true;  // dlogits stored [rows, V] = [K, M]
  args.alpha = dloss;
  args.accumulate = true;
  gemm(dwte, dlogits, x, args);
}

double classifier_logits_path_bytes(int64_t rows, int64_t vocab, bool fused, GraphMode mode) {
  const double tensor_bytes = 4.0 * static_cast<double>(rows) * static_cast<double>(vocab);
  const int tensors = mode == GraphMode::kTrain ? (fused ? 2 : 3) : (fused ? 1 : 2);
  return tensors * tensor_bytes;
}

ClassifierOp::ClassifierOp(int64_t rows, int64_t channels, int64_t vocab, int tile_rows,
                           ClassifierForward forward_kind)
    : rows_(rows),
      channels_(channels),
      vocab_(vocab),
      tile_rows_(static_cast<int>(std::min<int64_t>(tile_rows, rows))),
      forward_kind_(forward_kind) {
  FT_CHECK(rows > 0 && channels > 0 && vocab > 0, "ClassifierOp: non-positive shape rows=", rows,
           " channels=", channels, " vocab=", vocab);
  FT_CHECK(tile_rows > 0, "ClassifierOp: tile_rows ", tile_rows, " must be >= 1");
}

void ClassifierOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 2, 1);
  expect_numel(ws.values[inputs[0]], rows_ * channels_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * vocab_, *this, "output logits");
  expect_numel(ws.values[outputs[1]], 1, *this, "output loss");
  expect_numel(params[this->params[0]].value, vocab_ * channels_, *this, "wte");
  FT_CHECK(static_cast<int64_t>(ws.targets.size()) == rows_, kind(), " '", name,
           "': ", ws.targets.size(), " targets in the workspace, expected ", rows_);
}

// Before forward, so a replayed CUDA graph (which runs no host code in forward) is covered too.
void ClassifierOp::stage(Workspace& ws, ParamStore& params) {
  if (ws.device == Device::kCpu) return;  // the CPU kernel checks as it reads
  check_wiring(ws, params);
  check_class_targets("classifier", ws.targets.data(), rows_, vocab_);
}

void ClassifierOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  float* dlogits = nullptr;
  if (forward_kind_ == ClassifierForward::kLossAndDlogits) {
    if (dlogits_.numel() != rows_ * vocab_ || dlogits_.device() != ws.device)
      dlogits_ = Tensor::empty({rows_, vocab_}, ws.device);
    dlogits = dlogits_.data();
  }
  if (ws.device != Device::kCpu) {
    if (row_losses_.numel() != rows_ || row_losses_.device() != ws.device)
      row_losses_ = Tensor::empty({rows_}, ws.device);
  }
  const GemmOperand x = value_operand(ws.values[inputs[0]]);
  const GemmOperand wte = weight_operand(params[this->params[0]], 0, x.dtype);
  FT_RUN_ON_CUDA(
      ws, classifier_forward_cuda(ws.values[outputs[1]].data(), ws.values[outputs[0]].data(),
                                  dlogits, row_losses_.data(), x, wte, ws.device_targets(), rows_,
                                  channels_, vocab_, ws.stream));
  ws.values[outputs[1]].data()[0] =
      classifier_forward(ws.values[outputs[0]].data(), dlogits, x, wte, ws.targets.data(), rows_,
                         channels_, vocab_, tile_rows_);
}

void ClassifierOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_CHECK(forward_kind_ == ClassifierForward::kLossAndDlogits, kind(), " '", name,
           "': built for evaluation (loss only), which saves no dlogits for backward");
  FT_CHECK(dlogits_.numel() == rows_ * vocab_ && dlogits_.device() == ws.device, kind(), " '", name,
           "': backward before forward");
  Tensor& dx_value = ws.grads[inputs[0]];
  float* dx = dx_value.defined() && dx_value.numel() > 0 ? dx_value.data() : nullptr;
  const bool fresh = ws.grad_is_fresh(inputs[0]);
  float* dwte = params[this->params[0]].grad.data();
  const GemmOperand x = value_operand(ws.values[inputs[0]]);
  const GemmOperand wte = weight_operand(params[this->params[0]], 0, x.dtype);
  if (ws.device != Device::kCpu && x.dtype == DType::kBF16) {
    if (dlogits_bf16_.numel() != rows_ * vocab_ || dlogits_bf16_.device() != ws.device)
      dlogits_bf16_ = Tensor::empty({rows_, vocab_}, ws.device, DType::kBF16);
    FT_RUN_ON_CUDA(ws, classifier_backward_bf16_cuda(dx, fresh, dwte, dlogits_bf16_.bf16_data(),
                                                     ws.grads[outputs[1]].data(), dlogits_.data(),
                                                     static_cast<const bf16_bits*>(x.data),
                                                     static_cast<const bf16_bits*>(wte.data), rows_,
                                                     channels_, vocab_, ws.stream));
  }
  if (ws.device != Device::kCpu &&
      (scratch_.numel() != rows_ * channels_ || scratch_.device() != ws.device))
    scratch_ = Tensor::empty({rows_, channels_}, ws.device);
  FT_RUN_ON_CUDA(
      ws, classifier_backward_cuda(dx, fresh, dwte, scratch_.data(), ws.grads[outputs[1]].data(),
                                   dlogits_.data(), ws.values[inputs[0]].data(),
                                   params[this->params[0]].value.data(), rows_, channels_, vocab_,
                                   ws.stream));
  classifier_backward(dx, fresh, dwte, ws.grads[outputs[1]].data()[0], dlogits_.data(), x, wte,
                      rows_, channels_, vocab_);
}

// The LM head's GEMMs plus cross-entropy's softmax; the dlogits block is written in forward and
// is the op's saved state (in place of the eager chain's probabilities).
OpCost ClassifierOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * channels_ * vocab_;
  const double logits = static_cast<double>(rows_) * vocab_;
  const bool training = forward_kind_ == ClassifierForward::kLossAndDlogits;
  cost.forward_flops = 2 * macs + (training ? 7 : 4) * logits;
  cost.backward_flops = 4 * macs;
  cost.bytes_read += 4.0 * vocab_ * channels_ + 4.0 * rows_;  // wte, targets
  if (training) {
    cost.bytes_written += 4.0 * logits;
    cost.saved_bytes = 4.0 * logits;
  }
  return cost;
}

}  // namespace ft
