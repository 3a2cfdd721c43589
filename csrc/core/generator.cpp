#include "core/generator.h"

#include <map>
#include <mutex>

namespace sl {
namespace {

struct GeneratorState {
  uint64_t seed = kDefaultSeed;
  uint64_t offset = 0;
};

std::mutex g_mutex;
std::map<std::pair<int, int>, GeneratorState>& states() {
  static std::map<std::pair<int, int>, GeneratorState> s;
  return s;
}

GeneratorState& state_of(Device d) { return states()[{int(d.kind), d.index}]; }

}  // namespace

std::pair<uint64_t, uint64_t> reserve_counters(Device device, uint64_t counters) {
  std::lock_guard<std::mutex> lock(g_mutex);
  GeneratorState& s = state_of(device);
  uint64_t start = s.offset;
  s.offset += counters;
  return {s.seed, start};
}

void manual_seed(Device device, uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_mutex);
  GeneratorState& s = state_of(device);
  s.seed = seed;
  s.offset = 0;
}

uint64_t current_seed(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_of(device).seed;
}

}  // namespace sl
