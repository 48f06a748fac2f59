// JAX_BLINK_HD: marks a function that both builds compile, the host
// compiler's and nvcc's device pass (core/reduce_op.h, core/half.h and the
// device executor's interpreter, device/device_interp.h).
#ifndef JAX_BLINK_CC_CORE_HD_H_
#define JAX_BLINK_CC_CORE_HD_H_

#if defined(__CUDACC__)
#define JAX_BLINK_HD __host__ __device__ __forceinline__
#else
#define JAX_BLINK_HD inline
#endif

#endif  // JAX_BLINK_CC_CORE_HD_H_
