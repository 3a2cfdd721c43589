// Opening a library at run time (see runtime_library.h): candidates, dlopen, the load state.
#include "cuda/runtime_library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include "core/errors.h"

namespace sl::cuda {
namespace {

// The path of the file a loaded symbol lives in (resolves what the plain soname found).
std::string path_of(const void* symbol, const std::string& fallback) {
  Dl_info info{};
  if (symbol && dladdr(symbol, &info) != 0 && info.dli_fname && info.dli_fname[0]) return info.dli_fname;
  return fallback;
}

}  // namespace

std::string RuntimeLibrary::dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

bool RuntimeLibrary::is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void* RuntimeLibrary::symbol(void* handle, const char* name) {
  dlerror();
  return dlsym(handle, name);
}

void RuntimeLibrary::set_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (loaded_) return;
  dir_ = d;
  tried_ = false;  // look again at the next use, in this folder first
}

std::string RuntimeLibrary::ensure_loaded() {
  if (loaded()) return "";
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loaded_ && !tried_) attempt();
  return loaded_ ? "" : failure_;
}

void RuntimeLibrary::attempt() {
  tried_ = true;
  failure_.clear();
  std::vector<std::string> tried;  // why each candidate was passed over
  bool opened_any = false;
  std::vector<std::string> candidates;
  if (!dir_.empty()) {
    const std::string in_dir = dir_ + "/" + soname_;
    if (is_file(in_dir)) {
      before_open_in_dir(dir_);
      candidates.push_back(in_dir);
    } else {
      tried.push_back(str(in_dir, ": no such file"));
    }
  }
  candidates.push_back(soname_);
  for (const std::string& name : candidates) {
    // RTLD_LOCAL: the dlsym'd pointers are all we need, and the library's symbols stay out of the global namespace
    // (another copy, e.g. PyTorch's, may be loaded); the library finds its own dependencies from its folder.
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried.push_back(dl_error());  // dlerror's text names the file
      continue;
    }
    opened_any = true;
    const std::string path = probe_ ? path_of(dlsym(lib, probe_), name) : name;
    std::string why;
    if (!bind(lib, path, &why)) {
      tried.push_back(why);
      dlclose(lib);
      continue;
    }
    path_ = path;
    handle_ = lib;
    loaded_.store(true, std::memory_order_release);
    return;
  }
  failure_ = describe_failure(opened_any, tried);
}

}  // namespace sl::cuda
