// Chunked passes over the flat parameter buffers (see multi_tensor.h). Chunks are independent,
// so a static schedule splits them over the threads; the elementwise kernels make the result
// independent of that split, and the norm's partials are combined in chunk order afterwards.
#include "fusion/multi_tensor.h"

#include <algorithm>

#include "core/check.h"
#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#endif

namespace ft {
namespace {

int64_t chunk_count(int64_t numel) {
  return (numel + kSweepChunk - 1) / kSweepChunk;
}

}  // namespace

MultiTensorPlan make_multi_tensor_plan(const ParamStore& params) {
  FT_CHECK(params.allocated(), "make_multi_tensor_plan: parameters are not allocated");
  // Flat ranges by flag, in offset order (registration order), adjacent equal flags merged.
  std::vector<MultiTensorSegment> ranges;
  for (ParamId id = 0; id < params.size(); ++id) {
    const Param& param = params[id];
    if (!param.trainable) continue;
    const int64_t begin = param.offset, end = param.offset + param.value.numel();
    if (!ranges.empty() && ranges.back().end == begin &&
        ranges.back().weight_decay == param.weight_decay)
      ranges.back().end = end;
    else
      ranges.push_back({begin, end, param.weight_decay});
  }
  std::sort(
      ranges.begin(), ranges.end(),
      [](const MultiTensorSegment& a, const MultiTensorSegment& b) { return a.begin < b.begin; });
  MultiTensorPlan plan;
  plan.numel = params.num_trainable_floats();
  const int64_t chunks = chunk_count(plan.numel);
  plan.chunk_segments.push_back(0);
  size_t range = 0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t chunk_begin = chunk * kSweepChunk;
    const int64_t chunk_end = std::min(plan.numel, chunk_begin + kSweepChunk);
    while (range < ranges.size() && ranges[range].end <= chunk_begin) ++range;
    for (size_t r = range; r < ranges.size() && ranges[r].begin < chunk_end; ++r)
      plan.segments.push_back({std::max(ranges[r].begin, chunk_begin),
                               std::min(ranges[r].end, chunk_end), ranges[r].weight_decay});
    plan.chunk_segments.push_back(static_cast<int>(plan.segments.size()));
  }
  return plan;
}

namespace {

// update(segment) for every segment of the plan, chunks in parallel.
template <typename Update>
void for_each_segment(const MultiTensorPlan& plan, const Update& update) {
  const int64_t chunks = plan.num_chunks();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int s = plan.chunk_segments[chunk]; s < plan.chunk_segments[chunk + 1]; ++s)
      update(plan.segments[s]);
}

}  // namespace

void multi_tensor_adamw(const MultiTensorPlan& plan, float* values, float* exp_avg,
                        float* exp_avg_sq, const float* grads, const AdamWStep& step,
                        bf16_bits* bf16_values) {
  for_each_segment(plan, [&](const MultiTensorSegment& segment) {
    const int64_t begin = segment.begin;
    // The bf16 copy as each value is updated, still in a register: one sweep instead of two.
    if (bf16_values != nullptr)
      adamw_update(values + begin, exp_avg + begin, exp_avg_sq + begin, grads + begin,
                   segment.end - begin, step, segment.weight_decay, bf16_values + begin);
    else
      adamw_update(values + begin, exp_avg + begin, exp_avg_sq + begin, grads + begin,
                   segment.end - begin, step, segment.weight_decay);
  });
}

void multi_tensor_sgd(const MultiTensorPlan& plan, float* values, float* momentum_buffer,
                      const float* grads, const SgdStep& step, bf16_bits* bf16_values) {
  for_each_segment(plan, [&](const MultiTensorSegment& segment) {
    const int64_t begin = segment.begin;
    if (bf16_values != nullptr)
      sgd_update(values + begin, momentum_buffer + begin, grads + begin, segment.end - begin, step,
                 segment.weight_decay, bf16_values + begin);
    else
      sgd_update(values + begin, momentum_buffer + begin, grads + begin, segment.end - begin, step,
                 segment.weight_decay);
  });
}

void multi_tensor_adamw_consuming(const MultiTensorPlan& plan, float* values, float* exp_avg,
                                  float* exp_avg_sq, float* grads, const AdamWStep& step,
                                  bf16_bits* bf16_values, float grad_scale) {
  for_each_segment(plan, [&](const MultiTensorSegment& segment) {
    const int64_t begin = segment.begin;
    adamw_update_consuming(values + begin, exp_avg + begin, exp_avg_sq + begin, grads + begin,
                           segment.end - begin, step, segment.weight_decay,
                           bf16_values == nullptr ? nullptr : bf16_values + begin, grad_scale);
  });
}

