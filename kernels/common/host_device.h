#pragma once
// ND_HOST_DEVICE marks the functions kernels/common shares between the CPU kernels and the
// CUDA kernels: __host__ __device__ under nvcc, plain inline for the host compiler.
#if defined(__CUDACC__)
#define ND_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ND_HOST_DEVICE inline
#endif
