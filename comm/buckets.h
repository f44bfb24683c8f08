// Gradient buckets: the parameters of a model grouped, in the order their gradients become ready,
// into a few large contiguous slices of ParamStore::flat_grads, so data parallelism sends a few big
// allreduces instead of one per tensor, and a bucket can be reduced in place (zero-copy).
// Grads are laid out in registration order while backward announces ops in reverse but each op's
// params in registration order, so a bucket may be non-contiguous while it fills. Params are
// therefore packed while the hull of their ranges fits the cap; a hole is filled by a param that
// comes later. A bucket closed with a hole that can no longer fill (its param already sits in an
// earlier bucket; only with scrambled orders) is emitted as its contiguous runs instead, so every
// bucket is one range and no copy is ever needed.
// Thread safety: pure functions over a ParamStore that nobody mutates meanwhile.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"

namespace ft {

struct Bucket {
  int64_t offset = 0;           // floats into flat_grads
  int64_t count = 0;            // floats; the bucket is [offset, offset + count)
  std::vector<ParamId> params;  // in the order they were packed (the ready order)
};

// Params taken in `order` (every trainable param exactly once; an empty order means reverse
// registration order), packed greedily into buckets of <= bucket_mb MiB, the first bucket capped
// at first_bucket_mb. A parameter is never split: one larger than the cap gets a bucket of its own.
// Buckets come in launch order: each one completes (all its params ready) no later than the next.
// REQUIRES: first_bucket_mb <= bucket_mb for the caps to hold exactly (runs split off the first
// bucket keep its cap).
// REQUIRES: params allocated; bucket_mb > 0, first_bucket_mb > 0.
std::vector<Bucket> assign_buckets(const ParamStore& params, const std::vector<ParamId>& order,
                                   double bucket_mb, double first_bucket_mb);

// One bucket per parameter, in `order`: the unfused baseline.
std::vector<Bucket> single_param_buckets(const ParamStore& params,
                                         const std::vector<ParamId>& order);

// Trainable params in reverse registration order (the usual backward order).
std::vector<ParamId> reverse_registration_order(const ParamStore& params);

// `order` checked (ids in range, trainable, no duplicates), with every trainable param it misses
// appended in reverse registration order, so each gradient belongs to exactly one bucket.
std::vector<ParamId> complete_order(const ParamStore& params, const std::vector<ParamId>& order);

// "ids:offset+count;..." over all buckets: equal strings mean equal bucket layouts.
std::string bucket_signature(const std::vector<Bucket>& buckets);

}  // namespace ft
