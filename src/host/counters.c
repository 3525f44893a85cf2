/* The counter pool of counters.h: blocks are made (and zeroed, one memset region) only when no
 * free block of the device is left, and kept for the life of the process. */
#include <pthread.h>
#include <stddef.h>

#include "counters.h"
#include "ompk/ompk.h"

#define POOL 64
#define BYTES (OMPK_COUNTERS_MAX * sizeof(int))

typedef struct slot {
    int *ptr;   /* NULL: empty */
    int device; /* -1: host */
    int live;
} slot;

static slot pool[POOL];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int dev_key(ompk_device d) {
    return d.type == OMPK_HOST ? -1 : d.id;
}

int *ompk_counters_alloc(ompk_device device) {
    const int key = dev_key(device);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < POOL; i++)
        if (pool[i].ptr && !pool[i].live && pool[i].device == key) {
            pool[i].live = 1;
            int *p = pool[i].ptr;
            pthread_mutex_unlock(&lock);
            return p;
        }
    pthread_mutex_unlock(&lock);
    int *p = ompk_malloc(device, BYTES);
    if (!p) return NULL;
    if (ompk_memset(p, device, 0, BYTES) != OMPK_OK) {
        ompk_free(device, p);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < POOL; i++)
        if (!pool[i].ptr) {
            pool[i] = (slot){p, key, 1};
            break;
        }
    pthread_mutex_unlock(&lock);
    return p;
}

void ompk_counters_free(ompk_device device, int *block) {
    if (!block) return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < POOL; i++)
        if (pool[i].ptr == block) {
            pool[i].live = 0;
            pthread_mutex_unlock(&lock);
            return;
        }
    pthread_mutex_unlock(&lock);
    /* a block the pool had no room for */
    ompk_free(device, block);
}
