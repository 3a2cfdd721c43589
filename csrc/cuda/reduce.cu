// Reductions on the GPU: sum / mean / max / min over any set of axes of a strided view, and argmax /
// argmin of contiguous rows. Results match cpu/reduce.cpp: the same accumulator types (integers in int64,
// float32 and float64 in double, float16 in float32 as kernels.h promises), the same rounding of the result
// (sum: accumulator -> compute type -> storage; mean: double(acc) / R, then the same), and nan propagation
// (any nan makes max/min a quiet nan; argmax/argmin give the first nan, else the first extreme). Sums
// differ from the CPU's only in the order of the additions.
//
// Layout: x is viewed as K outputs ("rows") of R reduced elements each. The kept axes (in output order)
// and the reduced axes (sorted by decreasing |stride|, any order being valid for a reduction) are each
// coalesced, so most views reduce to one or two axes per side; then
//   row mode    (reduced elements closest in memory, e.g. sum(axis=-1)): threads of one warp read
//               consecutive elements of a row: a few short rows per warp, a warp per row, or a block per
//               long row, combined with warp shuffles (shared memory above a warp);
//   column mode (outputs closest in memory, e.g. sum(axis=0) of [R, K]): threads of a warp read
//               consecutive outputs, several threads per output split R and combine in shared memory.
// When there are too few outputs to fill the GPU, R is also split across blocks (gridDim.y): each block
// writes a partial to a temporary [splits, K] buffer and a second kernel combines the partials in split
// order. No atomics: the result depends only on the shapes, strides and the GPU's SM count.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sl::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block of every kernel here

// ---------------------------------------------------------------- value helpers (device)
// Written with bit casts instead of std::numeric_limits: those are host constexpr functions, callable in
// device code only with --expt-relaxed-constexpr, which the build does not pass.
template <typename C> __device__ __forceinline__ C lowest_of();
template <> __device__ __forceinline__ float lowest_of<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double lowest_of<double>() { return -__longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ __forceinline__ int32_t lowest_of<int32_t>() { return INT32_MIN; }
template <> __device__ __forceinline__ int64_t lowest_of<int64_t>() { return INT64_MIN; }
template <typename C> __device__ __forceinline__ C highest_of();
template <> __device__ __forceinline__ float highest_of<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double highest_of<double>() { return __longlong_as_double(0x7ff0000000000000LL); }
template <> __device__ __forceinline__ int32_t highest_of<int32_t>() { return INT32_MAX; }
template <> __device__ __forceinline__ int64_t highest_of<int64_t>() { return INT64_MAX; }
// The CPU returns numeric_limits<C>::quiet_NaN() (positive, default payload), whatever nan it met.
template <typename C> __device__ __forceinline__ C quiet_nan_of();
template <> __device__ __forceinline__ float quiet_nan_of<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan_of<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

template <typename C> __device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return v != v;
  else return false;
}

// Sum accumulators, as the CPU: integers in int64, float32 and float64 in double (the CPU adds float32 in
// float lanes within blocks of 4096 and the blocks in double; double throughout is at least as accurate,
// and a memory-bound reduction does not notice the double adds), float16 in float32 (kernels.h).
template <typename T> struct SumAcc { using type = double; };
template <> struct SumAcc<__half> { using type = float; };
template <> struct SumAcc<__nv_bfloat16> { using type = float; };
template <> struct SumAcc<int32_t> { using type = int64_t; };
template <> struct SumAcc<int64_t> { using type = int64_t; };

template <typename A> struct AccDType;
template <> struct AccDType<float> { static constexpr DType value = DType::kFloat32; };
template <> struct AccDType<double> { static constexpr DType value = DType::kFloat64; };
template <> struct AccDType<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct AccDType<int64_t> { static constexpr DType value = DType::kInt64; };

template <ReduceOp Op, typename T>
struct Reducer {
  static constexpr bool kIsSum = Op == ReduceOp::kSum || Op == ReduceOp::kMean;
  using C = compute_of<T>;
  using A = std::conditional_t<kIsSum, typename SumAcc<T>::type, C>;

