// The strided loop under every element-wise CPU kernel: N operands of one shape (inputs already
// broadcast, so a broadcast axis has stride 0). Size-1 axes are dropped and axes that are contiguous
// across all operands are merged, so most calls become one flat loop the compiler vectorises.
// The flat index range is split evenly over OpenMP threads once it is large enough to pay.
#pragma once
#include <omp.h>

#include <algorithm>
#include <array>

#include "core/tensor.h"

namespace sl::cpu {

constexpr int64_t kParallelGrain = 32768;  // elements per thread below which threads cost more than they save

// Threads the kernels may use: omp_get_max_threads(), or 1 in a child forked after this process used its
// OpenMP pool (libgomp's pool does not survive fork; see cpu/threads.cpp).
int max_threads();

inline int threads_for(int64_t work) {
  if (work < 2 * kParallelGrain) return 1;
  return int(std::min<int64_t>(max_threads(), work / kParallelGrain));
}

// Runs chunk(ctx, c) for every c in [0, nchunks) on up to nt threads, the calling thread included, and returns
// when all are done (cpu/threads.cpp). Chunks are claimed one at a time, and the caller waits only for chunks
// that another thread has claimed: a worker that the OS has not scheduled yet (the cores are shared with
// other processes) is not waited for; the caller takes its chunks. An OpenMP parallel region waits for every
// thread of its team to arrive, so on busy cores a short op waits for whole scheduler time slices
// (docs/benchmarks/cpu_core.md, "Measurements behind the kernels' design").
void run_chunks(int nt, int64_t nchunks, void (*chunk)(void*, int64_t), void* ctx);

// Runs fn(begin, end) over [0, total) split across threads. The range is cut into about four chunks per
// thread (aligned to 64 items for element-wise work) handed out dynamically: a thread whose core is
// shared with another process simply takes fewer chunks instead of holding everyone up.
template <typename F>
void parallel_range(int64_t total, F&& fn, int64_t work_per_item = 1) {
  int nt = threads_for(total * work_per_item);
  if (nt <= 1) {
    if (total > 0) fn(int64_t(0), total);
    return;
  }
  int64_t chunk = (total + 4 * nt - 1) / (4 * nt);
  if (work_per_item == 1) chunk = (chunk + 63) / 64 * 64;
  const int64_t nchunks = (total + chunk - 1) / chunk;
  auto body = [&](int64_t c) { fn(c * chunk, std::min(total, (c + 1) * chunk)); };
  run_chunks(nt, nchunks, [](void* b, int64_t c) { (*static_cast<decltype(body)*>(b))(c); }, &body);
}

template <int N>
struct StridedLoop {
  int ndim = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];  // bytes
  char* base[N];

  explicit StridedLoop(const std::array<const Tensor*, N>& ts) {
    const Shape& sh = ts[0]->shape();
    numel = numel_of(sh);
    for (int k = 0; k < N; ++k) base[k] = static_cast<char*>(ts[k]->data_ptr());
    // An empty tensor may have huge sizes whose byte strides overflow (UBSan: one_hot of 2**62 classes on
    // no rows); nothing is visited, so no geometry is needed.
    for (size_t d = 0; d < sh.size() && numel != 0; ++d) {
      if (sh[d] == 1) continue;
      bool merge = ndim > 0;
      for (int k = 0; k < N && merge; ++k)
        merge = strides[k][ndim - 1] == ts[k]->strides()[d] * int64_t(ts[k]->itemsize()) * sh[d];
      if (merge) {
        shape[ndim - 1] *= sh[d];
        for (int k = 0; k < N; ++k) strides[k][ndim - 1] = ts[k]->strides()[d] * int64_t(ts[k]->itemsize());
      } else {
        shape[ndim] = sh[d];
        for (int k = 0; k < N; ++k) strides[k][ndim] = ts[k]->strides()[d] * int64_t(ts[k]->itemsize());
        ++ndim;
      }
    }
    if (ndim == 0) {
      ndim = 1;
      shape[0] = 1;
      for (int k = 0; k < N; ++k) strides[k][0] = 0;
    }
  }
};

// Calls row(ptrs, inner_strides_in_bytes, n) for runs along the innermost axis.
template <int N, typename Row>
void for_each_row(const StridedLoop<N>& L, Row&& row) {
  if (L.numel == 0) return;
  const int inner = L.ndim - 1;
  int64_t inner_strides[N];
  for (int k = 0; k < N; ++k) inner_strides[k] = L.strides[k][inner];
  parallel_range(L.numel, [&](int64_t begin, int64_t end) {
    int64_t idx[kMaxDims];
    int64_t rem = begin;
    for (int d = inner; d >= 0; --d) {
      idx[d] = rem % L.shape[d];
      rem /= L.shape[d];
    }
    while (begin < end) {
      char* p[N];
      for (int k = 0; k < N; ++k) {
        p[k] = L.base[k];
        for (int d = 0; d <= inner; ++d) p[k] += idx[d] * L.strides[k][d];
      }
      int64_t n = std::min(L.shape[inner] - idx[inner], end - begin);
      row(p, inner_strides, n);
      begin += n;
      idx[inner] += n;
      for (int d = inner; d > 0 && idx[d] == L.shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

// Converts between element types; half and bfloat16 go through float, bool is "!= 0".
template <typename Out, typename In>
inline Out convert(In v) {
  if constexpr (std::is_same_v<Out, In>) return v;
  else if constexpr (is_half_like_v<Out> && std::is_same_v<In, double>) return Out(v);  // one rounding
  else if constexpr (is_half_like_v<Out>) return Out(static_cast<float>(v));
  else if constexpr (is_half_like_v<In>) return convert<Out>(static_cast<float>(v));
  else if constexpr (std::is_same_v<Out, bool>) return v != In(0);
  else return static_cast<Out>(v);
}

}  // namespace sl::cpu