void multi_tensor_sgd_consuming(const MultiTensorPlan& plan, float* values, float* momentum_buffer,
                                float* grads, const SgdStep& step, bf16_bits* bf16_values) {
  for_each_segment(plan, [&](const MultiTensorSegment& segment) {
    const int64_t begin = segment.begin;
    sgd_update_consuming(values + begin, momentum_buffer + begin, grads + begin,
                         segment.end - begin, step, segment.weight_decay,
                         bf16_values == nullptr ? nullptr : bf16_values + begin);
  });
}

void multi_tensor_zero(float* data, int64_t numel) {
  const int64_t chunks = chunk_count(numel);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk;
    std::fill(data + begin, data + std::min(numel, begin + kSweepChunk), 0.0f);
  }
}

void multi_tensor_scale(float* data, int64_t numel, float scale) {
  const int64_t chunks = chunk_count(numel);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk, end = std::min(numel, begin + kSweepChunk);
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) data[i] *= scale;
  }
}

double multi_tensor_square_sum(const float* data, int64_t numel) {
  const int64_t chunks = chunk_count(numel);
  std::vector<NormLanes> chunk_lanes(chunks, NormLanes{});
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk;
    accumulate_squares(chunk_lanes[chunk], data + begin, begin,
                       std::min(numel, begin + kSweepChunk) - begin);
  }
  return sum_chunk_lanes(chunk_lanes);
}

MultiTensorSweep::MultiTensorSweep(const ParamStore& params)
    : plan_(make_multi_tensor_plan(params)) {
  // Segments are sorted: they cover [0, numel) when each starts where the last ended, from 0 to
  // numel.
  int64_t next = 0;
  bool abutting = true;
  for (const MultiTensorSegment& segment : plan_.segments) {
    abutting = abutting && segment.begin == next;
    next = segment.end;
  }
  segments_cover_all_ = abutting && next == plan_.numel;
}

void MultiTensorSweep::check_store(const ParamStore& params) const {
  FT_CHECK(params.num_trainable_floats() == plan_.numel, "MultiTensorSweep: planned for ",
           plan_.numel, " trainable floats, given a store with ", params.num_trainable_floats());
}

namespace {

void check_state(const ParamStore& params, const Tensor& state, const char* what) {
  FT_CHECK(state.device() == params.device() && state.numel() == params.num_trainable_floats(),
           "MultiTensorSweep: ", what, " must hold ", params.num_trainable_floats(), " floats on ",
           device_name(params.device()), "; it holds ", state.numel(), " on ",
           device_name(state.device()));
}

#if defined(FT_HAVE_CUDA)
CudaStream compute_stream() {
  return cuda_context().compute_stream();
}
#endif

}  // namespace

// One table entry per trainable parameter, in id order: a parameter's arrays start at its offset.
template <int Depth>
const std::vector<MultiTensorLaunch<Depth>>& MultiTensorSweep::packed(
    PackedPass<Depth>& pass, const ParamStore& params, const std::array<float*, Depth>& bases) {
  if (pass.bases == bases && !pass.launches.empty()) return pass.launches;
  std::vector<MultiTensorInput<Depth>> tensors;
  for (ParamId id = 0; id < params.size(); ++id) {
    const Param& param = params[id];
    if (!param.trainable) continue;
    MultiTensorInput<Depth> tensor;
    for (int d = 0; d < Depth; ++d) tensor.addresses[d] = bases[d] + param.offset;
    tensor.numel = param.value.numel();
    tensor.weight_decay = param.weight_decay;
    tensors.push_back(tensor);
  }
  pass.bases = bases;
  pass.launches = pack_multi_tensor_launches(tensors);
  return pass.launches;
}

bf16_bits* MultiTensorSweep::bf16_copies(ParamStore& params) {
  return params.has_bf16_copies() ? params.flat_bf16_values().bf16_data() : nullptr;
}

Bf16CopyTarget MultiTensorSweep::bf16_copy_target(ParamStore& params) {
  Bf16CopyTarget target;
  if (!params.has_bf16_copies()) return target;
  target.values_base = params.flat_values().data();
  target.copies = bf16_copies(params);
  return target;
}

void MultiTensorSweep::adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq,
                             const AdamWStep& step) {
  check_store(params);
  check_state(params, exp_avg, "exp_avg");
  check_state(params, exp_avg_sq, "exp_avg_sq");
#if defined(FT_HAVE_CUDA)
  if (params.device() == Device::kCuda)
    return multi_tensor_adamw_cuda(packed(adamw_pass_, params,
                                          {params.flat_values().data(), params.flat_grads().data(),
                                           exp_avg.data(), exp_avg_sq.data()}),
                                   step, device_control(), bf16_copy_target(params),
                                   compute_stream());
#endif
  if (fold_pending_) {
    fold_pending_ = false;
    return multi_tensor_adamw_consuming(plan_, params.flat_values().data(), exp_avg.data(),
                                        exp_avg_sq.data(), params.flat_grads().data(), step,
                                        bf16_copies(params), fold_scale_);
  }
  multi_tensor_adamw(plan_, params.flat_values().data(), exp_avg.data(), exp_avg_sq.data(),
                     params.flat_grads().data(), step, bf16_copies(params));
}