  __device__ __forceinline__ static A identity() {
    if constexpr (kIsSum) return A(0);
    else if constexpr (Op == ReduceOp::kMax) return lowest_of<C>();
    else return highest_of<C>();
  }
  __device__ __forceinline__ static A combine(A a, A b) {
    if constexpr (kIsSum) {
      // Integers add as uint64: the same two's-complement wrap as the CPU's int64 lanes, without the
      // undefined behaviour of a signed overflow.
      if constexpr (std::is_integral_v<A>) return A(uint64_t(a) + uint64_t(b));
      else return a + b;
    } else {
      // b wins when strictly better or nan, so a nan met anywhere survives every later combine.
      const bool better = Op == ReduceOp::kMax ? b > a : b < a;
      return better || is_nan(b) ? b : a;
    }
  }
  __device__ __forceinline__ static A from(const T* p) { return A(load(p)); }
  // As cpu::reduce_inner / reduce_outer: sum -> C(acc); mean -> C(double(acc) / R); then rounded to T once.
  __device__ __forceinline__ static T finish(A acc, int64_t R) {
    if constexpr (Op == ReduceOp::kSum) {
      return store_as<T>(C(acc));
    } else if constexpr (Op == ReduceOp::kMean) {
      return store_as<T>(C(double(acc) / double(R)));
    } else {
      if constexpr (std::is_floating_point_v<C>)
        if (acc != acc) acc = quiet_nan_of<C>();
      return store_as<T>(acc);
    }
  }
};

// ---------------------------------------------------------------- geometry
struct ReduceGeom {
  Strided kept;  // coalesced kept axes in output order: kept.offset(k) is where output k's row starts
  Strided red;   // coalesced reduced axes: red.offset(j) is the j-th element of a row, relative to its start
};

// Walks the reduced positions j, j + step, j + 2 step, ... of a row. RND is the number of coalesced reduced
// axes when it is 1 or 2 (offsets follow by additions), 0 for more (offsets recomputed by division).
template <int RND> struct RedPos;
template <> struct RedPos<1> {
  int64_t off, step_off;
  __device__ __forceinline__ RedPos(const Strided& r, int64_t j, int64_t step)
      : off(j * r.strides[0]), step_off(step * r.strides[0]) {}
  __device__ __forceinline__ int64_t offset(const Strided&) const { return off; }
  __device__ __forceinline__ void advance(const Strided&) { off += step_off; }
};
template <> struct RedPos<2> {
  int64_t i0, i1, s0, s1;  // position and step along the two axes; s1 < shape[1], so one carry at most
  __device__ __forceinline__ RedPos(const Strided& r, int64_t j, int64_t step) {
    i0 = j / r.shape[1];
    i1 = j - i0 * r.shape[1];
    s0 = step / r.shape[1];
    s1 = step - s0 * r.shape[1];
  }
  __device__ __forceinline__ int64_t offset(const Strided& r) const { return i0 * r.strides[0] + i1 * r.strides[1]; }
  __device__ __forceinline__ void advance(const Strided& r) {
    i0 += s0;
    i1 += s1;
    if (i1 >= r.shape[1]) {
      i1 -= r.shape[1];
      ++i0;
    }
  }
};
template <> struct RedPos<0> {
  int64_t j, step;
  __device__ __forceinline__ RedPos(const Strided&, int64_t j0, int64_t s) : j(j0), step(s) {}
  __device__ __forceinline__ int64_t offset(const Strided& r) const { return r.offset(j); }
  __device__ __forceinline__ void advance(const Strided&) { j += step; }
};

