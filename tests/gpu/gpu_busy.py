"""Keeps GPU 0 busy and holds GPU memory, through the CUDA driver API (ctypes): no torch needed.

gpu_busy.py READY_DIR SECONDS MIB: allocates MIB MiB on the device, then launches a spinning kernel back to
back for SECONDS; writes READY_DIR/RANK.pid once the first kernels have run. Exit 3 where CUDA cannot start.
"""

import ctypes
import os
import sys
import time

# A kernel that counts to `n` and stores the count: as long as a launch runs, every SM it has is busy.
PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    mov.u32 %r1, 0;
    ld.param.u32 %r2, [n];
LOOP:
    add.u32 %r1, %r1, 1;
    setp.lt.u32 %p, %r1, %r2;
    @%p bra LOOP;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r1;
    ret;
}
"""


def check(result: int, what: str) -> None:
    if result != 0:
        print(f"gpu_busy: {what} failed: CUDA error {result}", file=sys.stderr)
        sys.exit(3)


ready_dir, seconds, mib = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as err:
    print(f"gpu_busy: no CUDA driver: {err}", file=sys.stderr)
    sys.exit(3)
check(cuda.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
module = ctypes.c_void_p()
check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
kernel = ctypes.c_void_p()
check(cuda.cuModuleGetFunction(ctypes.byref(kernel), module, b"spin"), "cuModuleGetFunction")
held = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(held), ctypes.c_size_t(mib << 20)), "cuMemAlloc")
check(cuda.cuMemsetD8_v2(held, 1, ctypes.c_size_t(mib << 20)), "cuMemsetD8")  # resident, not only reserved
out = ctypes.c_uint64(held.value)
count = ctypes.c_uint32(1 << 22)
params = (ctypes.c_void_p * 2)(
    ctypes.cast(ctypes.byref(out), ctypes.c_void_p), ctypes.cast(ctypes.byref(count), ctypes.c_void_p)
)
end = time.monotonic() + seconds
told = False
while time.monotonic() < end:
    for _ in range(4):
        check(cuda.cuLaunchKernel(kernel, 1024, 1, 1, 128, 1, 1, 0, None, params, None), "cuLaunchKernel")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    if not told:
        told = True
        with open(os.path.join(ready_dir, f"{os.environ.get('RANK', '0')}.pid"), "w") as f:
            f.write(str(os.getpid()))
        print("busy", flush=True)
