// Detection and choice of the instruction-set level (cpu/isa.h).
#include "cpu/isa.h"

#include <cstdint>
#include <cstdlib>

#include "core/errors.h"

namespace sl::cpu {
namespace {

#ifdef SL_MULTI_ISA
// CPUID and XGETBV directly, not __builtin_cpu_supports: that reads a table filled by the compiler's runtime
// library, and the clang of the portable wheel (zig's) links a runtime that leaves it empty (every level then
// read as baseline).
void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

// XCR0 when the CPU has AVX and the OS saves its registers on a context switch (bits 1-2: SSE, AVX; 5-7:
// AVX-512), else 0. ecx1: CPUID leaf 1's ECX.
uint32_t avx_xcr0(uint32_t ecx1) {
  const bool osxsave = (ecx1 >> 27) & 1, avx = (ecx1 >> 28) & 1;
  if (!osxsave || !avx) return 0;
  uint32_t xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6) == 0x6 ? xcr0_lo : 0;
}
#endif

Isa detect() {
#ifdef SL_MULTI_ISA
  uint32_t r[4];
  cpuid(0, 0, r);
  const uint32_t max_leaf = r[0];
  if (max_leaf < 7) return Isa::kBaseline;
  cpuid(1, 0, r);
  const uint32_t xcr0_lo = avx_xcr0(r[2]);
  if (xcr0_lo == 0) return Isa::kBaseline;
  cpuid(7, 0, r);
  const uint32_t ebx = r[1];
  const bool avx2 = (ebx >> 5) & 1;
  const bool avx512 = ((ebx >> 16) & 1) && ((ebx >> 17) & 1) && ((ebx >> 30) & 1) && ((ebx >> 31) & 1);  // F DQ BW VL
  if (avx2 && avx512 && (xcr0_lo & 0xe0) == 0xe0) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

const Isa kBest = detect();

constexpr const char* kAllowed = "baseline, avx2, avx512 or best";

#ifndef SL_MULTI_ISA
// The architecture this library was compiled for, for messages: the avx levels exist on x86-64 builds only.
#if defined(__aarch64__)
constexpr const char* kArch = "aarch64";  // its baseline is NEON (always present on ARMv8-A)
#else
constexpr const char* kArch = "a CPU other than x86-64";
#endif
#endif

// `what` names the setting in messages, e.g. "SINGA_LITE_ISA='avx3'".
Isa parse(const std::string& name, const std::string& what) {
  Isa level;
  if (name == "baseline") level = Isa::kBaseline;
  else if (name == "avx2") level = Isa::kAvx2;
  else if (name == "avx512") level = Isa::kAvx512;
  else if (name == "best") level = kBest;
  else throw ValueError(str(what, " is not an instruction-set level: expected one of ", kAllowed, " (unset SINGA_LITE_ISA for the best this CPU has)"));
#ifndef SL_MULTI_ISA
  // Not "this CPU supports at most baseline": the CPU may well have AVX2 (an x86-64 build run elsewhere is
  // another wheel), what matters is that this build has no x86 code at all.
  if (level != Isa::kBaseline)
    throw ValueError(str(what, ": '", isa_name(level), "' is an x86-64 level and this build of singa_lite is for ", kArch,
                         ", whose kernels have one level, 'baseline'; choose baseline or best (or unset SINGA_LITE_ISA)"));
#endif
  if (int(level) > int(kBest))
    throw ValueError(str(what, ": this CPU supports at most '", isa_name(kBest), "'; choose that or a lower level "
                         "(the levels, lowest first: baseline, avx2, avx512)"));
  return level;
}

}  // namespace

namespace isa_detail {
Isa active = kBest;
}

const char* isa_name(Isa level) {
  switch (level) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kBaseline: break;
  }
  return "baseline";
}

Isa best_isa() { return kBest; }

bool has_f16c() {
#ifdef SL_MULTI_ISA
  static const bool yes = [] {
    uint32_t r[4];
    cpuid(1, 0, r);
    return ((r[2] >> 29) & 1) && avx_xcr0(r[2]) != 0;
  }();
  return yes;
#else
  return false;
#endif
}
Isa active_isa() { return isa_detail::active; }

void set_isa(const std::string& name) { isa_detail::active = parse(name, str("set_isa('", name, "')")); }

void set_isa_from_env() {
  const char* v = std::getenv("SINGA_LITE_ISA");
  if (v == nullptr || *v == '\0') return;
  isa_detail::active = parse(v, str("SINGA_LITE_ISA='", v, "'"));
}

}  // namespace sl::cpu
