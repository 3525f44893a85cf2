/* ompk: kernels for transformer training and inference, one OpenMP source for GPU and host.
 * Umbrella header. Each header states its thread safety; the functions below return constant
 * strings and are safe from any thread. The library reads its OMPK_* environment variables with
 * getenv during calls: set them before calling from several threads. */
#ifndef OMPK_OMPK_H
#define OMPK_OMPK_H

#include "ompk/status.h"
#include "ompk/tensor.h"
#include "ompk/attention.h"
#include "ompk/mhc.h"
#include "ompk/moe.h"
#include "ompk/router.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0" */
const char *ompk_version(void);
/* Compiler that built the library, e.g. "Clang 19.1.7". */
const char *ompk_compiler(void);
/* GPU architectures with an offload image in this build, e.g. "sm_80,sm_90" ("" host-only). */
const char *ompk_offload_archs(void);

#ifdef __cplusplus
}
#endif
#endif
