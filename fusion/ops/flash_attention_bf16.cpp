// The drivers of FlashAttentionOp's bf16 tile kernels (see flash_attention_bf16.h): the run-time
// choice and the OpenMP loop over (b, h), compiled for the build's own target so that their
// library code (std::vector) stays runnable on any CPU the build supports.
#include "fusion/ops/flash_attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/gemm.h"

namespace ft {

bool flash_attention_bf16_native() {
#if FT_FLASH_ATTENTION_BF16
  return avx512_bf16_kernels_run();
#else
  return false;
#endif
}

namespace attention_bf16 {

HeadGeometry head_geometry(int seq_len, int channels, int n_head, int tile) {
  HeadGeometry g;
  g.seq_len = seq_len;
  g.hd = channels / n_head;
  g.width = (g.hd + 15) / 16 * 16;
  // Even, so every tile starts on a row pair (one tile may then reach one row past seq_len).
  g.tile_rows = (std::min<int64_t>(tile, seq_len) + 1) / 2 * 2;
  g.ld = (g.tile_rows + 31) / 32 * 32;
  // A key tile at j0 reads up to 15 columns past the head's last key (whole vectors).
  g.head_ld = (g.seq_len + 15) / 16 * 16 + 16;
  g.scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  return g;
}

}  // namespace attention_bf16

#if FT_FLASH_ATTENTION_BF16
namespace {

// The calling thread's scratch for the tile kernels, kept for the thread's life and grown to the
// largest shape seen: a fresh ~0.4 MB buffer per call (gpt_small) cost its zeroing and page
// faults every step.
unsigned char* thread_scratch(const attention_bf16::HeadGeometry& geometry) {
  static thread_local std::vector<unsigned char> scratch;
  const size_t bytes = static_cast<size_t>(attention_bf16::scratch_bytes(geometry));
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch.data();
}

// Asks for a head's rows in L2 before its turn: each row of a head is its own line or two, a
// whole activation row apart, and the packing loops that read them first stalled on every one
// (~10% of the kernels' time at gpt_small). A head's work (~100 us) hides the fetch.
template <typename Element>
void prefetch_rows(const Element* rows, int64_t stride, int64_t count, int64_t hd) {
  const int64_t bytes = hd * static_cast<int64_t>(sizeof(Element));
  for (int64_t t = 0; t < count; ++t) {
    const char* row = reinterpret_cast<const char*>(rows + t * stride);
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at, 0, 2);
  }
}

// Where head bh = b * n_head + h starts in each strided [B * T, C] tensor.
struct HeadOffsets {
  int64_t q, k, v, y;
};
HeadOffsets head_offsets(int64_t bh, int n_head, int64_t T, int64_t hd,
                         const AttentionStrides& strides) {
  const int64_t b = bh / n_head, h = bh % n_head;
  return {b * T * strides.q + h * hd, b * T * strides.k + h * hd, b * T * strides.v + h * hd,
          b * T * strides.y + h * hd};
}

// The q, k and v rows of the head at `next`: what forward and backward both read first.
void prefetch_qkv(const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                  const HeadOffsets& next, const AttentionStrides& strides, int64_t T, int64_t hd) {
  prefetch_rows(q + next.q, strides.q, T, hd);
  prefetch_rows(k + next.k, strides.k, T, hd);
  prefetch_rows(v + next.v, strides.v, T, hd);
}

void require_native(const char* what) {
  FT_CHECK(flash_attention_bf16_native(), what,
           ": the AVX512-BF16 kernels do not run here (check flash_attention_bf16_native())");
}

// Calls head(bh, at, next, geometry, scratch) for every head bh = b * n_head + h, spread over the
// OpenMP threads, each with its own scratch; `next` is the following head's offsets (null for
// the last), whose rows `head` asks for ahead of its turn.
template <typename Head>
void for_each_head(const char* what, const AttentionStrides& strides, int batch, int seq_len,
                   int channels, int n_head, int tile, Head head) {
  require_native(what);
  FT_CHECK(tile >= 1, what, ": tile ", tile, " must be at least 1");
  const attention_bf16::HeadGeometry g =
      attention_bf16::head_geometry(seq_len, channels, n_head, tile);
  const int64_t heads = static_cast<int64_t>(batch) * n_head;
#pragma omp parallel if (heads > 1)
  {
    unsigned char* scratch = thread_scratch(g);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const HeadOffsets at = head_offsets(bh, n_head, seq_len, g.hd, strides);
      const HeadOffsets next = head_offsets(bh + 1, n_head, seq_len, g.hd, strides);
      head(bh, at, bh + 1 < heads ? &next : nullptr, g, scratch);
    }
  }
}

