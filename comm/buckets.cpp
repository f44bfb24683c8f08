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

std::vector<Bucket> assign_buckets(const ParamStore& params, const std::vector<ParamId>& order,
                                   double bucket_mb, double first_bucket_mb) {
  FT_CHECK(params.allocated(), "assign_buckets before ParamStore::allocate()");
  FT_CHECK(bucket_mb > 0, "bucket_mb must be > 0, got ", bucket_mb);
  FT_CHECK(first_bucket_mb > 0, "first_bucket_mb must be > 0, got ", first_bucket_mb);
  const std::vector<ParamId> full_order =
      complete_order(params, order.empty() ? reverse_registration_order(params) : order);

  std::vector<Bucket> buckets;
  Bucket open;
  int64_t cap = cap_floats(first_bucket_mb);
  auto close = [&] {
    if (open.params.empty()) return;
    buckets.push_back(std::move(open));
    open = Bucket();
    cap = cap_floats(bucket_mb);
  };
  for (ParamId id : full_order) {
    const int64_t offset = params[id].offset;
    const int64_t count = shape_numel(params[id].shape);
    if (!open.params.empty()) {
      const bool before = offset + count == open.offset;
      const bool after = open.offset + open.count == offset;
      if (!(before || after) || open.count + count > cap) close();
    }
    if (open.params.empty()) {
      open.offset = offset;
    } else if (offset < open.offset) {
      open.offset = offset;
    }
    open.count += count;
    open.params.push_back(id);
  }
  close();
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
