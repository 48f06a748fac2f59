// Whether the executors log one line per collective to stderr (the
// modules' configure(debug=...); off until it is called).
#ifndef JAX_BLINK_CC_CORE_DEBUG_H_
#define JAX_BLINK_CC_CORE_DEBUG_H_

namespace jax_blink {

bool DebugEnabled();
void SetDebugEnabled(bool on);

}  // namespace jax_blink

#endif  // JAX_BLINK_CC_CORE_DEBUG_H_
