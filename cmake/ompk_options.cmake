option(OMPK_BUILD_TESTS "build the Criterion suites" ON)
option(OMPK_OFFLOAD "compile src/target for NVIDIA GPUs (clang >= 19 only)" ON)
set(OMPK_OFFLOAD_ARCHS "sm_80;sm_90" CACHE STRING "GPU architectures, one image each")
set(OMPK_CUDA_PATH "/usr/local/cuda" CACHE PATH "CUDA toolkit used for ptxas/nvlink")
set(OMPK_CUBIN_ABI_PATCH "AUTO" CACHE STRING
    "rewrite linked cubins from ELF ABI v8 to v7 for LLVM < 21.1.2 runtimes: AUTO, ON or OFF")
set_property(CACHE OMPK_CUBIN_ABI_PATCH PROPERTY STRINGS AUTO ON OFF)
set(OMPK_SANITIZE "" CACHE STRING "sanitizers for the host build, e.g. address,undefined")

if(OMPK_SANITIZE)
  add_compile_options(-fsanitize=${OMPK_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${OMPK_SANITIZE})
endif()
