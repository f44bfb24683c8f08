#include "comm/mpi/fold_allreduce.h"

#include <algorithm>

#include "comm/mpi/mpi_check.h"
#include "core/check.h"

namespace ft {

namespace {

// out = ((parts[0] + parts[1]) + parts[2]) + ..., parts laid out `stride` floats apart.
void fold_in_rank_order(float* out, const float* parts, size_t length, size_t stride, int ranks) {
  std::copy_n(parts, length, out);
  for (int r = 1; r < ranks; ++r) {
    const float* part = parts + static_cast<size_t>(r) * stride;
    for (size_t i = 0; i < length; ++i) out[i] += part[i];
  }
}

// The same order in fp32, rounded to bf16 once per element.
void fold_in_rank_order(bf16_bits* out, const bf16_bits* parts, size_t length, size_t stride,
                        int ranks) {
  for (size_t i = 0; i < length; ++i) {
    float sum = bf16_to_float(parts[i]);
    for (int r = 1; r < ranks; ++r)
      sum += bf16_to_float(parts[static_cast<size_t>(r) * stride + i]);
    out[i] = float_to_bf16(sum);
  }
}

MPI_Datatype mpi_type(const float*) {
  return MPI_FLOAT;
}
// Point-to-point only moves the bits; no MPI reduction is ever applied to them.
MPI_Datatype mpi_type(const bf16_bits*) {
  return MPI_UINT16_T;
}

// Two tags per operation (scatter, gather), cycling below the guaranteed MPI_TAG_UB of 32767.
constexpr int64_t kTagCycle = 16000;

}  // namespace

template <typename T>
FoldAllreduceOf<T>::FoldAllreduceOf(MPI_Comm comm, int64_t sequence, T* buffer, size_t count,
                                    std::vector<T>* scratch)
    : comm_(comm),
      tag_base_(static_cast<int>(sequence % kTagCycle) * 2),
      buffer_(buffer),
      count_(count),
      scratch_(scratch) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &ranks_);
  send_all_ = count * static_cast<size_t>(ranks_) <= kSendAllFloats;
  chunk_begin_.resize(ranks_ + 1);
  if (count == 0 || ranks_ == 1) phase_ = Phase::kDone;
}

template <typename T>
FoldAllreduceOf<T>::~FoldAllreduceOf() = default;

template <typename T>
void FoldAllreduceOf<T>::post(T* data, size_t count, int peer, int tag, bool send) {
  requests_.emplace_back();
  const int length = static_cast<int>(count);  // <= kSegmentFloats
  if (send) {
    FT_MPI_CHECK(MPI_Isend(data, length, mpi_type(data), peer, tag, comm_, &requests_.back()));
  } else {
    FT_MPI_CHECK(MPI_Irecv(data, length, mpi_type(data), peer, tag, comm_, &requests_.back()));
  }
}

template <typename T>
void FoldAllreduceOf<T>::post_scatter() {
  segment_count_ = std::min(kSegmentFloats, count_ - segment_begin_);
  T* segment = buffer_ + segment_begin_;
  // Chunk r is [chunk_begin_[r], chunk_begin_[r + 1]); rank r folds it. Sending everything is the
  // case of one chunk that every rank folds.
  for (int r = 0; r <= ranks_; ++r) {
    chunk_begin_[r] = send_all_ ? (r == 0 ? 0 : segment_count_) : segment_count_ * r / ranks_;
  }
  const size_t mine_begin = send_all_ ? 0 : chunk_begin_[rank_];
  const size_t mine = send_all_ ? segment_count_ : chunk_begin_[rank_ + 1] - mine_begin;
  scratch_->resize(mine * ranks_);
  requests_.clear();
  for (int peer = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const size_t begin = send_all_ ? 0 : chunk_begin_[peer];
    const size_t length = send_all_ ? segment_count_ : chunk_begin_[peer + 1] - begin;
    post(scratch_->data() + peer * mine, mine, peer, tag_base_, false);
    post(segment + begin, length, peer, tag_base_, true);
  }
  std::copy_n(segment + mine_begin, mine, scratch_->data() + rank_ * mine);
  phase_ = Phase::kScatter;
}

template <typename T>
void FoldAllreduceOf<T>::fold_and_post_gather() {
  T* segment = buffer_ + segment_begin_;
  const size_t mine_begin = send_all_ ? 0 : chunk_begin_[rank_];
  const size_t mine = send_all_ ? segment_count_ : chunk_begin_[rank_ + 1] - mine_begin;
  fold_in_rank_order(segment + mine_begin, scratch_->data(), mine, mine, ranks_);
  requests_.clear();
  if (!send_all_) {
    for (int peer = 0; peer < ranks_; ++peer) {
      if (peer == rank_) continue;
      const size_t begin = chunk_begin_[peer];
      post(segment + begin, chunk_begin_[peer + 1] - begin, peer, tag_base_ + 1, false);
      post(segment + mine_begin, mine, peer, tag_base_ + 1, true);
    }
  }
  phase_ = Phase::kGather;
}

template <typename T>
bool FoldAllreduceOf<T>::progress(bool block) {
  while (phase_ != Phase::kDone) {
    if (phase_ == Phase::kStart) {
      post_scatter();
      continue;
    }
    const int pending = static_cast<int>(requests_.size());
    if (block) {
      FT_MPI_CHECK(MPI_Waitall(pending, requests_.data(), MPI_STATUSES_IGNORE));
    } else {
      int complete = 0;
      FT_MPI_CHECK(MPI_Testall(pending, requests_.data(), &complete, MPI_STATUSES_IGNORE));
      if (!complete) return false;
    }
    if (phase_ == Phase::kScatter) {
      fold_and_post_gather();
    } else {  // kGather: this segment is final everywhere it is needed
      segment_begin_ += segment_count_;
      phase_ = segment_begin_ < count_ ? Phase::kStart : Phase::kDone;
    }
  }
  return true;
}

template class FoldAllreduceOf<float>;
template class FoldAllreduceOf<bf16_bits>;

}  // namespace ft
