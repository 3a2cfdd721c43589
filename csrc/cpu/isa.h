// Instruction-set levels for the CPU kernels' hot loops. The library is compiled for baseline x86-64 (SSE2) so
// that wheels run on any x86-64 CPU; the loops that gain from wider vectors are compiled once more per level
// inside the same object file, and the level is chosen at run time:
//
//   baseline  SSE2 (every x86-64 CPU)
//   avx2      AVX2, 8 float lanes                    (Haswell 2013+, Zen)
//   avx512    AVX-512 F/BW/DQ/VL, 16 float lanes     (numpy's X86_V4: Skylake-X, Ice Lake, Zen 4+)
//
// How a kernel gets its per-level copies: write its loop as a struct with a static member template
// `template <Isa Level> static SL_ISA_INLINE R run(args)` and call it through run_isa<Kernel>(args...). run_isa calls one of three wrapper functions, identical but for
// their target attribute; `run` is always inlined into each, so its loops are vectorised for that level (GCC and
// clang alike). Anything `run` calls that is not inlined runs as baseline code, which is correct, only slower.
//
// Same results on every level: the build has -ffp-contract=off (AVX-512 and AVX2+FMA CPUs would otherwise
// fuse a * b + c into one rounding on some levels only), and loops whose result depends on the order of
// operations (float sums, max / min with their signed zeros and nans) keep a fixed number of accumulator lanes
// combined in a fixed order in the source, so a wider vector holds more of those lanes at once but performs
// exactly the same operations. tests/unit/test_isa_dispatch.py compares the levels bit for bit.
//
// On other architectures (the aarch64 wheel) there is one level, baseline: the plain loops compiled for the
// architecture's base vectors (NEON on aarch64, 128-bit like SSE2), and avx2 / avx512 are refused by name.
//
// SINGA_LITE_ISA=baseline|avx2|avx512 (read when singa_lite is imported) or _core.set_isa(name) lowers the
// level, e.g. to compare results or speed; a level the CPU lacks cannot be chosen.
#pragma once
#include <string>

namespace sl::cpu {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa level);
// The highest level this CPU supports (baseline on non-x86 builds).
Isa best_isa();
// F16C (with AVX usable): the half <-> float conversions of the shm backend's float16 reductions.
bool has_f16c();
// The level the kernels use now: best_isa() unless lowered by set_isa.
Isa active_isa();
// Chooses the level by name ("baseline", "avx2", "avx512", or "best"). Throws ValueError, saying what is
// allowed, for an unknown name or a level this CPU does not support.
void set_isa(const std::string& name);
// Applies SINGA_LITE_ISA if it is set (the module calls this on import); throws as set_isa, naming the variable.
void set_isa_from_env();

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SL_MULTI_ISA 1
#define SL_TARGET_AVX2 __attribute__((target("avx2")))
#define SL_TARGET_AVX512 __attribute__((target("avx2,avx512f,avx512bw,avx512dq,avx512vl")))
#endif

// The body of a kernel compiled per level: always inlined into the per-level wrappers (as a call it would
// be compiled once, for baseline).
#define SL_ISA_INLINE inline __attribute__((always_inline))

namespace isa_detail {
#ifdef SL_MULTI_ISA
template <class Kernel, class... Args>
SL_TARGET_AVX2 auto run_avx2(Args... args) { return Kernel::template run<Isa::kAvx2>(args...); }
template <class Kernel, class... Args>
SL_TARGET_AVX512 auto run_avx512(Args... args) { return Kernel::template run<Isa::kAvx512>(args...); }
#endif
extern Isa active;  // read on every kernel call: a plain load (written only by set_isa, between calls)
}  // namespace isa_detail

// Runs Kernel::run<Level>(args...) compiled for the active level. Level tells the few kernels written with
// explicit vectors (Vec below) their width; plain loops ignore it. Arguments are passed by value: pointers,
// counts and scalars.
template <class Kernel, class... Args>
inline auto run_isa(Args... args) {
#ifdef SL_MULTI_ISA
  switch (isa_detail::active) {
    case Isa::kAvx512: return isa_detail::run_avx512<Kernel>(args...);
    case Isa::kAvx2: return isa_detail::run_avx2<Kernel>(args...);
    case Isa::kBaseline: break;
  }
#endif
  return Kernel::template run<Isa::kBaseline>(args...);
}

// The native vector of T on a level (GCC / clang vector extensions: element-wise operators, `a > b ? a : b`
// as a per-lane select). For loops that the compilers do not vectorise by themselves, e.g. GCC with a max
// reduction that must keep IEEE semantics. Load with load_vec (any alignment).
template <typename T, Isa Level>
struct Vec {
  static constexpr int kBytes = Level == Isa::kAvx512 ? 64 : Level == Isa::kAvx2 ? 32 : 16;
  static constexpr int kLen = kBytes / int(sizeof(T));
  typedef T type __attribute__((vector_size(kBytes)));
  typedef T unaligned __attribute__((vector_size(kBytes), aligned(alignof(T)), may_alias));
};
#define SL_LOAD_VEC(V, ptr) (*reinterpret_cast<const typename V::unaligned*>(ptr))

}  // namespace sl::cpu
