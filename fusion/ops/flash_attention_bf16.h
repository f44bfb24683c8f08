// FlashAttentionOp's CPU kernels on bf16 operands (train.precision: bf16) with the AVX512-BF16
// dot products (vdpbf16ps): every product inside the tiles multiplies bf16 values and accumulates
// in fp32, as the eager twin's oneDNN bf16 GEMMs do. q, k and v are read as they are (bf16); P and
// dS are rounded to bf16 (nearest even) right before their products and dY once per call, as the
// eager chain rounds them (the probabilities' cast op, bf16_gradient_copy); softmax, the
// log-sum-exp, D = <dY, Y> and every sum stay fp32, and the gradients are written in fp32.
// The kernels live in flash_attention_bf16_tiles.cpp, compiled with AVX512-BF16 enabled; the
// drivers here check at run time that the CPU runs them (flash_attention_bf16_native()).
// Thread safety: as flash_attention.h; (b, h) pairs run on OpenMP, one scratch area per thread.
#pragma once
#include <cstdint>

#include "core/math/bf16_math.h"
#include "fusion/ops/flash_attention.h"

namespace ft {

// True when this build compiled the AVX512-BF16 kernels, the CPU has AVX512-BF16 and the GEMMs'
// test says the CPU "has bf16 instructions" (bf16_gemm_native(), so ONEDNN_MAX_CPU_ISA=AVX2
// forces the widening path here too). Decided once per process.
bool flash_attention_bf16_native();

// Which input gradients backward writes (=) instead of adding into: those the executor handed
// out fresh, so that they are neither zeroed first nor read back.
struct AttentionGradWrites {
  bool dq = false, dk = false, dv = false;
};

// As flash_attention_forward / flash_attention_backward, on bf16 q, k, v; backward overwrites the
// gradients `writes` names. y is fp32, or bf16 (fusion.vertical.cast: y feeds the projection's
// GEMM only), rounded once from the fp32 Y / l; backward takes the y forward wrote, and with a
// bf16 one D = <dY, Y> is taken on the rounded Y.
// REQUIRES: flash_attention_bf16_native(); tile >= 1.
void flash_attention_forward_bf16(float* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                                  const bf16_bits* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, int tile);
void flash_attention_forward_bf16(bf16_bits* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                                  const bf16_bits* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, int tile);
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy, const float* y,
                                   const float* lse, const bf16_bits* q, const bf16_bits* k,
                                   const bf16_bits* v, const AttentionStrides& strides, int batch,
                                   int seq_len, int channels, int n_head, int tile,
                                   const AttentionGradWrites& writes = {});
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dy,
                                   const bf16_bits* y, const float* lse, const bf16_bits* q,
                                   const bf16_bits* k, const bf16_bits* v,
                                   const AttentionStrides& strides, int batch, int seq_len,
                                   int channels, int n_head, int tile,
                                   const AttentionGradWrites& writes = {});

namespace attention_bf16 {

// One head's shape as the tile kernels see it.
struct HeadGeometry {
  int64_t seq_len = 0;
  int64_t hd = 0;         // head dim
  int64_t width = 0;      // hd rounded up to a vector of 16 floats (zero padded)
  int64_t tile_rows = 0;  // query and key rows per tile: even, so tiles start on a row pair
  int64_t ld = 0;         // floats per row of a score tile
  int64_t head_ld = 0;    // words per row of a whole head's transposed K or V
  float scale = 0.0f;     // 1 / sqrt(hd)
};
HeadGeometry head_geometry(int seq_len, int channels, int n_head, int tile);

// Bytes of scratch one thread needs for forward_head and backward_head (either).
int64_t scratch_bytes(const HeadGeometry& geometry);
// One (b, h) pair: the pointers are its first row's head columns, rows `strides` apart. Writes y
// (fp32 or bf16) and the head's lse [T]. `scratch` holds scratch_bytes(geometry) bytes, owned by
// the caller.
void forward_head(float* y, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                  const AttentionStrides& strides, const HeadGeometry& geometry,
                  unsigned char* scratch);
void forward_head(bf16_bits* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                  const bf16_bits* v, const AttentionStrides& strides, const HeadGeometry& geometry,
                  unsigned char* scratch);
// Adds the head's gradients into dq, dk, dv, or writes those `writes` names.
void backward_head(float* dq, float* dk, float* dv, const float* dy, const float* y,
                   const float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                   const AttentionStrides& strides, const HeadGeometry& geometry,
                   const AttentionGradWrites& writes, unsigned char* scratch);
void backward_head(float* dq, float* dk, float* dv, const float* dy, const bf16_bits* y,
                   const float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                   const AttentionStrides& strides, const HeadGeometry& geometry,
                   const AttentionGradWrites& writes, unsigned char* scratch);

}  // namespace attention_bf16
}  // namespace ft
