// Neural-network kernels that are not plain element-wise / reduction / GEMM work:
// im2col / col2im (convolution as GEMM) and 2-D pooling. Inputs are contiguous NCHW.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {

// cols[(c, i, j), (n, oh, ow)] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside the image).
// All images' columns sit side by side, so a convolution of the whole batch is one GEMM W[OC, K] @ cols.
void im2col(const Tensor& cols, const Tensor& x, const Conv2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "im2col", [&] {
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = cols.data<scalar_t>();
    const int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const int64_t OHW = g.out_h * g.out_w, rows = C * g.kernel_h * g.kernel_w;
    const scalar_t zero = convert<scalar_t>(0.0);
    parallel_range(N * rows, [&](int64_t b, int64_t e) {
      for (int64_t nr = b; nr < e; ++nr) {
        const int64_t n = nr / rows, r = nr % rows;
        const int64_t c = r / (g.kernel_h * g.kernel_w), i = (r / g.kernel_w) % g.kernel_h, j = r % g.kernel_w;
        const scalar_t* plane = src + (n * C + c) * H * W;
        scalar_t* out = dst + (r * N + n) * OHW;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
          scalar_t* orow = out + oh * g.out_w;
          if (ih < 0 || ih >= H) {
            for (int64_t ow = 0; ow < g.out_w; ++ow) orow[ow] = zero;
            continue;
          }
          const scalar_t* irow = plane + ih * W;
          const int64_t off = j * g.dilation_w - g.pad_w;
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t iw = ow * g.stride_w + off;
            orow[ow] = (iw >= 0 && iw < W) ? irow[iw] : zero;
          }
        }
      }
    }, g.out_h * g.out_w);
  });
}

// The adjoint of im2col: every column entry is added back to the pixel it came from.
void col2im(const Tensor& x, const Tensor& cols, const Conv2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "col2im", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* dst = x.data<scalar_t>();
    const scalar_t* src = cols.data<scalar_t>();
    const int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const int64_t OHW = g.out_h * g.out_w, K = g.kernel_h * g.kernel_w;
    // One (n, c) plane per task: the plane's pixels receive from all of its K column rows, so planes are
    // independent and the sum per pixel is always taken in the same order.
    parallel_range(N * C, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(H * W));
      for (int64_t nc = b; nc < e; ++nc) {
        const int64_t n = nc / C, c = nc % C;
        std::fill(acc.begin(), acc.end(), C_t(0));
        for (int64_t r = 0; r < K; ++r) {
          const int64_t i = r / g.kernel_w, j = r % g.kernel_w;
          const scalar_t* crow = src + ((c * K + r) * N + n) * OHW;
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= H) continue;
            C_t* arow = acc.data() + ih * W;
            const int64_t off = j * g.dilation_w - g.pad_w;
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              const int64_t iw = ow * g.stride_w + off;
              if (iw >= 0 && iw < W) arow[iw] += C_t(crow[oh * g.out_w + ow]);
            }
          }
        }
        scalar_t* plane = dst + nc * H * W;
        for (int64_t p = 0; p < H * W; ++p) plane[p] = convert<scalar_t>(acc[p]);
      }
    }, K * OHW);
  });
}

void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using C_t = compute_t<scalar_t>;
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    int64_t* idx = argmax.data<int64_t>();
    const int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const scalar_t* plane = src + nc * H * W;
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            C_t best = -std::numeric_limits<C_t>::infinity();
            int64_t best_i = -1;
            for (int64_t i = 0; i < g.kernel_h; ++i) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i;
              if (ih < 0 || ih >= H) continue;
              for (int64_t j = 0; j < g.kernel_w; ++j) {
                const int64_t iw = ow * g.stride_w - g.pad_w + j;
                if (iw < 0 || iw >= W) continue;
                const C_t v = C_t(plane[ih * W + iw]);
                if (v > best || best_i < 0 || v != v) {  // first maximum wins; nan propagates
                  best = v;
                  best_i = ih * W + iw;
                  if (v != v) break;
                }
              }
            }
            const int64_t o = (nc * g.out_h + oh) * g.out_w + ow;
            dst[o] = convert<scalar_t>(best);
            idx[o] = best_i;
          }
      }
    }, g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax) {
  SL_DISPATCH_FLOAT(dx.dtype(), "max_pool2d_backward", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t* g = dy.data<scalar_t>();
    const int64_t* idx = argmax.data<int64_t>();
    const int64_t NC = dx.shape()[0] * dx.shape()[1], HW = dx.shape()[2] * dx.shape()[3];
    const int64_t OHW = dy.shape()[2] * dy.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(HW));
      for (int64_t nc = b; nc < e; ++nc) {
        std::fill(acc.begin(), acc.end(), C_t(0));
        for (int64_t o = 0; o < OHW; ++o) {
          const int64_t i = idx[nc * OHW + o];
          if (i >= 0) acc[i] += C_t(g[nc * OHW + o]);
        }
        for (int64_t p = 0; p < HW; ++p) d[nc * HW + p] = convert<scalar_t>(acc[p]);
      }
    }, HW + OHW);
  });
}

// Average over the window; count_include_pad divides by the full window, otherwise by the pixels inside.
void avg_pool2d(const Tensor& out, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad) {
  SL_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    using C_t = compute_t<scalar_t>;
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    const int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const scalar_t* plane = src + nc * H * W;
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            C_t s = 0;
            int64_t inside = 0;
            for (int64_t i = 0; i < g.kernel_h; ++i) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i;
              if (ih < 0 || ih >= H) continue;
              for (int64_t j = 0; j < g.kernel_w; ++j) {
                const int64_t iw = ow * g.stride_w - g.pad_w + j;
                if (iw < 0 || iw >= W) continue;
                s += C_t(plane[ih * W + iw]);
                ++inside;
              }
            }
            const int64_t count = count_include_pad ? g.kernel_h * g.kernel_w : std::max<int64_t>(inside, 1);
            dst[(nc * g.out_h + oh) * g.out_w + ow] = convert<scalar_t>(s / C_t(count));
          }
      }
    }, g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

void avg_pool2d_backward(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g, bool count_include_pad) {
  SL_DISPATCH_FLOAT(dx.dtype(), "avg_pool2d_backward", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t* gy = dy.data<scalar_t>();
    const int64_t NC = dx.shape()[0] * dx.shape()[1], H = dx.shape()[2], W = dx.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(H * W));
      for (int64_t nc = b; nc < e; ++nc) {
        std::fill(acc.begin(), acc.end(), C_t(0));
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
            const int64_t hs = std::max<int64_t>(h0, 0), he = std::min<int64_t>(h0 + g.kernel_h, H);
            const int64_t ws = std::max<int64_t>(w0, 0), we = std::min<int64_t>(w0 + g.kernel_w, W);
            const int64_t inside = std::max<int64_t>((he - hs) * (we - ws), 0);
            const int64_t count = count_include_pad ? g.kernel_h * g.kernel_w : std::max<int64_t>(inside, 1);
            const C_t share = C_t(gy[(nc * g.out_h + oh) * g.out_w + ow]) / C_t(count);
            for (int64_t ih = hs; ih < he; ++ih)
              for (int64_t iw = ws; iw < we; ++iw) acc[ih * W + iw] += share;
          }
        for (int64_t p = 0; p < H * W; ++p) d[nc * H * W + p] = convert<scalar_t>(acc[p]);
      }
    }, H * W + g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

}  // namespace sl::cpu
