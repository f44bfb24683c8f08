// The 16-lane (AVX-512) Winograd kernels: model/ops/winograd_kernels.h compiled with AVX-512
// enabled (CMakeLists.txt sets the flags for this file alone). winograd.cpp calls them only after
// checking that the CPU has AVX-512, so the rest of the build stays runnable on AVX2.
#if FT_WINOGRAD_AVX512
#include "model/ops/winograd_kernels.h"

namespace ft::winograd {

const KernelTable& avx512_kernels() {
  static const KernelTable table = kernels_of_width<16>();
  return table;
}

}  // namespace ft::winograd
#endif
