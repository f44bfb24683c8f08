// The CPU guard: a build may use every instruction-set extension its flags allow (-march=FT_MARCH,
// native by default), anywhere in our code. Run on a CPU without one of them (a binary built on
// an AVX-512 host, started by mpirun on an AVX2 host), the first such instruction would kill the
// process with SIGILL. core/build_isa.cpp records the build's extensions; core/cpu_guard.cpp,
// compiled for baseline x86-64, compares them with the CPU's in a constructor that runs before
// any of our other code, and refuses to start with a message that says what to rebuild.
// Thread safety: pure functions and constants.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ft {

// One bit per extension, in the order of isa_name().
enum IsaExtension : int {
  kIsaSse3,
  kIsaSsse3,
  kIsaSse41,
  kIsaSse42,
  kIsaPopcnt,
  kIsaAvx,
  kIsaAvx2,
  kIsaFma,
  kIsaF16c,
  kIsaBmi,
  kIsaBmi2,
  kIsaLzcnt,
  kIsaMovbe,
  kIsaAes,
  kIsaPclmul,
  kIsaAvx512f,
  kIsaAvx512vl,
  kIsaAvx512bw,
  kIsaAvx512dq,
  kIsaAvx512cd,
  kIsaAvx512vnni,
  kIsaAvx512bf16,
  kIsaAvx512fp16,
  kIsaAvx512vbmi,
  kIsaAvx512vbmi2,
  kIsaAvx512ifma,
  kIsaAvx512bitalg,
  kIsaAvx512vpopcntdq,
  kIsaGfni,
  kIsaVpclmulqdq,
  kIsaAvxvnni,
  kIsaCount,
};
static_assert(kIsaCount <= 64, "IsaExtension bits must fit a uint64_t");

constexpr uint64_t isa_bit(IsaExtension extension) {
  return uint64_t{1} << extension;
}

// The extensions the build's flags enable (core/build_isa.cpp, compiled with those flags).
extern const uint64_t kBuildIsa;
// The -march value the build used (FT_MARCH).
extern const char* const kBuildMarch;

// The name GCC and /proc/cpuinfo use for `extension` ("avx512f").
const char* isa_name(IsaExtension extension);

// The extensions this CPU reports. REQUIRES: __builtin_cpu_init() has run (the guard runs it).
uint64_t cpu_isa();

// Writes the names of the extensions in `build` but not in `cpu`, space-separated, into out
// (always NUL-terminated, cut short at capacity) and returns how many there are.
int missing_isa(char* out, size_t capacity, uint64_t build, uint64_t cpu);

// The refusal printed when `missing` (missing_isa's text) is not empty: what is missing, and the
// two ways out (rebuild here, or build for a level every target host has).
void format_isa_refusal(char* out, size_t capacity, const char* missing, const char* march);

// True; main() calls it so that the linker keeps the guard's object, and with it the constructor.
bool cpu_guard_linked();

}  // namespace ft
