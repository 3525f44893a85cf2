/* Internal: does an offload image run on device `dev`, what does a launch cost there, and what
 * FP32 rate can OpenMP code reach? */
#ifndef OMPK_PROBE_H
#define OMPK_PROBE_H

/* Runs a tiny target region on `dev` and returns 1 if it executed on the device, 0 if the
 * runtime fell back to the host (no compatible image), -1 if the device number is invalid. */
int ompk_probe_device(int dev);

typedef enum ompk_probe_form {
    OMPK_PROBE_BARE,     /* target teams ompx_bare, one warp (the GPU fast kernels' form) */
    OMPK_PROBE_COMBINED, /* target teams distribute parallel for (the portable kernels' form) */
    OMPK_PROBE_NOWAIT,   /* the same with nowait, then taskwait */
    OMPK_PROBE_STRUCT    /* combined with a 512-byte firstprivate struct (an argument block) */
} ompk_probe_form;

/* One synchronous, near-empty target region of the given form on `dev`, incrementing *word (a
 * device pointer). Returns 0, or -1 for a bad device or a form this build lacks. */
int ompk_probe_launch(int dev, ompk_probe_form form, int *word);

/* The FP32 peak probe: independent FMA chains with no memory traffic, run once on `dev` (a
 * target device) or, with dev < 0, on the host's OpenMP threads. Returns the FLOPs it did (time
 * the call for the FLOP rate this build's code reaches there), or -1 for a bad device. */
double ompk_probe_fma(int dev);

#endif
