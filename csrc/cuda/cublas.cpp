// The cuBLAS loader (see cublas.h): dlopen/dlsym on first use, per-device handles, checked statuses.
#include "cuda/cublas.h"

#include <cuda_runtime_api.h>  // CUDART_VERSION
#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/context.h"

namespace sl::cuda {
namespace {

constexpr int kCudaMajor = CUDART_VERSION / 1000;

std::string soname() { return str("libcublas.so.", kCudaMajor); }
std::string lt_soname() { return str("libcublasLt.so.", kCudaMajor); }

std::string install_hint() {
  if (kCudaMajor == 13 || kCudaMajor == 12)
    return str("install it with: pip install 'singa_lite[cuda", kCudaMajor, "]' (the nvidia-cublas",
               kCudaMajor == 12 ? "-cu12" : "", " wheel), or put the lib folder of a CUDA ", kCudaMajor,
               ".x toolkit on LD_LIBRARY_PATH");
  return str("install cuBLAS for CUDA ", kCudaMajor, ".x and put its lib folder on LD_LIBRARY_PATH");
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
  std::string dir;          // from set_library_dir
  bool tried = false;       // a load was attempted since dir last changed
  std::atomic<bool> loaded{false};  // set once, under mutex; then api/path/version never change
  void* library = nullptr;  // dlopen handle, never closed
  std::string path;         // file the entry points come from
  std::string failure;      // "not found: ..." / "unusable: ..." when the last attempt failed
  CublasApi api{};
  int version = 0;
};

Loader& loader() {
  static Loader* l = new Loader();  // never destroyed: used while tensors are freed at interpreter exit
  return *l;
}

template <typename Fn>
bool resolve(void* lib, const char* name, Fn& fn) {
  dlerror();
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return fn != nullptr;
}

// Fills l.api from an opened library; on a missing required symbol returns false and says which in *why.
bool bind(Loader& l, void* lib, const std::string& path, std::string* why) {
  CublasApi api{};
  const char* missing = nullptr;
  if (!resolve(lib, "cublasCreate_v2", api.cublasCreate_v2)) missing = "cublasCreate_v2";
  else if (!resolve(lib, "cublasDestroy_v2", api.cublasDestroy_v2)) missing = "cublasDestroy_v2";
  else if (!resolve(lib, "cublasSetStream_v2", api.cublasSetStream_v2)) missing = "cublasSetStream_v2";
  else if (!resolve(lib, "cublasGetVersion_v2", api.cublasGetVersion_v2)) missing = "cublasGetVersion_v2";
  else if (!resolve(lib, "cublasSgemmStridedBatched", api.cublasSgemmStridedBatched))
    missing = "cublasSgemmStridedBatched";
  else if (!resolve(lib, "cublasDgemmStridedBatched", api.cublasDgemmStridedBatched))
    missing = "cublasDgemmStridedBatched";
  else if (!resolve(lib, "cublasGemmStridedBatchedEx", api.cublasGemmStridedBatchedEx))
    missing = "cublasGemmStridedBatchedEx";
  if (missing) {
    *why = str(path, " has no ", missing, " (", last_dlerror(), ")");
    return false;
  }
  resolve(lib, "cublasSetMathMode", api.cublasSetMathMode);          // optional
  resolve(lib, "cublasGetStatusString", api.cublasGetStatusString);  // optional
  l.api = api;
  // The version query needs neither a GPU nor a handle (cuBLAS ignores the handle argument); should a
  // release insist on one, cublasGetProperty gives the same number.
  int v = 0;
  if (api.cublasGetVersion_v2(nullptr, &v) == CUBLAS_STATUS_SUCCESS && v > 0) {
    l.version = v;
  } else {
    cublasStatus_t (*get_property)(libraryPropertyType, int*) = nullptr;
    int major = 0, minor = 0, patch = 0;
    if (resolve(lib, "cublasGetProperty", get_property) && get_property(MAJOR_VERSION, &major) == 0 &&
        get_property(MINOR_VERSION, &minor) == 0 && get_property(PATCH_LEVEL, &patch) == 0)
      l.version = major * 10000 + minor * 100 + patch;
  }
  return true;
}

// The path of the file a loaded symbol lives in (resolves what the plain soname found).
std::string path_of(const void* symbol, const std::string& fallback) {
  Dl_info info{};
  if (symbol && dladdr(symbol, &info) != 0 && info.dli_fname && info.dli_fname[0]) return info.dli_fname;
  return fallback;
}

// One load attempt; the caller holds l.mutex. Candidates in order: the set folder, then the plain soname;
// the first that opens and has every required entry point wins.
void attempt(Loader& l) {
  l.tried = true;
  l.failure.clear();
  std::vector<std::string> tried;  // why each candidate was passed over
  bool opened_any = false;
  std::vector<std::string> candidates;
  if (!l.dir.empty()) {
    const std::string in_dir = l.dir + "/" + soname();
    if (is_file(in_dir)) {
      // libcublas needs libcublasLt of the same release; the wheel's copy carries $ORIGIN, but load it from
      // the same folder first so that no other libcublasLt on the search path is picked up instead.
      const std::string lt = l.dir + "/" + lt_soname();
      if (is_file(lt)) dlopen(lt.c_str(), RTLD_NOW | RTLD_LOCAL);  // a failure shows in the next dlopen
      candidates.push_back(in_dir);
    } else {
      tried.push_back(str(in_dir, ": no such file"));
    }
  }
  candidates.push_back(soname());
  for (const std::string& name : candidates) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried.push_back(last_dlerror());  // dlerror's text names the file
      continue;
    }
    opened_any = true;
    const std::string path = path_of(dlsym(lib, "cublasCreate_v2"), name);
    std::string why;
    if (!bind(l, lib, path, &why)) {
      tried.push_back(why);
      dlclose(lib);
      continue;
    }
    l.path = path;
    l.library = lib;
    l.loaded.store(true, std::memory_order_release);
    return;
  }
  std::string why;
  for (const auto& t : tried) why += (why.empty() ? "" : "; ") + t;
  if (opened_any)
    l.failure = str("unusable: GPU matmul needs cuBLAS ", kCudaMajor, ".x (", soname(), ") with the entry points ",
                    "singa_lite uses; ", install_hint(), ". Tried: ", why);
  else
    l.failure = str("not found: GPU matmul needs cuBLAS (", soname(), "); ", install_hint(), ". Tried: ", why);
}

