option(OMPK_BUILD_TESTS "build the Criterion suites" ON)
option(OMPK_FUZZ "build the libFuzzer harnesses of tests/fuzz (clang, host only)" OFF)
option(OMPK_OFFLOAD "compile src/target for the GPUs of OMPK_OFFLOAD_ARCHS (clang >= 19; GCC: NVIDIA only)" ON)
# The lab build: the benchmark-only implementations and tuning knobs (the named-only entries of
# the implementation lists that are not defaults: bench/results/INDEX.md, Decisions). Off, the
# library carries the defaults, the portable kernels and what they need.
option(OMPK_LAB "build the benchmark-only variants and knobs" OFF)
if(OMPK_LAB)
  add_compile_definitions(OMPK_LAB=1)
endif()
set(OMPK_OFFLOAD_ARCHS "sm_80;sm_90" CACHE STRING "GPU architectures, one image each: sm_* (NVIDIA) or gfx* (AMD)")
set(OMPK_CUDA_PATH "/usr/local/cuda" CACHE PATH "CUDA toolkit used for ptxas/nvlink")
set(OMPK_ROCM_DEVICE_LIB_PATH "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode" CACHE PATH
    "ROCm device libraries (ocml.bc, ockl.bc, oclc_*.bc) for gfx* archs")
set(OMPK_CUBIN_ABI_PATCH "AUTO" CACHE STRING
    "rewrite linked cubins from ELF ABI v8 to v7 for LLVM < 21.1.2 runtimes: AUTO, ON or OFF")
set_property(CACHE OMPK_CUBIN_ABI_PATCH PROPERTY STRINGS AUTO ON OFF)
set(OMPK_SANITIZE "" CACHE STRING "sanitizers for the host build, e.g. address,undefined")
# STATIC links the GPU images into each executable. compute-sanitizer needs it: a shared
# library registers its images (and the offload runtime calls cuInit) in its constructor, before
# the sanitizer's injected libraries initialise, and the sanitizer then disables itself.
set(OMPK_LIBRARY_TYPE "SHARED" CACHE STRING "libompk: SHARED or STATIC")
set_property(CACHE OMPK_LIBRARY_TYPE PROPERTY STRINGS SHARED STATIC)

if(OMPK_SANITIZE)
  add_compile_options(-fsanitize=${OMPK_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${OMPK_SANITIZE})
endif()

# Host code generation. The portable kernels (and the host fallback of every target region)
# are plain C loops that only vectorise well with AVX2/FMA or wider; x86-64-v3 (Haswell, 2013,
# and every AMD Zen) is the baseline. The AMX / AVX-512 paths carry their own per-function
# target attributes and are dispatched at run time. Set to "native" for a local build or to
# "x86-64" for the oldest CPUs.
set(OMPK_HOST_ARCH "x86-64-v3" CACHE STRING "-march for host code (empty: compiler default)")
if(OMPK_HOST_ARCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  add_compile_options(-march=${OMPK_HOST_ARCH})
endif()

# -std=c17 makes GCC stop contracting a*b+c into FMAs (ISO mode); clang contracts within an
# expression by default. Contract under GCC too so both compilers' host code does the same
# arithmetic (the portable kernels are FMA chains).
if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-ffp-contract=fast)
endif()
