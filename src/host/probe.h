/* Internal: does an offload image run on device `dev`? */
#ifndef OMPK_PROBE_H
#define OMPK_PROBE_H

/* Runs a tiny target region on `dev` and returns 1 if it executed on the device, 0 if the
 * runtime fell back to the host (no compatible image), -1 if the device number is invalid. */
int ompk_probe_device(int dev);

#endif
