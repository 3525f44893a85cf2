#include "ompk/ompk.h"

const char *ompk_version(void) {
    return OMPK_VERSION_STRING;
}
const char *ompk_compiler(void) {
    return OMPK_COMPILER_STRING;
}
const char *ompk_offload_archs(void) {
    return OMPK_OFFLOAD_ARCHS_STRING;
}
