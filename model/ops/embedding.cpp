// Token + position embedding lookup. Backward scatters rows into the tables; repeated tokens add
// into the same wte row, so that scatter stays serial.
#include "model/ops/embedding.h"

#include "core/check.h"
#include "model/executor.h"
#include "model/ops/op_checks.h"

namespace ft {

void embedding_check_tokens(const int32_t* tokens, int64_t rows, int64_t vocab) {
  for (int64_t row = 0; row < rows; ++row)
    FT_CHECK(tokens[row] >= 0 && tokens[row] < vocab, "embedding: token ", tokens[row],
             " at position ", row, " is outside the vocabulary [0, ", vocab, ")");
}

void embedding_forward(float* x, const int32_t* tokens, const float* wte, const float* wpe,
                       int batch, int seq_len, int channels, int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(batch) * seq_len;
  embedding_check_tokens(tokens, rows, vocab);
  for (int64_t row = 0; row < rows; ++row) {
    const float* token_row = wte + static_cast<int64_t>(tokens[row]) * channels;
    const float* position_row = wpe + (row % seq_len) * channels;
    float* x_row = x + row * channels;
    for (int c = 0; c < channels; ++c) x_row[c] = token_row[c] + position_row[c];
  }
}

// x[b,t] = wte[tok[b,t]] + wpe[t] is a sum of two row lookups, so each table row receives the sum
// of dx over every (b, t) that looked it up.
void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch,
                        int seq_len, int channels) {
  const int64_t rows = static_cast<int64_t>(batch) * seq_len;
  for (int64_t row = 0; row < rows; ++row) {
    const float* dx_row = dx + row * channels;
    float* dtoken_row = dwte + static_cast<int64_t>(tokens[row]) * channels;
    float* dposition_row = dwpe + (row % seq_len) * channels;
    for (int c = 0; c < channels; ++c) {
      dtoken_row[c] += dx_row[c];
      dposition_row[c] += dx_row[c];
    }
  }
}

int64_t embedding_token_capacity(int64_t rows, int64_t vocab) {
  return rows < vocab ? rows : vocab;
}

// A counting sort by token: stable, so each token's rows stay ascending (the CPU scatter's order).
std::vector<int32_t> embedding_rows_by_token(const int32_t* tokens, int64_t rows, int64_t vocab) {
  const int64_t capacity = embedding_token_capacity(rows, vocab);
  std::vector<int32_t> count(static_cast<size_t>(vocab) + 1, 0);
  for (int64_t row = 0; row < rows; ++row) ++count[tokens[row] + 1];
  std::vector<int32_t> grouped(2 + 2 * static_cast<size_t>(capacity) + rows, 0);
  int32_t* ids = grouped.data() + 1;
  int32_t* starts = ids + capacity;
  int32_t* sorted_rows = starts + capacity + 1;
  int32_t used = 0;
  for (int64_t token = 0; token < vocab; ++token) {
    count[token + 1] += count[token];  // count[token] = first slot of token's rows
    if (count[token + 1] > count[token]) {
      ids[used] = static_cast<int32_t>(token);
      starts[used] = count[token];
      ++used;
    }
  }
  grouped[0] = used;
  starts[used] = static_cast<int32_t>(rows);
  for (int64_t row = 0; row < rows; ++row)
    sorted_rows[count[tokens[row]]++] = static_cast<int32_t>(row);
  return grouped;
}

EmbeddingOp::EmbeddingOp(int batch, int seq_len, int channels)
    : batch_(batch), seq_len_(seq_len), channels_(channels) {
  FT_CHECK(batch > 0 && seq_len > 0 && channels > 0,
           "EmbeddingOp: non-positive shape batch=", batch, " seq_len=", seq_len,
           " channels=", channels);
}

void EmbeddingOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 0, 1, 2);
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  FT_CHECK(static_cast<int64_t>(ws.tokens.size()) == rows, "embedding '", name,
           "': ", ws.tokens.size(), " tokens in the workspace, expected batch*seq_len = ", rows);
  expect_numel(ws.values[outputs[0]], rows * channels_, *this, "output x");
  const Tensor& wte = params[this->params[0]].value;
  FT_CHECK(wte.dim() == 2 && wte.size(1) == channels_, "embedding '", name, "': wte has shape ",
           shape_str(wte.shape()), ", expected [vocab, ", channels_, "]");
  expect_numel(params[this->params[1]].value, static_cast<int64_t>(seq_len_) * channels_, *this,
               "wpe");
}

void EmbeddingOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const Tensor& wte = params[this->params[0]].value;
  // On cuda stage() checked the tokens: a CUDA-graph replay runs no host code here.
  FT_RUN_ON_CUDA(ws, embedding_forward_cuda(ws.values[outputs[0]].data(), ws.device_tokens(),
                                            wte.data(), params[this->params[1]].value.data(),
                                            batch_, seq_len_, channels_, ws.stream));
  embedding_forward(ws.values[outputs[0]].data(), ws.tokens.data(), wte.data(),
                    params[this->params[1]].value.data(), batch_, seq_len_, channels_, wte.size(0));
}

void EmbeddingOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_RUN_ON_CUDA(ws, backward_cuda(ws, params));
  embedding_backward(params[this->params[0]].grad.data(), params[this->params[1]].grad.data(),
                     ws.grads[outputs[0]].data(), ws.tokens.data(), batch_, seq_len_, channels_);
}

#if defined(FT_HAVE_CUDA)
void EmbeddingOp::stage(Workspace& ws, ParamStore& params) {
  if (ws.device != Device::kCuda) return;
  check_wiring(ws, params);
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  const int64_t vocab = params[this->params[0]].value.size(0);
  embedding_check_tokens(ws.tokens.data(), rows, vocab);
  // Only backward reads the grouping; an eval graph has no gradient buffers and no backward.
  if (ws.grads[outputs[0]].numel() == 0) return;
  rows_by_token_ = embedding_rows_by_token(ws.tokens.data(), rows, vocab);
  const int64_t count = static_cast<int64_t>(rows_by_token_.size());
  if (rows_by_token_on_device_.numel() != count)
    rows_by_token_on_device_ = Tensor::empty({count}, Device::kCuda);
  upload_to_workspace(ws, rows_by_token_on_device_,
                      reinterpret_cast<const float*>(rows_by_token_.data()), count);
}

void EmbeddingOp::backward_cuda(Workspace& ws, ParamStore& params) {
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  const int64_t vocab = params[this->params[0]].value.size(0);
  FT_CHECK(rows_by_token_on_device_.numel() == 2 + 2 * embedding_token_capacity(rows, vocab) + rows,
           "embedding '", name, "': backward before its batch was staged");
  embedding_backward_cuda(params[this->params[0]].grad.data(), params[this->params[1]].grad.data(),
                          ws.grads[outputs[0]].data(),
                          reinterpret_cast<const int32_t*>(rows_by_token_on_device_.data()),
                          static_cast<int>(embedding_token_capacity(rows, vocab)), batch_, seq_len_,
                          channels_, ws.stream);
}
#else
void EmbeddingOp::stage(Workspace&, ParamStore&) {}
#endif  // defined(FT_HAVE_CUDA)

OpCost EmbeddingOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(batch_) * seq_len_ * channels_;
  cost.forward_flops = elements;       // wte row + wpe row
  cost.backward_flops = 2 * elements;  // scatter-add into dwte, sum over b into dwpe
  // The gathered wte rows, wpe and the token ids.
  cost.bytes_read += 4.0 * elements + 4.0 * seq_len_ * channels_ + 4.0 * batch_ * seq_len_;
  return cost;
}

}  // namespace ft