// Loads if needed. Returns "" when loaded, else why not.
std::string ensure_loaded() {
  Loader& l = loader();
  if (l.loaded.load(std::memory_order_acquire)) return "";
  std::lock_guard<std::mutex> lock(l.mutex);
  if (!l.loaded && !l.tried) attempt(l);
  return l.loaded ? "" : l.failure;
}

struct Handles {
  std::mutex mutex;
  std::vector<cublasHandle_t> by_device;  // nullptr until first use
};

Handles& handles() {
  static Handles* h = new Handles();  // never destroyed, like the streams they are bound to
  return *h;
}

}  // namespace

void set_library_dir(const std::string& dir) {
  Loader& l = loader();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (l.loaded) return;
  l.dir = d;
  l.tried = false;  // look again at the next use, in this folder first
}

const CublasApi& cublas_api() {
  const std::string failure = ensure_loaded();
  if (!failure.empty()) throw CudaError(str("cuBLAS ", failure));
  return loader().api;  // immutable once loaded
}

int cublas_version() {
  return ensure_loaded().empty() ? loader().version : 0;
}

std::string cublas_status() {
  const std::string failure = ensure_loaded();
  return failure.empty() ? str("loaded ", loader().path) : failure;
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::string detail;
  const Loader& l = loader();
  if (l.loaded.load(std::memory_order_acquire) && l.api.cublasGetStatusString) {  // api immutable once loaded
    const char* s = l.api.cublasGetStatusString(status);
    if (s && s[0]) detail = str(": ", s);
  }
  std::string hint;
  if (status == CUBLAS_STATUS_NOT_INITIALIZED)
    hint = " (no usable GPU or driver, or the driver is older than this cuBLAS needs)";
  else if (status == CUBLAS_STATUS_ARCH_MISMATCH)
    hint = " (this GPU's architecture is not supported by this cuBLAS or operation)";
  throw CudaError(str(call, " failed: ", cublas_status_name(status), " (", int(status), ")", detail, hint, " (",
                      file, ":", line, ")"));
}

cublasHandle_t cublas_handle(int device) {
  SL_ASSERT(device >= 0);
  const CublasApi& api = cublas_api();  // throws first when cuBLAS cannot be loaded
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (int(h.by_device.size()) <= device) h.by_device.resize(size_t(device) + 1, nullptr);
  if (h.by_device[size_t(device)]) return h.by_device[size_t(device)];
  cudaStream_t st = stream(device);  // the device's compute stream (created on first use)
  DeviceGuard guard(device);
  cublasHandle_t handle = nullptr;
  cublas_check(api.cublasCreate_v2(&handle), "cublasCreate_v2", __FILE__, __LINE__);
  try {
    cublas_check(api.cublasSetStream_v2(handle, st), "cublasSetStream_v2", __FILE__, __LINE__);
    // Full-precision math: no TF32 for float32; float16 reductions stay in float32.
    if (api.cublasSetMathMode)
      cublas_check(api.cublasSetMathMode(
                       handle, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                   "cublasSetMathMode", __FILE__, __LINE__);
  } catch (...) {
    api.cublasDestroy_v2(handle);
    throw;
  }
  h.by_device[size_t(device)] = handle;
  return handle;
}

}  // namespace sl::cuda
