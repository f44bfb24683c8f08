// Gradient buckets: the parameters of a model grouped, in the order their gradients become ready,
// into a few large contiguous slices of ParamStore::flat_grads, so data parallelism sends a few big
// allreduces instead of one per tensor. Every bucket is a contiguous range: a parameter joins the
// open bucket only if it sits right next to it in the flat buffer (either side). With the default
// order (reverse registration, what backward produces) that never splits anything; a scrambled
// order gives more, smaller buckets instead of a copy, so zero-copy views always work.
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
// A bucket is also closed when the next param is not adjacent to it in flat_grads (see above).
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
