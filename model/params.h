// ParamStore: every parameter and buffer of a model, under its canonical name. Trainable values
// live in one flat buffer and their gradients in another (registration order), so comm/ can reduce
// gradients in contiguous bucket slices and the optimizer can sweep them as one array.
// Buffers (BatchNorm running statistics) live apart: saved in checkpoints, never reduced.
// Thread safety: not synchronised; the training thread owns it.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace ft {

using ParamId = int;

enum class ParamInit { kNormal, kOnes, kZeros };

struct Param {
  std::string name;
  Shape shape;
  ParamInit init = ParamInit::kZeros;
  float init_std = 0.0f;     // for kNormal
  bool weight_decay = true;  // false for biases and normalisation weights
  bool trainable = true;     // false for buffers: no gradient, not reduced
  int64_t offset = 0;        // floats into the flat value (and grad) buffer of its kind
  Tensor value;
  Tensor grad;  // undefined for buffers
  // The bf16 copy of a trainable value that bf16 GEMMs read (ParamStore::enable_bf16_copies);
  // undefined otherwise. Never saved: checkpoints hold the fp32 masters only.
  Tensor bf16_value;
};

class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // REQUIRES: before allocate(); names are unique.
  ParamId add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
              bool weight_decay);
  ParamId add_buffer(const std::string& name, const Shape& shape, ParamInit init);

  // Lays out the flat buffers on `device`; views in Param::value/grad are valid afterwards.
  void allocate(Device device = Device::kCpu);
  // train.precision: bf16. Adds a flat bf16 copy of every trainable value (Param::bf16_value) for
  // the bf16 GEMMs to read, on the store's device. REQUIRES: before allocate().
  void enable_bf16_copies();
  bool has_bf16_copies() const { return bf16_copies_; }
  Tensor& flat_bf16_values() { return flat_bf16_values_; }
  // The copies are stale once a value changed (mark_changed) until refresh_bf16_copies() casts
  // every trainable value again (the unfused twin: a separate sweep after the optimizer; on cuda
  // a cast kernel enqueued on the compute stream), or a sweep that wrote them as it updated the
  // masters (fusion.horizontal.multi_tensor) calls mark_bf16_copies_fresh().
  bool bf16_copies_stale() const { return bf16_copies_ && bf16_stale_; }
  void refresh_bf16_copies();
  void mark_bf16_copies_fresh() { bf16_stale_ = false; }
  Device device() const { return device_; }
  // Deterministic initialisation from `seed`, in registration order. On cuda the values are drawn
  // on the host and copied, so both devices start from the same bits.
  void initialize(uint64_t seed);
  // Zeroes every trainable gradient, tensor by tensor (the per-tensor ParamSweep's zero; see
  // model/optimizer.h).
  void zero_grads();

  int size() const { return static_cast<int>(params_.size()); }
  Param& operator[](ParamId id) { return params_[id]; }
  const Param& operator[](ParamId id) const { return params_[id]; }
  // -1 when absent.
  ParamId find(const std::string& name) const;
  bool allocated() const { return allocated_; }

  Tensor& flat_values() { return flat_values_; }  // trainable values, [num_trainable_floats]
  Tensor& flat_grads() { return flat_grads_; }    // their gradients, same layout
  Tensor& flat_buffers() { return flat_buffers_; }
  int64_t num_trainable_floats() const { return flat_values_.numel(); }

  // A counter that changes whenever parameter or buffer values may have changed, so that values
  // derived from them (BN folded into a convolution's weights, fusion/ops/folded_conv.h) are
  // recomputed only when needed. initialize(), Optimizer::step, a train graph's forward (BatchNorm
  // running statistics), checkpoint loading and the start-up broadcast call mark_changed().
  // REQUIRES: any other code that writes values calls mark_changed() before the next forward.
  uint64_t version() const { return version_; }
  void mark_changed() {
    ++version_;
    bf16_stale_ = true;
  }
  // Only buffers changed (a train forward's BatchNorm running statistics): the bf16 copies of the
  // trainable values stay valid.
  void mark_buffers_changed() { ++version_; }

 private:
  ParamId add_entry(Param param);

  std::vector<Param> params_;
  std::unordered_map<std::string, ParamId> index_;
  Tensor flat_values_, flat_grads_, flat_buffers_;
  Tensor flat_bf16_values_;
  bool bf16_copies_ = false;
  bool bf16_stale_ = true;
  bool allocated_ = false;
  Device device_ = Device::kCpu;
  uint64_t version_ = 0;
};

}  // namespace ft
