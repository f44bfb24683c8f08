#include "comm/mpi/bf16_reduction.h"

#include "comm/mpi/mpi_check.h"

namespace ft {

namespace {

// MPI_User_function: `length` elements of the Bf16Reduction type, one bf16 each.
void bf16_sum_function(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  bf16_sum_into(static_cast<const bf16_bits*>(in), static_cast<bf16_bits*>(inout),
                static_cast<size_t>(*length));
}

}  // namespace

void bf16_sum_into(const bf16_bits* in, bf16_bits* inout, size_t count) {
  // Vectorised: the scalar loop made a bf16 allreduce slower than fp32's of twice the bytes.
#pragma omp simd
  for (size_t i = 0; i < count; ++i)
    inout[i] = float_to_bf16(bf16_to_float(in[i]) + bf16_to_float(inout[i]));
}

Bf16Reduction::Bf16Reduction() {
  // A type of its own rather than MPI_UINT16_T, so a predefined MPI_SUM can never be applied to it
  // by mistake and add bit patterns as integers.
  FT_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(sizeof(bf16_bits)), MPI_BYTE, &type_));
  FT_MPI_CHECK(MPI_Type_commit(&type_));
  FT_MPI_CHECK(MPI_Op_create(&bf16_sum_function, /*commute=*/1, &sum_));
}

Bf16Reduction::~Bf16Reduction() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (sum_ != MPI_OP_NULL) MPI_Op_free(&sum_);
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

}  // namespace ft
