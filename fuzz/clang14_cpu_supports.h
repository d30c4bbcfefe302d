// Force-included into common/rope.cc by fuzz/fuzz.cmake when the compiler is
// clang < 15, which rejects __builtin_cpu_supports("f16c") ("invalid cpu
// feature string for builtin"). Answers "avx" and "f16c" from CPUID instead.
// Remove once common/rope.cc asks CPUID itself.
#ifndef EVOKE_FUZZ_CLANG14_CPU_SUPPORTS_H_
#define EVOKE_FUZZ_CLANG14_CPU_SUPPORTS_H_

#include <cpuid.h>
#include <cstring>

inline int EvokeFuzzCpuSupports(const char* feature) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool avx = (c & bit_AVX) != 0 && (c & bit_OSXSAVE) != 0;
  if (std::strcmp(feature, "avx") == 0) return avx;
  if (std::strcmp(feature, "f16c") == 0) return avx && (c & bit_F16C) != 0;
  return 0;
}
#define __builtin_cpu_supports(feature) EvokeFuzzCpuSupports(feature)

#endif  // EVOKE_FUZZ_CLANG14_CPU_SUPPORTS_H_
