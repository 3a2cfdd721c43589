// The cuDNN convolution algorithm choice, cached, and the walk down its candidates when memory is short.
//
// Asking cuDNN's heuristic (cudnnGetConvolution*Algorithm_v7 for 8 results, then a workspace size per result) costs
// host time on every call; a ResNet-18 training step makes some 60 convolution calls, each asking again. The answer
// depends only on what the key below holds, so it is asked once per key and kept: a list of candidates (algorithm,
// workspace bytes), best first, the always-possible fallback last. A call takes the first candidate whose workspace
// can be had; when the GPU is short of memory it goes down the list (the later ones usually need less) instead of
// failing on the first.
//
// Plain C++ (no CUDA or cuDNN types: algorithms are ints here), so that the key, the cache and the walk are compiled
// in every build and tested on the CPU (tests/unit/test_conv_plan.py through _core._ConvPlanCache); cudnn_ops.cpp
// is the only user on a GPU.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace sl::cuda {

enum class ConvDirection : int { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

// Everything the heuristic's answer and the workspace sizes depend on. The output shape follows from x, w and the
// geometry; the math type and compute type follow from the dtype (cudnn_ops.cpp); descriptors are always packed NCHW.
struct ConvKey {
  int device = 0;
  int dtype = 0;  // DType
  ConvDirection direction = ConvDirection::kForward;
  std::array<int64_t, 4> x{}, w{};
  std::array<int64_t, 2> stride{}, padding{}, dilation{};
  int64_t groups = 1;

  bool operator==(const ConvKey& o) const {
    return device == o.device && dtype == o.dtype && direction == o.direction && x == o.x && w == o.w &&
           stride == o.stride && padding == o.padding && dilation == o.dilation && groups == o.groups;
  }
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&h](int64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= uint64_t(v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
      }
    };
    mix(k.device);
    mix(k.dtype);
    mix(int64_t(k.direction));
    for (int64_t v : k.x) mix(v);
    for (int64_t v : k.w) mix(v);
    for (const auto* a : {&k.stride, &k.padding, &k.dilation})
      for (int64_t v : *a) mix(v);
    mix(k.groups);
    return size_t(h);
  }
};

struct AlgoChoice {
  int algo = 0;
  size_t workspace = 0;  // bytes
};

// Thread-safe. Bounded: a job whose shapes keep changing (a ragged last batch per epoch is two keys per conv, not
// more) cannot grow it without end; at `capacity` entries it starts over, which only costs heuristic queries again.
class ConvPlanCache {
 public:
  struct Stats {
    size_t entries = 0, hits = 0, misses = 0;
  };

  explicit ConvPlanCache(size_t capacity = 4096) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The candidates for `key`: the cached list, else make()'s, stored. make() runs without the lock held (it asks
  // cuDNN); two threads missing the same key at once both ask, and the first answer stays.
  std::vector<AlgoChoice> get(const ConvKey& key, const std::function<std::vector<AlgoChoice>()>& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) {
        ++stats_.hits;
        return it->second;
      }
      ++stats_.misses;
    }
    std::vector<AlgoChoice> made = make();
    std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= capacity_ && plans_.find(key) == plans_.end()) plans_.clear();
    return plans_.emplace(key, std::move(made)).first->second;
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Stats s = stats_;
    s.entries = plans_.size();
    return s;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.clear();
  }

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  std::unordered_map<ConvKey, std::vector<AlgoChoice>, ConvKeyHash> plans_;
  Stats stats_;
};

// Tries the candidates in order: attempt(c) returns true when the call ran with c, false when c could not run for
// lack of GPU memory (its workspace, or cuDNN's own allocation after the cache was emptied), and throws for any
// other failure. Returns the index of the candidate that ran; throws OutOfMemory naming `op` when none could.
template <typename Attempt>
size_t run_first_fitting(const std::vector<AlgoChoice>& candidates, Attempt&& attempt, const char* op,
                         int device) {
  SL_CHECK(!candidates.empty(), InternalError, op, ": no convolution algorithm to try");
  for (size_t i = 0; i < candidates.size(); ++i)
    if (attempt(candidates[i])) return i;
  size_t least = candidates[0].workspace;
  for (const AlgoChoice& c : candidates) least = c.workspace < least ? c.workspace : least;
  throw OutOfMemory(str(op, ": out of GPU memory on cuda:", device, ": none of the ", candidates.size(),
                        " cuDNN algorithms for this convolution could run (the smallest workspace is ", least,
                        " bytes). Free tensors you no longer need, use a smaller batch, or switch cuDNN off "
                        "(SINGA_LITE_CUDNN=0) to use im2col + GEMM"));
}

}  // namespace sl::cuda
