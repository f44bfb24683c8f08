#include "comm/buckets.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"

namespace ft {

namespace {

constexpr double kBytesPerMiB = 1024.0 * 1024.0;

int64_t cap_floats(double mb) {
  return std::max<int64_t>(1, static_cast<int64_t>(mb * kBytesPerMiB / sizeof(float)));
}

}  // namespace

std::vector<ParamId> reverse_registration_order(const ParamStore& params) {
  std::vector<ParamId> order;
  for (ParamId id = params.size() - 1; id >= 0; --id) {
    if (params[id].trainable) order.push_back(id);
  }
  return order;
}

std::vector<ParamId> complete_order(const ParamStore& params, const std::vector<ParamId>& order) {
  std::vector<bool> seen(static_cast<size_t>(params.size()), false);
  std::vector<ParamId> result;
  for (ParamId id : order) {
    FT_CHECK(id >= 0 && id < params.size(), "ready order names param id ", id, " outside [0, ",
             params.size(), ")");
    FT_CHECK(params[id].trainable, "ready order names buffer '", params[id].name,
             "', which has no gradient");
    FT_CHECK(!seen[id], "ready order names param '", params[id].name, "' twice");
    seen[id] = true;
    result.push_back(id);
  }
  for (ParamId id : reverse_registration_order(params)) {
    if (!seen[id]) result.push_back(id);
  }
  return result;
}

namespace {

// Params gathered in ready order; [lo, hi) is the hull of their ranges in flat_grads.
struct OpenBucket {
  std::vector<ParamId> params;
  int64_t lo = 0, hi = 0, floats = 0;
};

// Appends `open` as one bucket when its params tile their hull; otherwise as its maximal
// contiguous runs (a hole's param went to an earlier bucket), ordered by when each run's last
// param becomes ready. Params inside a bucket keep their ready order.
void emit(const ParamStore& params, const OpenBucket& open, std::vector<Bucket>* buckets) {
  if (open.params.empty()) return;
  if (open.floats == open.hi - open.lo) {
    buckets->push_back(Bucket{open.lo, open.floats, open.params});
    return;
  }
  std::vector<ParamId> by_offset = open.params;
  std::sort(by_offset.begin(), by_offset.end(),
            [&](ParamId a, ParamId b) { return params[a].offset < params[b].offset; });
  std::vector<Bucket> runs;
  std::vector<int> run_of(static_cast<size_t>(params.size()), -1);
  for (ParamId id : by_offset) {
    const int64_t offset = params[id].offset;
    if (runs.empty() || runs.back().offset + runs.back().count != offset) {
      runs.push_back(Bucket{offset, 0, {}});
    }
    runs.back().count += shape_numel(params[id].shape);
    run_of[id] = static_cast<int>(runs.size()) - 1;
  }
  std::vector<int> finish_order;  // run indices, by the ready position of their last param
  for (auto it = open.params.rbegin(); it != open.params.rend(); ++it) {
    const int run = run_of[*it];
    if (std::find(finish_order.begin(), finish_order.end(), run) == finish_order.end()) {
      finish_order.insert(finish_order.begin(), run);
    }
  }
  for (ParamId id : open.params) runs[run_of[id]].params.push_back(id);
  for (int run : finish_order) buckets->push_back(std::move(runs[run]));
}

}  // namespace

std::vector<Bucket> assign_buckets(const ParamStore& params, const std::vector<ParamId>& order,
                                   double bucket_mb, double first_bucket_mb) {
  FT_CHECK(params.allocated(), "assign_buckets before ParamStore::allocate()");
  FT_CHECK(bucket_mb > 0, "bucket_mb must be > 0, got ", bucket_mb);
  FT_CHECK(first_bucket_mb > 0, "first_bucket_mb must be > 0, got ", first_bucket_mb);
  const std::vector<ParamId> full_order =
      complete_order(params, order.empty() ? reverse_registration_order(params) : order);

  std::vector<Bucket> buckets;
  OpenBucket open;
  int64_t cap = cap_floats(first_bucket_mb);
  for (ParamId id : full_order) {
    const int64_t begin = params[id].offset;
    const int64_t end = begin + shape_numel(params[id].shape);
    // The hull bounds what the bucket can grow to once its holes fill, so capping the hull
    // caps the bucket, and a param inside the hull (filling a hole) always fits.
    if (!open.params.empty() && std::max(open.hi, end) - std::min(open.lo, begin) > cap) {
      emit(params, open, &buckets);
      open = OpenBucket();
      cap = cap_floats(bucket_mb);
    }
    open.lo = open.params.empty() ? begin : std::min(open.lo, begin);
    open.hi = open.params.empty() ? end : std::max(open.hi, end);
    open.floats += end - begin;
    open.params.push_back(id);
  }
  emit(params, open, &buckets);
  return buckets;
}

std::vector<Bucket> single_param_buckets(const ParamStore& params,
                                         const std::vector<ParamId>& order) {
  FT_CHECK(params.allocated(), "single_param_buckets before ParamStore::allocate()");
  std::vector<Bucket> buckets;
  for (ParamId id :
       complete_order(params, order.empty() ? reverse_registration_order(params) : order)) {
    Bucket bucket;
    bucket.offset = params[id].offset;
    bucket.count = shape_numel(params[id].shape);
    bucket.params = {id};
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

std::string bucket_signature(const std::vector<Bucket>& buckets) {
  std::ostringstream out;
  for (const Bucket& bucket : buckets) {
    for (size_t i = 0; i < bucket.params.size(); ++i) out << (i ? "," : "") << bucket.params[i];
    out << ":" << bucket.offset << "+" << bucket.count << ";";
  }
  return out.str();
}

}  // namespace ft
