// The cuDNN loader (see cudnn.h): dlopen/dlsym on first use, the on/off switch, per-device handles, checked statuses.
#include "cuda/cudnn.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/context.h"
#include "cuda/runtime.h"

namespace sl::cuda {
namespace {

constexpr int kCudnnMajor = 9;  // the status numbering and the legacy API declared in cudnn.h
constexpr const char* kSoname = "libcudnn.so.9";

std::string install_hint() {
  return "install it with: pip install nvidia-cudnn-cu13 (CUDA 13 builds) or nvidia-cudnn-cu12 (CUDA 12 builds), "
         "or put the lib folder of a cuDNN 9 install on LD_LIBRARY_PATH";
}

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string last_dlerror() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

struct Loader {
  std::mutex mutex;
  std::string dir;
  bool tried = false;
  std::atomic<bool> loaded{false};  // set once, under mutex; then api/path/version never change
  std::string path;
  std::string failure;
  CudnnApi api{};
  int version = 0;
};

Loader& loader() {
  static Loader* l = new Loader();  // never destroyed: handles may be used while tensors are freed at exit
  return *l;
}

// SINGA_LITE_CUDNN is read once, at the first question; set_cudnn_enabled overrides it (tests, benchmarks).
std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{[] {
    const char* v = std::getenv("SINGA_LITE_CUDNN");
    return (v && std::strcmp(v, "0") == 0) ? 0 : 1;
  }()};
  return flag;
}

template <typename Fn>
bool resolve(void* lib, const char* name, Fn& fn) {
  dlerror();
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return fn != nullptr;
}

#define SL_CUDNN_RESOLVE(name) \
  if (!missing && !resolve(lib, #name, api.name)) missing = #name

bool bind(Loader& l, void* lib, const std::string& path, std::string* why) {
  CudnnApi api{};
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
  if (missing) {
    *why = str(path, " has no ", missing, " (", last_dlerror(), ")");
    return false;
  }
  // cudnnGetVersion needs neither a GPU nor a handle.
  const int v = int(api.cudnnGetVersion());
  if (v / 10000 != kCudnnMajor) {
    *why = str(path, " is cuDNN ", v / 10000, ".", v / 100 % 100, "; singa_lite uses cuDNN ", kCudnnMajor, ".x");
    return false;
  }
  l.api = api;
  l.version = v;
  return true;
}

#undef SL_CUDNN_RESOLVE

std::string path_of(const void* symbol, const std::string& fallback) {
  Dl_info info{};
  if (symbol && dladdr(symbol, &info) != 0 && info.dli_fname && info.dli_fname[0]) return info.dli_fname;
  return fallback;
}

// One load attempt; the caller holds l.mutex. The set folder first, then the plain soname.
void attempt(Loader& l) {
  l.tried = true;
  l.failure.clear();
  std::vector<std::string> tried;
  bool opened_any = false;
  std::vector<std::string> candidates;
  if (!l.dir.empty()) {
    const std::string in_dir = l.dir + "/" + kSoname;
    if (is_file(in_dir)) candidates.push_back(in_dir);
    else tried.push_back(str(in_dir, ": no such file"));
  }
  candidates.push_back(kSoname);
  for (const std::string& name : candidates) {
    // RTLD_LOCAL: our dlsym'd pointers are all we need; cuDNN finds its sub-libraries from its own folder.
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried.push_back(last_dlerror());
      continue;
    }
    opened_any = true;
    const std::string path = path_of(dlsym(lib, "cudnnCreate"), name);
    std::string why;
    if (!bind(l, lib, path, &why)) {
      tried.push_back(why);
      dlclose(lib);
      continue;
    }
    l.path = path;
    l.loaded.store(true, std::memory_order_release);
    return;
  }
  std::string why;
  for (const auto& t : tried) why += (why.empty() ? "" : "; ") + t;
  l.failure = str(opened_any ? "unusable: " : "not found: ", "convolution, pooling and batch norm through cuDNN need ",
                  kSoname, "; ", install_hint(), ". Tried: ", why);
}

std::string ensure_loaded() {
  Loader& l = loader();
  if (l.loaded.load(std::memory_order_acquire)) return "";
  std::lock_guard<std::mutex> lock(l.mutex);
  if (!l.loaded && !l.tried) attempt(l);
  return l.loaded ? "" : l.failure;
}

struct Handles {
  std::mutex mutex;
  std::vector<cudnnHandle_t> by_device;
};

Handles& handles() {
  static Handles* h = new Handles();  // never destroyed, like the streams they are bound to
  return *h;
}

}  // namespace

void set_cudnn_library_dir(const std::string& dir) {
  Loader& l = loader();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (l.loaded) return;
  l.dir = d;
  l.tried = false;
}

const CudnnApi& cudnn_api() {
  const std::string failure = ensure_loaded();
  if (!failure.empty()) throw CudaError(str("cuDNN ", failure));
  return loader().api;
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
  const std::string failure = ensure_loaded();
  return failure.empty() ? "" : str("cuDNN ", failure);
}

int cudnn_version() { return ensure_loaded().empty() ? loader().version : 0; }

std::string cudnn_status() {
  const std::string failure = ensure_loaded();
  return failure.empty() ? str("loaded ", loader().path) : failure;
}

const char* cudnn_status_name(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
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
  const Loader& l = loader();
  if (l.loaded.load(std::memory_order_acquire)) {  // api immutable once loaded
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

cudnnHandle_t cudnn_handle(int device) {
  SL_ASSERT(device >= 0);
  const CudnnApi& api = cudnn_api();
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (int(h.by_device.size()) <= device) h.by_device.resize(size_t(device) + 1, nullptr);
  if (h.by_device[size_t(device)]) return h.by_device[size_t(device)];
  cudaStream_t st = stream(device);
  DeviceGuard guard(device);
  cudnnHandle_t handle = nullptr;
  cudnn_check(api.cudnnCreate(&handle), "cudnnCreate", __FILE__, __LINE__);
  try {
    cudnn_check(api.cudnnSetStream(handle, st), "cudnnSetStream", __FILE__, __LINE__);
  } catch (...) {
    api.cudnnDestroy(handle);
    throw;
  }
  h.by_device[size_t(device)] = handle;
  return handle;
}

}  // namespace sl::cuda
