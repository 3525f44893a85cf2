/* Scratch cache (see scratch.h): a fixed table of device blocks, each live (handed out) or
 * cached (free for reuse). A request takes the smallest cached block of its device that is large
 * enough and at most 4x too large, else allocates. A freed block stays cached while the cache
 * holds under MAX_CACHED_BYTES; blocks the table cannot track are simply freed. */
#include <pthread.h>
#include <stdint.h>

#include "scratch.h"

#define SLOTS 64
#define MAX_CACHED_BYTES ((size_t)2 << 30)

typedef struct block {
    void *ptr; /* NULL: empty slot */
    size_t bytes;
    int device;
    int live;
} block;

static block table[SLOTS];
static size_t cached_bytes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* nearby request sizes share blocks */
static size_t round_up(size_t n) {
    const size_t g = (size_t)2 << 20;
    return n <= g ? (n + 4095) & ~(size_t)4095 : (n + g - 1) / g * g;
}

void *ompk_scratch_alloc(ompk_device device, size_t bytes) {
    if (device.type == OMPK_HOST) return ompk_malloc(device, bytes);
    const size_t want = round_up(bytes ? bytes : 1);
    pthread_mutex_lock(&lock);
    int best = -1;
    for (int i = 0; i < SLOTS; i++)
        if (table[i].ptr && !table[i].live && table[i].device == device.id &&
            table[i].bytes >= want && table[i].bytes / 4 <= want &&
            (best < 0 || table[i].bytes < table[best].bytes))
            best = i;
    if (best >= 0) {
        table[best].live = 1;
        cached_bytes -= table[best].bytes;
        void *p = table[best].ptr;
        pthread_mutex_unlock(&lock);
        return p;
    }
    pthread_mutex_unlock(&lock);
    void *p = ompk_malloc(device, want);
    if (!p) {
        /* cached blocks may be what fills the device: give them back and try once more */
        ompk_scratch_trim();
        p = ompk_malloc(device, want);
        if (!p) return NULL;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (!table[i].ptr) {
            table[i] = (block){p, want, device.id, 1};
            break;
        }
    pthread_mutex_unlock(&lock);
    return p;
}

void ompk_scratch_free(ompk_device device, void *ptr) {
    if (!ptr) return;
    if (device.type == OMPK_HOST) {
        ompk_free(device, ptr);
        return;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (table[i].ptr == ptr && table[i].live) {
            if (cached_bytes + table[i].bytes <= MAX_CACHED_BYTES) {
                table[i].live = 0;
                cached_bytes += table[i].bytes;
                pthread_mutex_unlock(&lock);
                return;
            }
            table[i].ptr = NULL;
            break;
        }
    pthread_mutex_unlock(&lock);
    ompk_free(device, ptr);
}

void ompk_scratch_trim(void) {
    block freed[SLOTS];
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (table[i].ptr && !table[i].live) {
            freed[n++] = table[i];
            cached_bytes -= table[i].bytes;
            table[i].ptr = NULL;
        }
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++) ompk_free(ompk_device_target(freed[i].device), freed[i].ptr);
}