// ---------------------------------------------------------------- reduce kernels
// Block = (blockDim.x, blockDim.y). Row mode: blockDim.x threads share an output (a power of two; when it
// is at most 32 they are consecutive lanes of one warp), blockDim.y outputs per block. Column mode:
// blockDim.x outputs per block, blockDim.y threads (a power of two) share each. Block (gx, s) handles the
// output groups gx, gx + gridDim.x, ... over the reduced range [s * chunk, (s + 1) * chunk); with one split
// it writes out, otherwise partial[s * K + k].
template <ReduceOp Op, typename T, int RND, bool kRow>
__global__ void __launch_bounds__(kThreads)
reduce_kernel(const T* __restrict__ x, const ReduceGeom g, int64_t K, int64_t R, int64_t chunk, int64_t n_groups,
              T* __restrict__ out, typename Reducer<Op, T>::A* __restrict__ partial) {
  using Red = Reducer<Op, T>;
  using A = typename Red::A;
  __shared__ A smem[kThreads];
  const int n_out = kRow ? blockDim.y : blockDim.x;
  const int n_red = kRow ? blockDim.x : blockDim.y;
  const int ol = kRow ? threadIdx.y : threadIdx.x;
  const int rl = kRow ? threadIdx.x : threadIdx.y;
  const int64_t jb = int64_t(blockIdx.y) * chunk;
  const int64_t je = jb + chunk < R ? jb + chunk : R;
  // The loop bound is uniform across the block, so every thread reaches the shuffles and barriers.
  for (int64_t grp = blockIdx.x; grp < n_groups; grp += gridDim.x) {
    const int64_t k = grp * n_out + ol;
    A acc = Red::identity();
    int64_t j = jb + rl;
    if (k < K && j < je) {
      const T* base = x + g.kept.offset(k);
      RedPos<RND> pos(g.red, j, n_red);
      // Four independent accumulators: four loads in flight per thread instead of one.
      A a0 = acc, a1 = acc, a2 = acc, a3 = acc;
      for (; j + 3 * int64_t(n_red) < je; j += 4 * int64_t(n_red)) {
        const T* p0 = base + pos.offset(g.red);
        pos.advance(g.red);
        const T* p1 = base + pos.offset(g.red);
        pos.advance(g.red);
        const T* p2 = base + pos.offset(g.red);
        pos.advance(g.red);
        const T* p3 = base + pos.offset(g.red);
        pos.advance(g.red);
        const A v0 = Red::from(p0), v1 = Red::from(p1), v2 = Red::from(p2), v3 = Red::from(p3);
        a0 = Red::combine(a0, v0);
        a1 = Red::combine(a1, v1);
        a2 = Red::combine(a2, v2);
        a3 = Red::combine(a3, v3);
      }
      for (; j < je; j += n_red) {
        a0 = Red::combine(a0, Red::from(base + pos.offset(g.red)));
        pos.advance(g.red);
      }
      acc = Red::combine(Red::combine(a0, a1), Red::combine(a2, a3));
    }
    if (kRow && n_red <= 32) {
      for (int o = n_red / 2; o > 0; o /= 2) acc = Red::combine(acc, __shfl_down_sync(0xffffffffu, acc, o, n_red));
    } else {
      smem[rl * n_out + ol] = acc;
      __syncthreads();
      for (int s = n_red / 2; s > 0; s /= 2) {
        if (rl < s) smem[rl * n_out + ol] = Red::combine(smem[rl * n_out + ol], smem[(rl + s) * n_out + ol]);
        __syncthreads();
      }
      acc = smem[ol];
      __syncthreads();  // the next group rewrites smem
    }
    if (rl == 0 && k < K) {
      if (partial != nullptr) partial[int64_t(blockIdx.y) * K + k] = acc;
      else out[k] = Red::finish(acc, R);
    }
  }
}

// Combines the splits' partials of each output in split order: one warp per output.
template <ReduceOp Op, typename T>
__global__ void __launch_bounds__(kThreads)
reduce_partials_kernel(const typename Reducer<Op, T>::A* __restrict__ partial, int64_t K, int64_t S, int64_t R,
                       T* __restrict__ out) {
  using Red = Reducer<Op, T>;
  using A = typename Red::A;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t k = warp; k < K; k += n_warps) {  // warp-uniform: the whole warp reaches the shuffles
    A acc = Red::identity();
    for (int64_t s = lane; s < S; s += 32) acc = Red::combine(acc, partial[s * K + k]);
    for (int o = 16; o > 0; o /= 2) acc = Red::combine(acc, __shfl_down_sync(0xffffffffu, acc, o));
    if (lane == 0) out[k] = Red::finish(acc, R);
  }
}

template <typename T>
__global__ void fill_value_kernel(T* __restrict__ out, int64_t n, double v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = store_as<T>(v);
}

// ---------------------------------------------------------------- host side
struct Axis {
  int64_t size, stride;
};

