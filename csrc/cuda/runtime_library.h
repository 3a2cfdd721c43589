// A shared library opened at run time with dlopen, never linked: what cuBLAS (cublas.cpp), cuDNN (cudnn.cpp) and
// NCCL (comm/nccl_api.cpp) have in common. A CUDA build must import and run its CPU paths without these libraries,
// and must compile without their headers, so each is looked for on first use, in order:
//   1. <dir>/<soname>, where <dir> was given to set_dir() (the Python package passes the lib folder of the wheel);
//   2. the plain soname (LD_LIBRARY_PATH, ld.so.cache, an already loaded copy).
// The first candidate that opens and binds wins. A subclass says how to bind the entry points and how to word the
// failure; this class owns the rest (the folder, the lock, the load state, the handle).
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sl::cuda {

class RuntimeLibrary {
 public:
  // The folder holding the soname, tried before the plain soname (trailing slashes dropped). Takes effect at the
  // next load attempt: after a failed attempt the library is looked for again; once loaded it stays loaded.
  void set_dir(const std::string& dir);
  // Loads on first use (thread-safe; one atomic load once loaded). Returns "" when loaded, else
  // describe_failure's message for the last attempt (not retried until set_dir is called again).
  std::string ensure_loaded();
  // The file the entry points come from; only once ensure_loaded() returned "".
  const std::string& path() const { return path_; }

 protected:
  // probe: an entry point whose file names the library (dladdr: what the plain soname resolved to); nullptr
  // names it by the candidate as given to dlopen.
  RuntimeLibrary(std::string soname, const char* probe) : soname_(std::move(soname)), probe_(probe) {}
  virtual ~RuntimeLibrary() = default;
  // Is the state bind() wrote final (loaded)? Acquire: once true, it never changes again.
  bool loaded() const { return loaded_.load(std::memory_order_acquire); }
  // For bind(): fn = the entry point `name` of handle; false when there is none (dl_error() then says why).
  template <typename Fn>
  static bool resolve(void* handle, const char* name, Fn& fn) {
    fn = reinterpret_cast<Fn>(symbol(handle, name));
    return fn != nullptr;
  }
  static std::string dl_error();  // dlerror()'s text, or "unknown dlopen error"
  static bool is_file(const std::string& path);  // a regular file (or a link to one)

 private:
  // Resolves the entry points from an opened library (called with the lock held). false, with why naming the
  // path, when the library is unusable; it is then closed and the next candidate tried.
  virtual bool bind(void* handle, const std::string& path, std::string* why) = 0;
  // The failure message. tried: why each candidate was passed over, in order; opened_any: some candidate opened
  // but was unusable (else none was found).
  virtual std::string describe_failure(bool opened_any, const std::vector<std::string>& tried) const = 0;
  // Called before <dir>/<soname> is opened, e.g. to load a library it needs from the same folder first.
  virtual void before_open_in_dir(const std::string& dir) {}

  static void* symbol(void* handle, const char* name);  // dlsym, with dlerror() cleared first
  void attempt();  // one load attempt; the lock is held

  const std::string soname_;
  const char* const probe_;
  std::mutex mutex_;
  std::string dir_;                  // from set_dir
  bool tried_ = false;               // a load was attempted since dir_ last changed
  std::atomic<bool> loaded_{false};  // set once, under mutex_; then the bound state and path_ never change
  void* handle_ = nullptr;           // dlopen handle, never closed
  std::string path_;
  std::string failure_;              // describe_failure's message when the last attempt failed
};

}  // namespace sl::cuda
