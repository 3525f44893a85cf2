/* Internal: does an offload image run on device `dev`, and what does a launch cost there? */
#ifndef OMPK_PROBE_H
#define OMPK_PROBE_H

/* Runs a tiny target region on `dev` and returns 1 if it executed on the device, 0 if the
 * runtime fell back to the host (no compatible image), -1 if the device number is invalid. */
int ompk_probe_device(int dev);

typedef enum ompk_probe_form {
    OMPK_PROBE_BARE,     /* target teams ompx_bare, one warp (the GPU fast kernels' form) */
    OMPK_PROBE_COMBINED, /* target teams distribute parallel for (the portable kernels' form) */
    OMPK_PROBE_NOWAIT    /* the same with nowait, then taskwait */
} ompk_probe_form;

/* One synchronous, near-empty target region of the given form on `dev`, incrementing *word (a
 * device pointer). Returns 0, or -1 for a bad device or a form this build lacks. */
int ompk_probe_launch(int dev, ompk_probe_form form, int *word);

#endif