// Drops size-1 axes and merges neighbours (outer, inner) whose elements are evenly spaced across both:
// the linear index -> offset map is unchanged.
std::vector<Axis> coalesce(const std::vector<Axis>& axes) {
  std::vector<Axis> out;
  for (const Axis& a : axes) {
    if (a.size == 1) continue;
    if (!out.empty() && out.back().stride == a.stride * a.size) {
      out.back().size *= a.size;
      out.back().stride = a.stride;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

Strided strided_of(const std::vector<Axis>& axes) {
  Strided s;
  s.ndim = int(axes.size());
  for (size_t d = 0; d < axes.size(); ++d) {
    s.shape[d] = axes[d].size;
    s.strides[d] = axes[d].stride;
  }
  return s;
}

int pow2_at_least(int64_t v, int cap) {  // the smallest power of two >= v, at most cap
  int p = 1;
  while (p < v && p < cap) p *= 2;
  return p;
}

// Blocks of kThreads that fill the device once (launch_for caps its grid there).
int64_t full_grid(int device) { return launch_for(int64_t(1) << 40, device).blocks; }

// How a reduction of K outputs of R elements each is spread over threads and blocks.
struct Plan {
  dim3 block;
  int64_t n_out = 1, n_red = 1;   // outputs per block, threads per output
  int64_t groups = 1, splits = 1, chunk = 0;
  unsigned grid_x = 1;
};

Plan plan_for(bool row, int64_t K, int64_t R, int device) {
  const int64_t full = full_grid(device);
  Plan p;
  int X, Y;
  if (row) {
    if (R <= 16) X = pow2_at_least(R, 16);  // several short rows per warp, read as one contiguous run
    else if (R <= 512 || K * 32 >= full * kThreads) X = 32;  // a warp per row fills the GPU (or rows are short)
    else X = kThreads;  // few long rows: a block per row
    Y = kThreads / X;
    p.n_red = X;
    p.n_out = Y;
  } else {
    X = pow2_at_least(K, 32);
    Y = pow2_at_least(R, kThreads / X);
    if (X * Y < kThreads && K > X) X = pow2_at_least(K, kThreads / Y);  // short R: more outputs per block
    p.n_out = X;
    p.n_red = Y;
  }
  p.block = dim3(unsigned(X), unsigned(Y));
  p.groups = (K + p.n_out - 1) / p.n_out;
  // Split R across blocks when the outputs alone leave the GPU idle, keeping >= 32 elements per thread.
  const int64_t min_chunk = p.n_red * 32;
  if (p.groups < full && R > min_chunk) {
    int64_t s = std::min((full + p.groups - 1) / p.groups * 2, (R + min_chunk - 1) / min_chunk);
    p.splits = std::min<int64_t>(s, 65535);
  }
  p.chunk = std::max<int64_t>(1, (R + p.splits - 1) / p.splits);
  p.splits = std::max<int64_t>(1, (R + p.chunk - 1) / p.chunk);  // no empty split (one for R == 0)
  p.grid_x = unsigned(std::min<int64_t>(p.groups, full * 16));  // grid-stride over the rest
  return p;
}

template <ReduceOp Op, typename T, int RND, bool kRow>
void launch_reduce(const Plan& p, const T* x, const ReduceGeom& g, int64_t K, int64_t R, T* out, int device) {
  using A = typename Reducer<Op, T>::A;
  cudaStream_t st = stream(device);
  if (p.splits == 1) {
    reduce_kernel<Op, T, RND, kRow><<<dim3(p.grid_x, 1), p.block, 0, st>>>(x, g, K, R, p.chunk, p.groups, out, nullptr);
    SL_CUDA_LAUNCHED("reduce");
    return;
  }
  // Stream-ordered temporary: the caching allocator may hand the block out again once this function
  // returns, and whatever uses it next is queued on the same stream, after these two kernels.
  Tensor partial = Tensor::empty({p.splits * K}, AccDType<A>::value, Device::cuda(device));
  A* pp = partial.data<A>();
  reduce_kernel<Op, T, RND, kRow><<<dim3(p.grid_x, unsigned(p.splits)), p.block, 0, st>>>(x, g, K, R, p.chunk,
                                                                                        p.groups, out, pp);
  SL_CUDA_LAUNCHED("reduce (split)");
  const Launch l = launch_for(K * 32, device);
  reduce_partials_kernel<Op, T><<<l.blocks, l.threads, 0, st>>>(pp, K, p.splits, R, out);
  SL_CUDA_LAUNCHED("reduce (partials)");
}

template <ReduceOp Op, typename T>
void reduce_typed(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, int64_t K, int64_t R,
                  int device) {
  std::vector<Axis> kept, red;
  for (int i = 0; i < x.ndim(); ++i) (reduced[i] ? red : kept).push_back({x.shape()[i], x.strides()[i]});
  // Reduced axes in decreasing |stride|: the innermost walk is then the tightest in memory.
  std::stable_sort(red.begin(), red.end(), [](const Axis& a, const Axis& b) { return std::llabs(a.stride) > std::llabs(b.stride); });
  kept = coalesce(kept);
  red = coalesce(red);
  if (red.empty()) red.push_back({1, 0});  // R == 1: one element per row
  ReduceGeom g{strided_of(kept), strided_of(red)};
  const int64_t ks = kept.empty() ? 0 : std::llabs(kept.back().stride);
  const int64_t rs = std::llabs(red.back().stride);
  const bool row = K == 1 || (R > 1 && rs <= ks);
  const Plan p = plan_for(row, K, R, device);
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  const int rnd = red.size() == 1 ? 1 : red.size() == 2 ? 2 : 0;
  auto go = [&](auto rnd_c) {
    constexpr int N = decltype(rnd_c)::value;
    if (row) launch_reduce<Op, T, N, true>(p, xp, g, K, R, op, device);
    else launch_reduce<Op, T, N, false>(p, xp, g, K, R, op, device);
  };
  if (rnd == 1) go(std::integral_constant<int, 1>{});
  else if (rnd == 2) go(std::integral_constant<int, 2>{});
  else go(std::integral_constant<int, 0>{});
}

// ---------------------------------------------------------------- argmax / argmin
// Is (v, i) preferred to (bv, bi)? The first nan wins over everything, else the extreme value, ties to the
// lower index: exactly the CPU's sequential scan (first nan, else first max/min), in any combine order.
template <bool IsMax, typename C>
__device__ __forceinline__ bool arg_better(C v, int64_t i, C bv, int64_t bi) {
  const bool vn = is_nan(v), bn = is_nan(bv);
  if (vn || bn) return vn && (!bn || i < bi);
  return (IsMax ? v > bv : v < bv) || (v == bv && i < bi);
}

// Rows of n contiguous elements; the same block layout as the row mode of reduce_kernel. An empty
// running best has index INT64_MAX (an equal real element beats it on the index).
template <bool IsMax, typename T>
__global__ void __launch_bounds__(kThreads)
arg_reduce_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t chunk, int64_t n_groups,
                  int64_t* __restrict__ out, compute_of<T>* __restrict__ pval, int64_t* __restrict__ pidx) {
  using C = compute_of<T>;
  __shared__ C sval[kThreads];
  __shared__ int64_t sidx[kThreads];
  const int n_out = blockDim.y, n_red = blockDim.x;
  const int ol = threadIdx.y, rl = threadIdx.x;
  const int64_t jb = int64_t(blockIdx.y) * chunk;
  const int64_t je = jb + chunk < n ? jb + chunk : n;
  for (int64_t grp = blockIdx.x; grp < n_groups; grp += gridDim.x) {
    const int64_t r = grp * n_out + ol;
    C bv = IsMax ? lowest_of<C>() : highest_of<C>();
    int64_t bi = INT64_MAX;
    if (r < rows) {
      const T* p = x + r * n;
#pragma unroll 4
      for (int64_t j = jb + rl; j < je; j += n_red) {
        const C v = load(p + j);
        if (arg_better<IsMax>(v, j, bv, bi)) {
          bv = v;
          bi = j;
        }
      }
    }
    if (n_red <= 32) {
      for (int o = n_red / 2; o > 0; o /= 2) {
        const C v = __shfl_down_sync(0xffffffffu, bv, o, n_red);
        const int64_t i = __shfl_down_sync(0xffffffffu, bi, o, n_red);
        if (arg_better<IsMax>(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
    } else {
      sval[rl * n_out + ol] = bv;
      sidx[rl * n_out + ol] = bi;
      __syncthreads();
      for (int s = n_red / 2; s > 0; s /= 2) {
        if (rl < s) {
          const int a = rl * n_out + ol, b = (rl + s) * n_out + ol;
          if (arg_better<IsMax>(sval[b], sidx[b], sval[a], sidx[a])) {
            sval[a] = sval[b];
            sidx[a] = sidx[b];
          }
        }
        __syncthreads();
      }
      bv = sval[ol];
      bi = sidx[ol];
      __syncthreads();
    }
    if (rl == 0 && r < rows) {
      if (pidx != nullptr) {
        pval[int64_t(blockIdx.y) * rows + r] = bv;
        pidx[int64_t(blockIdx.y) * rows + r] = bi;
      } else {
        out[r] = bi == INT64_MAX ? 0 : bi;  // INT64_MAX only for an empty row (the front-end rejects those)
      }
    }
  }
}

template <bool IsMax, typename C>
__global__ void __launch_bounds__(kThreads)
arg_partials_kernel(const C* __restrict__ pval, const int64_t* __restrict__ pidx, int64_t rows, int64_t S,
                    int64_t* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = warp; r < rows; r += n_warps) {
    C bv = IsMax ? lowest_of<C>() : highest_of<C>();
    int64_t bi = INT64_MAX;
    for (int64_t s = lane; s < S; s += 32) {
      const C v = pval[s * rows + r];
      const int64_t i = pidx[s * rows + r];
      if (arg_better<IsMax>(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o /= 2) {
      const C v = __shfl_down_sync(0xffffffffu, bv, o);
      const int64_t i = __shfl_down_sync(0xffffffffu, bi, o);
      if (arg_better<IsMax>(v, i, bv, bi)) {
        bv = v;
        bi = i;
      }
    }
    if (lane == 0) out[r] = bi == INT64_MAX ? 0 : bi;
  }
}

template <bool IsMax, typename T>
void arg_reduce_typed(const Tensor& out, const Tensor& x, int64_t rows, int64_t n, int device) {
  using C = compute_of<T>;
  const Plan p = plan_for(true, rows, n, device);
  cudaStream_t st = stream(device);
  const T* xp = x.data<T>();
  int64_t* op = out.data<int64_t>();
  if (p.splits == 1) {
    arg_reduce_kernel<IsMax, T><<<dim3(p.grid_x, 1), p.block, 0, st>>>(xp, rows, n, p.chunk, p.groups, op, nullptr,
                                                                      nullptr);
    SL_CUDA_LAUNCHED(IsMax ? "argmax" : "argmin");
    return;
  }
  Tensor pval = Tensor::empty({p.splits * rows}, AccDType<C>::value, Device::cuda(device));
  Tensor pidx = Tensor::empty({p.splits * rows}, DType::kInt64, Device::cuda(device));
  arg_reduce_kernel<IsMax, T><<<dim3(p.grid_x, unsigned(p.splits)), p.block, 0, st>>>(
      xp, rows, n, p.chunk, p.groups, op, pval.data<C>(), pidx.data<int64_t>());
  SL_CUDA_LAUNCHED(IsMax ? "argmax (split)" : "argmin (split)");
  const Launch l = launch_for(rows * 32, device);
  arg_partials_kernel<IsMax, C><<<l.blocks, l.threads, 0, st>>>(pval.data<C>(), pidx.data<int64_t>(), rows, p.splits, op);
  SL_CUDA_LAUNCHED(IsMax ? "argmax (partials)" : "argmin (partials)");
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  int64_t K = 1, R = 1;
  for (int i = 0; i < x.ndim(); ++i) (reduced[i] ? R : K) *= x.shape()[i];
  if (K == 0) return;  // nothing to write
  const int device = x.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_NUMERIC(x.dtype(), op_name(op), [&] {
    if (R == 0) {  // empty reduction, as the CPU: sum 0, otherwise nan (the front-end rejects max/min)
      const Launch l = launch_for(K, device);
      fill_value_kernel<scalar_t><<<l.blocks, l.threads, 0, stream(device)>>>(
          out.data<scalar_t>(), K, op == ReduceOp::kSum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
      SL_CUDA_LAUNCHED("reduce (empty)");
      return;
    }
    switch (op) {
      case ReduceOp::kSum: return reduce_typed<ReduceOp::kSum, scalar_t>(out, x, reduced, K, R, device);
      case ReduceOp::kMean: return reduce_typed<ReduceOp::kMean, scalar_t>(out, x, reduced, K, R, device);
      case ReduceOp::kMax: return reduce_typed<ReduceOp::kMax, scalar_t>(out, x, reduced, K, R, device);
      case ReduceOp::kMin: return reduce_typed<ReduceOp::kMin, scalar_t>(out, x, reduced, K, R, device);
    }
  });
}

void arg_reduce(bool is_max, const Tensor& out, const Tensor& x) {
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  if (rows == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_NUMERIC(x.dtype(), is_max ? "argmax" : "argmin", [&] {
    if (is_max) arg_reduce_typed<true, scalar_t>(out, x, rows, n, device);
    else arg_reduce_typed<false, scalar_t>(out, x, rows, n, device);
  });
}

}  // namespace sl::cuda
