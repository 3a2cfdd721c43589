// Index kernels: one_hot.
#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {

void one_hot(const Tensor& out, const Tensor& indices, int64_t depth) {
  fill(out, 0.0);
  SL_DISPATCH_ALL(out.dtype(), "one_hot", [&] {
    using Out = scalar_t;
    Out* o = out.data<Out>();
    const Out one = convert<Out>(1.0);
    auto scatter = [&](auto* idx) {
      parallel_range(indices.numel(), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i * depth + int64_t(idx[i])] = one;
      });
    };
    if (indices.dtype() == DType::kInt32) scatter(indices.data<int32_t>());
    else scatter(indices.data<int64_t>());
  });
}

}  // namespace sl::cpu
