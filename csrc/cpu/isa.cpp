// Detection and choice of the instruction-set level (cpu/isa.h).
#include "cpu/isa.h"

#include <cstdlib>

#include "core/errors.h"

namespace sl::cpu {
namespace {

Isa detect() {
#ifdef SL_MULTI_ISA
  __builtin_cpu_init();
  // The OS must also save the wide registers (XCR0); __builtin_cpu_supports checks that for AVX / AVX-512.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

const Isa kBest = detect();

constexpr const char* kAllowed = "baseline, avx2, avx512 or best";

// `what` names the setting in messages, e.g. "SINGA_LITE_ISA='avx3'".
Isa parse(const std::string& name, const std::string& what) {
  Isa level;
  if (name == "baseline") level = Isa::kBaseline;
  else if (name == "avx2") level = Isa::kAvx2;
  else if (name == "avx512") level = Isa::kAvx512;
  else if (name == "best") level = kBest;
  else throw ValueError(str(what, " is not an instruction-set level: expected one of ", kAllowed, " (unset SINGA_LITE_ISA for the best this CPU has)"));
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
Isa active_isa() { return isa_detail::active; }

void set_isa(const std::string& name) { isa_detail::active = parse(name, str("set_isa('", name, "')")); }

void set_isa_from_env() {
  const char* v = std::getenv("SINGA_LITE_ISA");
  if (v == nullptr || *v == '\0') return;
  isa_detail::active = parse(v, str("SINGA_LITE_ISA='", v, "'"));
}

}  // namespace sl::cpu
