#pragma once
// The emulator's stand-in for kernels/cuda/warp_ptx.cuh, found first on the emulated builds'
// include path: warp_mma.cuh's instructions as emu_ptx.h's emulated functions.
#include "emu_ptx.h"

namespace nd::kernels::cuda {

using emu_ptx::cp_async_ca;
using emu_ptx::cp_async_ca_zfill;
using emu_ptx::cp_async_cg_16;
using emu_ptx::cp_async_cg_16_zfill;
using emu_ptx::cp_async_commit_group;
using emu_ptx::cp_async_wait_all;
using emu_ptx::cp_async_wait_group;
using emu_ptx::ex2_approx_ftz;
using emu_ptx::ldmatrix;
using emu_ptx::ldmatrix_trans;
using emu_ptx::mma_m16n8k16;

}  // namespace nd::kernels::cuda
