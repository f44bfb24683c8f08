// Checks and wording shared by the fusion passes (fusion/*_pass.cpp): the sole-reader test of an
// intermediate, the max_ops limit and the tile_kb budget, each recording the reason a candidate
// is skipped so that `plan` prints the same words for the same refusal in every pass.
// Thread safety: stateless.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fusion/pass.h"
#include "model/graph_edit.h"

namespace ft {

// The op reading `id` when it is the only reader, through no view, and `id` is no graph result;
// else -1 with the reason in `why`, which names the value as `named` when it is a graph result
// ("output 'y'") and as `counted` otherwise ("output has 2 consumers").
inline int sole_reader(const GraphIndex& index, ValueId id, const std::string& named,
                       const std::string& counted, std::string* why) {
  if (index.is_graph_result(id)) {
    *why = named + " is a graph result";
    return -1;
  }
  const int readers = index.reader_count_with_views(id);
  if (readers != 1) {
    *why = counted + " has " + std::to_string(readers) + " consumers";
    return -1;
  }
  if (index.consumers(id).size() != 1) {
    *why = counted + " is read through a view";
    return -1;
  }
  return index.consumers(id)[0];
}

// What a chain of `eager_ops` eager ops, `eager_casts` of them casts, counts against
// fusion.max_ops: its ops less its casts, as absorbing train.precision bf16's cast changes how
// its producer stores a value, not what it computes (so bf16 fuses the chains fp32 fuses), and at
// least 2, as any fusion makes two ops one (so max_ops 1 still fuses nothing).
inline int counted_ops(int eager_ops, int eager_casts) {
  return std::max(2, eager_ops - eager_casts);
}

// False, with the skip recorded, when a fusion absorbing `chain_ops` eager ops exceeds max_ops.
inline bool within_max_ops(PassContext& context, const char* pass, const std::string& site,
                           int chain_ops) {
  if (context.options.max_ops >= chain_ops) return true;
  context.skipped(pass, site, "max_ops " + std::to_string(context.options.max_ops));
  return false;
}

// Rows of `row_floats` floats that fit fusion.tile_kb; 0 when not even one does.
inline int64_t rows_per_tile(int tile_kb, int64_t row_floats) {
  return static_cast<int64_t>(tile_kb) * 1024 / (4 * row_floats);
}

// The skip reason when one row of `row_floats` floats exceeds tile_kb: "row of 2 KiB exceeds
// tile_kb 1" (sizes in KiB as %g: 1536 bytes print as 1.5).
inline std::string row_exceeds_tile(int tile_kb, int64_t row_floats) {
  char kib[32];
  std::snprintf(kib, sizeof(kib), "%g", static_cast<double>(4 * row_floats) / 1024.0);
  return "row of " + std::string(kib) + " KiB exceeds tile_kb " + std::to_string(tile_kb);
}

}  // namespace ft
