// The cuDNN loader (see cudnn.h): its entry points (cuda/runtime_library.h opens it on first use), the on/off
// switch, per-device handles, checked statuses.
#include "cuda/cudnn.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/allocator.h"
#include "cuda/context.h"
#include "cuda/runtime.h"
#include "cuda/runtime_library.h"

namespace sl::cuda {
namespace {

constexpr int kCudnnMajor = 9;  // the status numbering and the legacy API declared in cudnn.h
constexpr const char* kSoname = "libcudnn.so.9";

std::string install_hint() {
  return "install it with: pip install nvidia-cudnn-cu13 (CUDA 13 builds) or nvidia-cudnn-cu12 (CUDA 12 builds), "
         "or put the lib folder of a cuDNN 9 install on LD_LIBRARY_PATH";
}

// SINGA_LITE_CUDNN is read once, at the first question; set_cudnn_enabled overrides it (tests, benchmarks).
std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{[] {
    const char* v = std::getenv("SINGA_LITE_CUDNN");
    return (v && std::strcmp(v, "0") == 0) ? 0 : 1;
  }()};
  return flag;
}

// The library and the entry points bound from it. bind() runs once, under the loader's lock; once loaded(),
// api and version never change.
class Cudnn final : public RuntimeLibrary {
 public:
  Cudnn() : RuntimeLibrary(kSoname, "cudnnCreate") {}
  CudnnApi api{};
  int version = 0;
  using RuntimeLibrary::loaded;

 private:
#define SL_CUDNN_RESOLVE(name) \
  if (!missing && !resolve(lib, #name, a.name)) missing = #name

  bool bind(void* lib, const std::string& path, std::string* why) override {
    CudnnApi a{};
    const char* missing = nullptr;
    SL_CUDNN_RESOLVE(cudnnGetVersion);
    SL_CUDNN_RESOLVE(cudnnGetErrorString);
    SL_CUDNN_RESOLVE(cudnnGetLastErrorString);
    SL_CUDNN_RESOLVE(cudnnCreate);
    SL_CUDNN_RESOLVE(cudnnDestroy);
    SL_CUDNN_RESOLVE(cudnnSetStream);
    SL_CUDNN_RESOLVE(cudnnCreateTensorDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetTensor4dDescriptorEx);
    SL_CUDNN_RESOLVE(cudnnDestroyTensorDescriptor);
    SL_CUDNN_RESOLVE(cudnnCreateFilterDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetFilter4dDescriptor);
    SL_CUDNN_RESOLVE(cudnnDestroyFilterDescriptor);
    SL_CUDNN_RESOLVE(cudnnCreateConvolutionDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetConvolution2dDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetConvolutionGroupCount);
    SL_CUDNN_RESOLVE(cudnnSetConvolutionMathType);
    SL_CUDNN_RESOLVE(cudnnDestroyConvolutionDescriptor);
    SL_CUDNN_RESOLVE(cudnnCreatePoolingDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetPooling2dDescriptor);
    SL_CUDNN_RESOLVE(cudnnDestroyPoolingDescriptor);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionForwardAlgorithm_v7);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionForwardWorkspaceSize);
    SL_CUDNN_RESOLVE(cudnnConvolutionForward);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionBackwardDataAlgorithm_v7);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionBackwardDataWorkspaceSize);
    SL_CUDNN_RESOLVE(cudnnConvolutionBackwardData);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionBackwardFilterAlgorithm_v7);
    SL_CUDNN_RESOLVE(cudnnGetConvolutionBackwardFilterWorkspaceSize);
    SL_CUDNN_RESOLVE(cudnnConvolutionBackwardFilter);
    SL_CUDNN_RESOLVE(cudnnPoolingForward);
    SL_CUDNN_RESOLVE(cudnnPoolingBackward);
    SL_CUDNN_RESOLVE(cudnnBatchNormalizationForwardTraining);
    SL_CUDNN_RESOLVE(cudnnBatchNormalizationForwardInference);
    SL_CUDNN_RESOLVE(cudnnBatchNormalizationBackward);
    SL_CUDNN_RESOLVE(cudnnSetTensorNdDescriptor);
    SL_CUDNN_RESOLVE(cudnnGetTensorNdDescriptor);
    SL_CUDNN_RESOLVE(cudnnCreateDropoutDescriptor);
    SL_CUDNN_RESOLVE(cudnnDestroyDropoutDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetDropoutDescriptor);
    SL_CUDNN_RESOLVE(cudnnCreateRNNDescriptor);
    SL_CUDNN_RESOLVE(cudnnDestroyRNNDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetRNNDescriptor_v8);
    SL_CUDNN_RESOLVE(cudnnGetRNNWeightSpaceSize);
    SL_CUDNN_RESOLVE(cudnnGetRNNWeightParams);
    SL_CUDNN_RESOLVE(cudnnGetRNNTempSpaceSizes);
    SL_CUDNN_RESOLVE(cudnnCreateRNNDataDescriptor);
    SL_CUDNN_RESOLVE(cudnnDestroyRNNDataDescriptor);
    SL_CUDNN_RESOLVE(cudnnSetRNNDataDescriptor);
    SL_CUDNN_RESOLVE(cudnnRNNForward);
    SL_CUDNN_RESOLVE(cudnnRNNBackwardData_v8);
    SL_CUDNN_RESOLVE(cudnnRNNBackwardWeights_v8);
    if (missing) {
      *why = str(path, " has no ", missing, " (", dl_error(), ")");
      return false;
    }
    // cudnnGetVersion needs neither a GPU nor a handle.
    const int v = int(a.cudnnGetVersion());
    if (v / 10000 != kCudnnMajor) {
      *why = str(path, " is cuDNN ", v / 10000, ".", v / 100 % 100, "; singa_lite uses cuDNN ", kCudnnMajor, ".x");
      return false;
    }
    api = a;
    version = v;
    return true;
  }

