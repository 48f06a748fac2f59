#include "core/debug.h"

#include <atomic>

namespace jax_blink {
namespace {
std::atomic<bool> debug_enabled{false};
}  // namespace

bool DebugEnabled() { return debug_enabled.load(std::memory_order_relaxed); }
void SetDebugEnabled(bool on) { debug_enabled.store(on, std::memory_order_relaxed); }

}  // namespace jax_blink
