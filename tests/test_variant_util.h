/* Running a test under each implementation of an op (src/host/variant.h), through the
 * per-thread selection hook instead of the environment. */
#ifndef OMPK_TEST_VARIANT_UTIL_H
#define OMPK_TEST_VARIANT_UTIL_H

#include <criterion/criterion.h>

#include "variant.h"

/* names[0] = NULL (the default order), then op's entries in table order, those not available in
 * this build or on this machine left out (naming one runs the default order, names[0]); returns
 * the count */
static inline int tu_variants(const char *op, const char **names, int max) {
    int n = 0;
    if (n < max) names[n++] = NULL;
    const ompk_impl *e;
    for (int i = 0; n < max && (e = ompk_variant_list(op, i)) != NULL; i++)
        if (ompk_impl_available(e)) names[n++] = e->name;
    return n;
}

/* Names entry `name` of op (NULL: back to the default order) for this thread's later calls. */
static inline void tu_force(const char *op, const char *name) {
    cr_assert_eq(ompk_variant_force(op, name), OMPK_OK, "%s", ompk_last_error());
}

#endif
