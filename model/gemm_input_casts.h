// The bf16 GEMM inputs of the eager graph builders (model/gpt.cpp, model/resnet.cpp): under
// train.precision bf16 a GEMM (linear, convolution, attention, fc) reads the output of a CastOp
// (model/ops/cast.h), one per fp32 value however many GEMMs read it (q, k and v share ln_1's);
// in fp32 it reads the value itself.
// Thread safety: belongs to one builder and its graph.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/graph.h"
#include "model/ops/cast.h"

namespace ft {

class GemmInputCasts {
 public:
  explicit GemmInputCasts(DType gemm_dtype) : gemm_dtype_(gemm_dtype) {}

  // x as a GEMM reads it: x in fp32; in bf16 the value "<x>.bf16", written by a CastOp appended
  // to `graph` the first time x is asked for. The cast of graph.input (the images) needs no
  // gradient, as the input itself.
  ValueId operator()(Graph& graph, ValueId x) {
    if (gemm_dtype_ == DType::kF32) return x;
    for (const auto& [fp32, bf16] : casts_)
      if (fp32 == x) return bf16;
    const Value& value = graph.values[x];
    const int64_t cols = value.shape.back();
    const std::string name = value.name + ".bf16";
    const ValueId y = graph.add_value(name, value.shape, DType::kBF16);
    graph.values[y].needs_grad = x != graph.input;
    graph.add_op<CastOp>(name, {x}, {y}, {}, shape_numel(value.shape) / cols, cols);
    casts_.emplace_back(x, y);
    return y;
  }

 private:
  DType gemm_dtype_;
  std::vector<std::pair<ValueId, ValueId>> casts_;  // fp32 value -> its bf16 cast
};

}  // namespace ft
