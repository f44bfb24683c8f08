// kBuildIsa: the extensions the compiler may use in this build, read from the macros its flags
// (-march=FT_MARCH) define. Compiled with the same flags as the rest of our code, so it sees what
// every other file sees; constants only, so it runs no code on a CPU that lacks them.
#include "core/cpu_guard.h"

namespace ft {

extern const uint64_t kBuildIsa = 0
#ifdef __SSE3__
                                  | isa_bit(kIsaSse3)
#endif
#ifdef __SSSE3__
                                  | isa_bit(kIsaSsse3)
#endif
#ifdef __SSE4_1__
                                  | isa_bit(kIsaSse41)
#endif
#ifdef __SSE4_2__
                                  | isa_bit(kIsaSse42)
#endif
#ifdef __POPCNT__
                                  | isa_bit(kIsaPopcnt)
#endif
#ifdef __AVX__
                                  | isa_bit(kIsaAvx)
#endif
#ifdef __AVX2__
                                  | isa_bit(kIsaAvx2)
#endif
#ifdef __FMA__
                                  | isa_bit(kIsaFma)
#endif
#ifdef __F16C__
                                  | isa_bit(kIsaF16c)
#endif
#ifdef __BMI__
                                  | isa_bit(kIsaBmi)
#endif
#ifdef __BMI2__
                                  | isa_bit(kIsaBmi2)
#endif
#ifdef __LZCNT__
                                  | isa_bit(kIsaLzcnt)
#endif
#ifdef __MOVBE__
                                  | isa_bit(kIsaMovbe)
#endif
#ifdef __AES__
                                  | isa_bit(kIsaAes)
#endif
#ifdef __PCLMUL__
                                  | isa_bit(kIsaPclmul)
#endif
#ifdef __AVX512F__
                                  | isa_bit(kIsaAvx512f)
#endif
#ifdef __AVX512VL__
                                  | isa_bit(kIsaAvx512vl)
#endif
#ifdef __AVX512BW__
                                  | isa_bit(kIsaAvx512bw)
#endif
#ifdef __AVX512DQ__
                                  | isa_bit(kIsaAvx512dq)
#endif
#ifdef __AVX512CD__
                                  | isa_bit(kIsaAvx512cd)
#endif
#ifdef __AVX512VNNI__
                                  | isa_bit(kIsaAvx512vnni)
#endif
#ifdef __AVX512BF16__
                                  | isa_bit(kIsaAvx512bf16)
#endif
#ifdef __AVX512FP16__
                                  | isa_bit(kIsaAvx512fp16)
#endif
#ifdef __AVX512VBMI__
                                  | isa_bit(kIsaAvx512vbmi)
#endif
#ifdef __AVX512VBMI2__
                                  | isa_bit(kIsaAvx512vbmi2)
#endif
#ifdef __AVX512IFMA__
                                  | isa_bit(kIsaAvx512ifma)
#endif
#ifdef __AVX512BITALG__
                                  | isa_bit(kIsaAvx512bitalg)
#endif
#ifdef __AVX512VPOPCNTDQ__
                                  | isa_bit(kIsaAvx512vpopcntdq)
#endif
#ifdef __GFNI__
                                  | isa_bit(kIsaGfni)
#endif
#ifdef __VPCLMULQDQ__
                                  | isa_bit(kIsaVpclmulqdq)
#endif
#ifdef __AVXVNNI__
                                  | isa_bit(kIsaAvxvnni)
#endif
    ;

extern const char* const kBuildMarch = FT_BUILD_MARCH;

}  // namespace ft
