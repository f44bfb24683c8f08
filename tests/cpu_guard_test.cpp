// The CPU guard (core/cpu_guard.h): which extensions it names as missing, its message, and that
// the build's record of its own extensions agrees with the flags this file was compiled with.
#include "core/cpu_guard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace ft {
namespace {

TEST(CpuGuard, NamesEveryExtensionTheBuildHasAndTheCpuLacks) {
  const uint64_t cpu = isa_bit(kIsaSse42) | isa_bit(kIsaAvx) | isa_bit(kIsaAvx2) | isa_bit(kIsaFma);
  const uint64_t build = cpu | isa_bit(kIsaAvx512f) | isa_bit(kIsaAvx512bw);
  char missing[256];
  EXPECT_EQ(missing_isa(missing, sizeof missing, build, cpu), 2);
  EXPECT_STREQ(missing, "avx512f avx512bw");
  // Extensions the CPU has beyond the build's are not missing.
  EXPECT_EQ(missing_isa(missing, sizeof missing, cpu, build), 0);
  EXPECT_STREQ(missing, "");
}

TEST(CpuGuard, AShortBufferIsCutAndStillTerminated) {
  const uint64_t build = isa_bit(kIsaAvx512f) | isa_bit(kIsaAvx512vl) | isa_bit(kIsaAvx512bw);
  char missing[12];
  std::memset(missing, 'x', sizeof missing);
  EXPECT_EQ(missing_isa(missing, sizeof missing, build, 0), 3);
  EXPECT_EQ(std::string(missing), "avx512f avx");
}

TEST(CpuGuard, EveryExtensionHasItsOwnName) {
  for (int first = 0; first < kIsaCount; ++first) {
    const std::string name = isa_name(static_cast<IsaExtension>(first));
    EXPECT_NE(name, "unknown") << first;
    for (int second = first + 1; second < kIsaCount; ++second)
      EXPECT_NE(name, isa_name(static_cast<IsaExtension>(second))) << first << " " << second;
  }
  EXPECT_STREQ(isa_name(kIsaAvx512f), "avx512f");
  EXPECT_STREQ(isa_name(kIsaAvxvnni), "avxvnni");
  EXPECT_STREQ(isa_name(kIsaCount), "unknown");
}

TEST(CpuGuard, TheRefusalSaysWhatIsMissingAndHowToRebuild) {
  char message[1024];
  format_isa_refusal(message, sizeof message, "avx512f avx512bw", "native");
  const std::string text = message;
  EXPECT_NE(text.find("(avx512f avx512bw)"), std::string::npos) << text;
  EXPECT_NE(text.find("-march=native"), std::string::npos) << text;
  EXPECT_NE(text.find("-DFT_MARCH=x86-64-v3"), std::string::npos) << text;
  EXPECT_EQ(text.find(".cpp"), std::string::npos) << text;  // no source path for a user
}

// This file is compiled with the build's flags, so what its macros say is what build_isa.cpp saw.
TEST(CpuGuard, TheBuildRecordsTheExtensionsItsFlagsEnable) {
  auto expect_recorded = [](IsaExtension extension, bool enabled) {
    EXPECT_EQ((kBuildIsa & isa_bit(extension)) != 0, enabled) << isa_name(extension);
  };
#ifdef __AVX2__
  expect_recorded(kIsaAvx2, true);
#else
  expect_recorded(kIsaAvx2, false);
#endif
#ifdef __FMA__
  expect_recorded(kIsaFma, true);
#else
  expect_recorded(kIsaFma, false);
#endif
#ifdef __AVX512F__
  expect_recorded(kIsaAvx512f, true);
#else
  expect_recorded(kIsaAvx512f, false);
#endif
#ifdef __AVX512BW__
  expect_recorded(kIsaAvx512bw, true);
#else
  expect_recorded(kIsaAvx512bw, false);
#endif
  EXPECT_STRNE(kBuildMarch, "");
}

// The tests run where they were built, so the guard let this process start: the CPU has every
// extension of the build, and the CPU's own report includes the baseline every x86-64 CPU has.
TEST(CpuGuard, TheBuildMachineHasTheBuildsExtensions) {
  __builtin_cpu_init();
  const uint64_t cpu = cpu_isa();
  char missing[512];
  EXPECT_EQ(missing_isa(missing, sizeof missing, kBuildIsa, cpu), 0) << missing;
  EXPECT_NE(cpu & isa_bit(kIsaSse3), 0u);
  EXPECT_TRUE(cpu_guard_linked());
}

}  // namespace
}  // namespace ft
