// Copy with cast: the kernel behind contiguous(), clone(), cast(), broadcast materialisation and concat.
#include <cstring>

#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

template <typename Out, typename In>
void copy_typed(const Tensor& dst, const Tensor& src) {
  StridedLoop<2> L({&dst, &src});
  for_each_row(L, [](char* const* p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* x = reinterpret_cast<const In*>(p[1]);
    const int64_t so = s[0] / int64_t(sizeof(Out)), sx = s[1] / int64_t(sizeof(In));
    if constexpr (std::is_same_v<Out, In>) {
      if (so == 1 && sx == 1) {
        std::memcpy(o, x, size_t(n) * sizeof(Out));
        return;
      }
    }
    if (so == 1 && sx == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = convert<Out>(x[i * sx]);
    }
  });
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  SL_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using Out = scalar_t;
    SL_DISPATCH_ALL(src.dtype(), "copy", [&] { copy_typed<Out, scalar_t>(dst, src); });
  });
}

}  // namespace sl::cpu
