// FoldAllreduce: a sum-allreduce whose result does not depend on message size. Every element
// becomes ((x_0 + x_1) + x_2) + ... in rank order, however the buffer is split into buckets,
// segments or chunks, so changing bucketing or fusion never changes a single bit of training.
// (MPI_Allreduce picks its algorithm, and so the order of additions, by message size: with three
// or more ranks, per-tensor and bucketed reductions then round differently.)
// Algorithm, per segment of at most kSegmentFloats: a reduce-scatter (rank r receives every rank's
// chunk r and folds it in rank order) then an allgather of the folded chunks, both as
// point-to-point messages; small messages instead send everything to everyone and fold locally,
// which yields the same bits. Each rank sends and receives 2(n-1)/n of the buffer, like a ring.
// Messages are tagged with the operation's sequence number, so several operations may be in
// flight and progress in any order (nonblocking collectives would have to be posted in the same
// order on every rank, which a test()-driven state machine cannot promise).
// T is float or bf16_bits (comm.grad_dtype: bf16). A bf16 element is folded in fp32 and rounded
// once at the end, so it too is independent of bucketing; with two ranks (one addition) that is
// the same bf16(float(a) + float(b)) as the MPI reduction of comm/mpi/bf16_reduction.h.
// Thread safety: one thread drives an instance; MPI calls follow the Communicator contract.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/math/bf16_math.h"

namespace ft {

template <typename T>
class FoldAllreduceOf {
 public:
  // Elements of T, named for the float case they were sized for.
  static constexpr size_t kSegmentFloats = size_t{1} << 22;  // 16 MiB of floats
  static constexpr size_t kSendAllFloats = 1 << 13;          // count * ranks up to this

  // `sequence` numbers the operations on `comm` in the order every rank starts them.
  // REQUIRES: nobody else touches `buffer` (count elements) until done; `comm` and `scratch`
  // outlive this; `scratch` is not used by another operation in flight (it is reused to save
  // allocations).
  FoldAllreduceOf(MPI_Comm comm, int64_t sequence, T* buffer, size_t count,
                  std::vector<T>* scratch);
  ~FoldAllreduceOf();  // cancels nothing: REQUIRES progress() returned true, or MPI is aborting
  FoldAllreduceOf(const FoldAllreduceOf&) = delete;
  FoldAllreduceOf& operator=(const FoldAllreduceOf&) = delete;

  // Advances the operation; returns true once `buffer` holds the sum. With block = true it only
  // returns when done. Throws ft::Error naming the MPI call that failed.
  bool progress(bool block);

 private:
  enum class Phase { kStart, kScatter, kGather, kDone };
  void post_scatter();
  void fold_and_post_gather();
  void post(T* data, size_t count, int peer, int tag, bool send);

  MPI_Comm comm_;
  int tag_base_ = 0;
  T* buffer_;
  size_t count_;
  std::vector<T>* scratch_;
  int rank_ = 0, ranks_ = 1;
  bool send_all_ = false;
  size_t segment_begin_ = 0, segment_count_ = 0;
  std::vector<size_t> chunk_begin_;  // by rank, ranks_ + 1 entries, within the segment
  std::vector<MPI_Request> requests_;
  Phase phase_ = Phase::kStart;
};

using FoldAllreduce = FoldAllreduceOf<float>;
using FoldAllreduceBf16 = FoldAllreduceOf<bf16_bits>;
extern template class FoldAllreduceOf<float>;
extern template class FoldAllreduceOf<bf16_bits>;

}  // namespace ft
