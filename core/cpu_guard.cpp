// The CPU guard's check (see core/cpu_guard.h). This file is compiled for baseline x86-64
// (CMakeLists.txt), so it runs on any x86-64 CPU, and calls only C functions and compiler
// builtins: an inline C++ library function here would be a weak symbol, and the linker could
// pick another file's copy of it, compiled with the build's wider instructions.
#include "core/cpu_guard.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace ft {
namespace {

constexpr const char* kIsaNames[kIsaCount] = {
    "sse3",        "ssse3",      "sse4.1",       "sse4.2",
    "popcnt",      "avx",        "avx2",         "fma",
    "f16c",        "bmi",        "bmi2",         "lzcnt",
    "movbe",       "aes",        "pclmul",       "avx512f",
    "avx512vl",    "avx512bw",   "avx512dq",     "avx512cd",
    "avx512vnni",  "avx512bf16", "avx512fp16",   "avx512vbmi",
    "avx512vbmi2", "avx512ifma", "avx512bitalg", "avx512vpopcntdq",
    "gfni",        "vpclmulqdq", "avxvnni",
};

}  // namespace

const char* isa_name(IsaExtension extension) {
  return extension >= 0 && extension < kIsaCount ? kIsaNames[extension] : "unknown";
}

// __builtin_cpu_supports takes only a string literal, so one line per extension.
uint64_t cpu_isa() {
  uint64_t isa = 0;
  auto set = [&isa](IsaExtension extension, int supported) {
    if (supported) isa |= isa_bit(extension);
  };
  set(kIsaSse3, __builtin_cpu_supports("sse3"));
  set(kIsaSsse3, __builtin_cpu_supports("ssse3"));
  set(kIsaSse41, __builtin_cpu_supports("sse4.1"));
  set(kIsaSse42, __builtin_cpu_supports("sse4.2"));
  set(kIsaPopcnt, __builtin_cpu_supports("popcnt"));
  set(kIsaAvx, __builtin_cpu_supports("avx"));
  set(kIsaAvx2, __builtin_cpu_supports("avx2"));
  set(kIsaFma, __builtin_cpu_supports("fma"));
  set(kIsaF16c, __builtin_cpu_supports("f16c"));
  set(kIsaBmi, __builtin_cpu_supports("bmi"));
  set(kIsaBmi2, __builtin_cpu_supports("bmi2"));
  set(kIsaLzcnt, __builtin_cpu_supports("lzcnt"));
  set(kIsaMovbe, __builtin_cpu_supports("movbe"));
  set(kIsaAes, __builtin_cpu_supports("aes"));
  set(kIsaPclmul, __builtin_cpu_supports("pclmul"));
  set(kIsaAvx512f, __builtin_cpu_supports("avx512f"));
  set(kIsaAvx512vl, __builtin_cpu_supports("avx512vl"));
  set(kIsaAvx512bw, __builtin_cpu_supports("avx512bw"));
  set(kIsaAvx512dq, __builtin_cpu_supports("avx512dq"));
  set(kIsaAvx512cd, __builtin_cpu_supports("avx512cd"));
  set(kIsaAvx512vnni, __builtin_cpu_supports("avx512vnni"));
  set(kIsaAvx512bf16, __builtin_cpu_supports("avx512bf16"));
  set(kIsaAvx512fp16, __builtin_cpu_supports("avx512fp16"));
  set(kIsaAvx512vbmi, __builtin_cpu_supports("avx512vbmi"));
  set(kIsaAvx512vbmi2, __builtin_cpu_supports("avx512vbmi2"));
  set(kIsaAvx512ifma, __builtin_cpu_supports("avx512ifma"));
  set(kIsaAvx512bitalg, __builtin_cpu_supports("avx512bitalg"));
  set(kIsaAvx512vpopcntdq, __builtin_cpu_supports("avx512vpopcntdq"));
  set(kIsaGfni, __builtin_cpu_supports("gfni"));
  set(kIsaVpclmulqdq, __builtin_cpu_supports("vpclmulqdq"));
  set(kIsaAvxvnni, __builtin_cpu_supports("avxvnni"));
  return isa;
}

int missing_isa(char* out, size_t capacity, uint64_t build, uint64_t cpu) {
  if (capacity > 0) out[0] = '\0';
  int count = 0;
  size_t used = 0;
  for (int extension = 0; extension < kIsaCount; ++extension) {
    if ((build & ~cpu & isa_bit(static_cast<IsaExtension>(extension))) == 0) continue;
    ++count;
    if (used >= capacity) continue;
    const int written = std::snprintf(out + used, capacity - used, "%s%s", count > 1 ? " " : "",
                                      kIsaNames[extension]);
    if (written > 0) used += static_cast<size_t>(written);
  }
  return count;
}

void format_isa_refusal(char* out, size_t capacity, const char* missing, const char* march) {
  std::snprintf(out, capacity,
                "fusiontrain: this build uses CPU instructions that this CPU does not have (%s). "
                "It was compiled with -march=%s, for another CPU. Rebuild it on this machine "
                "(cmake -S . -B build && cmake --build build), or build one binary for every "
                "host with cmake -S . -B build -DFT_MARCH=x86-64-v3 (any AVX2 CPU).\n",
                missing, march);
}

bool cpu_guard_linked() {
  return true;
}

namespace {

// Priority 101 runs before every C++ static initialiser of the program (they run at 65535), so
// before any code compiled with the build's flags; shared libraries (oneDNN, MPI) are built for
// any CPU and initialise earlier still.
__attribute__((constructor(101))) void refuse_a_cpu_without_the_build_isa() {
  __builtin_cpu_init();
  char missing[512];
  if (missing_isa(missing, sizeof missing, kBuildIsa, cpu_isa()) == 0) return;
  char message[1024];
  format_isa_refusal(message, sizeof message, missing, kBuildMarch);
  std::fputs(message, stderr);
  _exit(1);
}

}  // namespace
}  // namespace ft
