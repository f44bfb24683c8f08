// The MPI side of bf16 allreduce: a 2-byte datatype and a commutative user reduction over it that
// widens both operands to fp32, adds, and rounds once to bf16 (round to nearest even). MPI applies
// it once per hop of whatever algorithm it picks, so a bf16 sum over n ranks rounds n - 1 times;
// with two ranks the result is exactly bf16(float(a) + float(b)) on both. Internal to comm/mpi.
// Thread safety: bf16_sum_into is pure; a Bf16Reduction is created and freed by one thread and
// only read (its handles passed to MPI) in between.
#pragma once
#include <mpi.h>

#include <cstddef>

#include "core/math/bf16_math.h"

namespace ft {

// inout[i] = bf16(float(in[i]) + float(inout[i])) for i < count: the reduction's arithmetic.
void bf16_sum_into(const bf16_bits* in, bf16_bits* inout, size_t count);

// Owns the committed datatype and the MPI_Op. REQUIRES: MPI is initialised while it is created.
class Bf16Reduction {
 public:
  Bf16Reduction();
  ~Bf16Reduction();  // frees both unless MPI is already finalised; never throws
  Bf16Reduction(const Bf16Reduction&) = delete;
  Bf16Reduction& operator=(const Bf16Reduction&) = delete;

  // Use them together: the op is only defined on this type.
  MPI_Datatype type() const { return type_; }
  MPI_Op sum() const { return sum_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op sum_ = MPI_OP_NULL;
};

}  // namespace ft