// The drivers for either y: fp32, or bf16 (fusion.vertical.cast).
template <typename Y>
void forward_heads(Y* y, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                   const AttentionStrides& strides, int batch, int seq_len, int channels,
                   int n_head, int tile) {
  const int64_t T = seq_len;
  for_each_head("flash_attention_forward_bf16", strides, batch, seq_len, channels, n_head, tile,
                [&](int64_t bh, const HeadOffsets& at, const HeadOffsets* next,
                    const attention_bf16::HeadGeometry& g, unsigned char* scratch) {
                  if (next != nullptr) prefetch_qkv(q, k, v, *next, strides, T, g.hd);
                  attention_bf16::forward_head(y + at.y, lse + bh * T, q + at.q, k + at.k, v + at.v,
                                               strides, g, scratch);
                });
}

template <typename Y>
void backward_heads(float* dq, float* dk, float* dv, const float* dy, const Y* y, const float* lse,
                    const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                    const AttentionStrides& strides, int batch, int seq_len, int channels,
                    int n_head, int tile, const AttentionGradWrites& writes) {
  const int64_t T = seq_len;
  for_each_head("flash_attention_backward_bf16", strides, batch, seq_len, channels, n_head, tile,
                [&](int64_t bh, const HeadOffsets& at, const HeadOffsets* next,
                    const attention_bf16::HeadGeometry& g, unsigned char* scratch) {
                  if (next != nullptr) {
                    prefetch_qkv(q, k, v, *next, strides, T, g.hd);
                    prefetch_rows(dy + next->y, strides.y, T, g.hd);
                    prefetch_rows(y + next->y, strides.y, T, g.hd);
                    // Only the gradients backward adds into: it streams those it overwrites past
                    // the caches.
                    if (!writes.dq) prefetch_rows(dq + next->q, strides.q, T, g.hd);
                    if (!writes.dk) prefetch_rows(dk + next->k, strides.k, T, g.hd);
                    if (!writes.dv) prefetch_rows(dv + next->v, strides.v, T, g.hd);
                  }
                  attention_bf16::backward_head(dq + at.q, dk + at.k, dv + at.v, dy + at.y,
                                                y + at.y, lse + bh * T, q + at.q, k + at.k,
                                                v + at.v, strides, g, writes, scratch);
                });
}

}  // namespace

void flash_attention_forward_bf16(float* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                                  const bf16_bits* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, int tile) {
  forward_heads(y, lse, q, k, v, strides, batch, seq_len, channels, n_head, tile);
}
void flash_attention_forward_bf16(bf16_bits* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                                  const bf16_bits* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, int tile) {
  forward_heads(y, lse, q, k, v, strides, batch, seq_len, channels, n_head, tile);
}

void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy, const float* y,
                                   const float* lse, const bf16_bits* q, const bf16_bits* k,
                                   const bf16_bits* v, const AttentionStrides& strides, int batch,
                                   int seq_len, int channels, int n_head, int tile,
                                   const AttentionGradWrites& writes) {
  backward_heads(dq, dk, dv, dy, y, lse, q, k, v, strides, batch, seq_len, channels, n_head, tile,
                 writes);
}
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy,
                                   const bf16_bits* y, const float* lse, const bf16_bits* q,
                                   const bf16_bits* k, const bf16_bits* v,
                                   const AttentionStrides& strides, int batch, int seq_len,
                                   int channels, int n_head, int tile,
                                   const AttentionGradWrites& writes) {
  backward_heads(dq, dk, dv, dy, y, lse, q, k, v, strides, batch, seq_len, channels, n_head, tile,
                 writes);
}
#else
void flash_attention_forward_bf16(float*, float*, const bf16_bits*, const bf16_bits*,
                                  const bf16_bits*, const AttentionStrides&, int, int, int, int,
                                  int) {
  FT_CHECK(false, "flash_attention_forward_bf16: this build has no AVX512-BF16 kernels");
}
void flash_attention_backward_bf16(float*, float*, float*, const float*, const float*, const float*,
                                   const bf16_bits*, const bf16_bits*, const bf16_bits*,
                                   const AttentionStrides&, int, int, int, int, int,
                                   const AttentionGradWrites&) {
  FT_CHECK(false, "flash_attention_backward_bf16: this build has no AVX512-BF16 kernels");
}
void flash_attention_forward_bf16(bf16_bits*, float*, const bf16_bits*, const bf16_bits*,
                                  const bf16_bits*, const AttentionStrides&, int, int, int, int,
                                  int) {
  FT_CHECK(false, "flash_attention_forward_bf16: this build has no AVX512-BF16 kernels");
}
void flash_attention_backward_bf16(float*, float*, float*, const float*, const bf16_bits*,
                                   const float*, const bf16_bits*, const bf16_bits*,
                                   const bf16_bits*, const AttentionStrides&, int, int, int, int,
                                   int, const AttentionGradWrites&) {
  FT_CHECK(false, "flash_attention_backward_bf16: this build has no AVX512-BF16 kernels");
}
#endif

}  // namespace ft
