#pragma once
// The element types every CPU kernel and its CUDA twin are instantiated for, in one list:
// f32 (training) and f64 (gradcheck). A kernel file defines ND_INSTANTIATE(T) as its
// explicit instantiations and writes ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE). The 16-bit
// paths (bf16, f16) are their own kernels, not instantiations of these.
#define ND_FOR_EACH_TWIN_TYPE(X) X(float) X(double)