void MultiTensorSweep::sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step) {
  check_store(params);
  check_state(params, momentum_buffer, "momentum_buffer");
#if defined(FT_HAVE_CUDA)
  if (params.device() == Device::kCuda)
    return multi_tensor_sgd_cuda(
        packed(sgd_pass_, params,
               {params.flat_values().data(), params.flat_grads().data(), momentum_buffer.data()}),
        step, device_control(), bf16_copy_target(params), compute_stream());
#endif
  if (fold_pending_) {
    fold_pending_ = false;
    // SGD's g + decay * value would let the compiler contract grad * scale into an fma, which
    // the scaled gradient of the twin never sees: the scale keeps its own pass here.
    if (fold_scale_ != 1.0f)
      multi_tensor_scale(params.flat_grads().data(), plan_.numel, fold_scale_);
    return multi_tensor_sgd_consuming(plan_, params.flat_values().data(), momentum_buffer.data(),
                                      params.flat_grads().data(), step, bf16_copies(params));
  }
  multi_tensor_sgd(plan_, params.flat_values().data(), momentum_buffer.data(),
                   params.flat_grads().data(), step, bf16_copies(params));
}

bool MultiTensorSweep::fold_into_next_update(const ParamStore& params, float grad_scale) {
  check_store(params);
  if (params.device() != Device::kCpu || !segments_cover_all_) return false;
  fold_pending_ = true;
  fold_scale_ = grad_scale;
  return true;
}

double MultiTensorSweep::square_sum(ParamStore& params) {
  check_store(params);
#if defined(FT_HAVE_CUDA)
  if (params.device() == Device::kCuda) {
    const int64_t partial_count = square_sum_partials(params);
    if (partial_count == 0) return 0.0;
    double* partials = reinterpret_cast<double*>(norm_scratch_.data());
    return square_sum_total_cuda(partials + partial_count, partials, partial_count,
                                 compute_stream());
  }
#endif
  return multi_tensor_square_sum(params.flat_grads().data(), plan_.numel);
}

void MultiTensorSweep::square_sum_on_device(ParamStore& params, double* device_total) {
  check_store(params);
  FT_CHECK(params.device() == Device::kCuda, "square_sum_on_device on cpu parameters");
#if defined(FT_HAVE_CUDA)
  const int64_t partial_count = square_sum_partials(params);
  square_sum_total_on_device_cuda(device_total, reinterpret_cast<double*>(norm_scratch_.data()),
                                  partial_count, compute_stream());
#else
  static_cast<void>(device_total);
#endif
}

#if defined(FT_HAVE_CUDA)
int64_t MultiTensorSweep::square_sum_partials(ParamStore& params) {
  const auto& launches = packed(grad_pass_, params, {params.flat_grads().data()});
  const int64_t partial_count = multi_tensor_block_count(launches);
  // Doubles in a float tensor (cudaMalloc'd blocks are 256-byte aligned): partials, then total.
  // Grown before a CUDA graph captures the pass, never inside it (the graph keeps the address).
  if (norm_scratch_.numel() < 2 * (partial_count + 1))
    norm_scratch_ = Tensor::empty({2 * (partial_count + 1)}, Device::kCuda);
  if (partial_count > 0)
    multi_tensor_square_sum_partials_cuda(reinterpret_cast<double*>(norm_scratch_.data()), launches,
                                          compute_stream());
  return partial_count;
}
#endif

void MultiTensorSweep::scale(ParamStore& params, float scale) {
  check_store(params);
#if defined(FT_HAVE_CUDA)
  if (params.device() == Device::kCuda)
    return multi_tensor_scale_cuda(packed(grad_pass_, params, {params.flat_grads().data()}), scale,
                                   compute_stream());
#endif
  multi_tensor_scale(params.flat_grads().data(), plan_.numel, scale);
}

void MultiTensorSweep::zero(ParamStore& params) {
  check_store(params);
#if defined(FT_HAVE_CUDA)
  if (params.device() == Device::kCuda)
    return multi_tensor_zero_cuda(packed(grad_pass_, params, {params.flat_grads().data()}),
                                  compute_stream());
#endif
  multi_tensor_zero(params.flat_grads().data(), plan_.numel);
}

std::unique_ptr<ParamSweep> make_multi_tensor_sweep(const ParamStore& params) {
  return std::make_unique<MultiTensorSweep>(params);
}

}  // namespace ft