#undef SL_CUDNN_RESOLVE

  std::string describe_failure(bool opened_any, const std::vector<std::string>& tried) const override {
    std::string why;
    for (const auto& t : tried) why += (why.empty() ? "" : "; ") + t;
    return str(opened_any ? "unusable: " : "not found: ", "convolution, pooling, batch norm and RNNs through cuDNN need ",
               kSoname, "; ", install_hint(), ". Tried: ", why);
  }
};

Cudnn& cudnn() {
  static Cudnn* l = new Cudnn();  // never destroyed: handles may be used while tensors are freed at exit
  return *l;
}

struct Handles {
  std::mutex mutex;                                 // guards the two vectors
  std::vector<cudnnHandle_t> by_device;
  std::vector<std::unique_ptr<std::mutex>> in_use;  // per device: held by a CudnnHandle lease
};

Handles& handles() {
  static Handles* h = new Handles();  // never destroyed, like the streams they are bound to
  return *h;
}

}  // namespace

void set_cudnn_library_dir(const std::string& dir) { cudnn().set_dir(dir); }

const CudnnApi& cudnn_api() {
  const std::string failure = cudnn().ensure_loaded();
  if (!failure.empty()) throw CudaError(str("cuDNN ", failure));
  return cudnn().api;
}

void set_cudnn_enabled(bool enabled) { enabled_flag().store(enabled ? 1 : 0); }
bool cudnn_enabled() { return enabled_flag().load() != 0; }

std::string cudnn_unavailable_reason() {
  if (!cudnn_enabled())
    return "switched off (SINGA_LITE_CUDNN=0 or set_cudnn_enabled(False)); the own kernels run instead";
  // Asked once: the visible GPUs do not change during a process (CUDA_VISIBLE_DEVICES is read at start-up). The
  // library may be loaded without a GPU (build_info asks for its version), so both are checked on every question;
  // once loaded, ensure_loaded() is one atomic load.
  static const bool has_gpu = device_count() > 0;
  if (!has_gpu) return str("no GPU: ", unavailable_reason());
  const std::string failure = cudnn().ensure_loaded();
  return failure.empty() ? "" : str("cuDNN ", failure);
}

int cudnn_version() { return cudnn().ensure_loaded().empty() ? cudnn().version : 0; }

std::string cudnn_status() {
  const std::string failure = cudnn().ensure_loaded();
  return failure.empty() ? str("loaded ", cudnn().path()) : failure;
}

const char* cudnn_status_name(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDART: return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
  }
  // cuDNN 9 refines each category (2000 BAD_PARAM, 3000 NOT_SUPPORTED, ...) with sub-codes; name the category.
  switch (int(status) / 1000) {
    case 1: return "CUDNN_STATUS_NOT_INITIALIZED (category)";
    case 2: return "CUDNN_STATUS_BAD_PARAM (category)";
    case 3: return "CUDNN_STATUS_NOT_SUPPORTED (category)";
    case 4: return "CUDNN_STATUS_INTERNAL_ERROR (category)";
    case 5: return "CUDNN_STATUS_EXECUTION_FAILED (category)";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

void cudnn_check(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string detail;
  const Cudnn& l = cudnn();
  if (l.loaded()) {  // api immutable once loaded
    const char* s = l.api.cudnnGetErrorString(status);
    if (s && s[0]) detail = str(": ", s);
    // The last error's text says which argument was wrong (cuDNN 9 keeps it per thread).
    char last[512] = {0};
    l.api.cudnnGetLastErrorString(last, sizeof(last));
    if (last[0]) detail += str(" [", last, "]");
  }
  throw CudaError(str(call, " failed: ", cudnn_status_name(status), " (", int(status), ")", detail, " (", file, ":",
                      line, ")"));
}

CudnnHandle cudnn_handle(int device) {
  SL_ASSERT(device >= 0);
  const CudnnApi& api = cudnn_api();
  Handles& h = handles();
  std::mutex* in_use = nullptr;
  cudnnHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    if (int(h.by_device.size()) <= device) {
      h.by_device.resize(size_t(device) + 1, nullptr);
      h.in_use.resize(size_t(device) + 1);
    }
    if (!h.in_use[size_t(device)]) h.in_use[size_t(device)] = std::make_unique<std::mutex>();
    in_use = h.in_use[size_t(device)].get();
    handle = h.by_device[size_t(device)];
    if (!handle) {
      cudaStream_t st = stream(device);
      DeviceGuard guard(device);
      // A handle takes device memory, which the cache may be holding: one more try with it emptied.
      cudnn_check(retry_if_out_of_memory(device, [&] { return api.cudnnCreate(&handle); },
                                         [](cudnnStatus_t s) { return s != CUDNN_STATUS_SUCCESS; }),
                  "cudnnCreate", __FILE__, __LINE__);
      try {
        cudnn_check(api.cudnnSetStream(handle, st), "cudnnSetStream", __FILE__, __LINE__);
      } catch (...) {
        api.cudnnDestroy(handle);
        throw;
      }
      h.by_device[size_t(device)] = handle;
    }
  }
  return CudnnHandle(handle, std::unique_lock<std::mutex>(*in_use));  // waits while another thread holds it
}

}  // namespace sl::cuda
