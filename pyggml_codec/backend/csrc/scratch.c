#include "pg_kernels.h"

/* Scratch buffers kept between calls: a fresh multi-MB malloc per call came back as fresh
 * pages, and clearing them took 15 % of a 64-channel conv's time. Slots are taken under a
 * lock (graphs may compute in several threads at once) and grown when too small; they
 * live as long as the process (a few MB per compute thread). Each starts on a cache line:
 * malloc's large blocks start 16 bytes past a page, which split every 64-byte load of a row
 * product across two lines (F32 row products over 384 channels: 62 GFLOP/s against 82).
 *
 * A thread takes back the slots it used last where they are free: their lines are still in its
 * own caches. Taken first-come, a slot went to either thread of a graph, and on a machine whose
 * two cores sit on different dies, every block's inputs and products crossed between their caches
 * (a one-frame push's decoder graph 33-35 ms, against 25-27 with its cores on one die). */
#define PG_SCRATCH_SLOTS 64
static pthread_mutex_t pg_scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { float * data; size_t n; int busy; const void * owner; } pg_scratch[PG_SCRATCH_SLOTS];
static __thread char pg_scratch_me;  /* its address tells the threads apart */

static int64_t pg_scratch_failed;  /* takes refused for want of memory (pg_scratch_failures) */

/* A kernel whose take fails leaves its output unset; Python reads this count around every compute
 * and raises instead of returning that output. */
int64_t pg_scratch_failures(void) { return __atomic_load_n(&pg_scratch_failed, __ATOMIC_SEQ_CST); }

static float * pg_scratch_alloc(size_t n) {
    void * p = NULL;
    if (n <= SIZE_MAX / sizeof(float) && posix_memalign(&p, 64, sizeof(float) * n) == 0) return p;
    __atomic_add_fetch(&pg_scratch_failed, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

float * pg_scratch_take(size_t n, int * slot) {
    const void * me = &pg_scratch_me;
    int pick = -1, rank = 5;
    if (n == 0) n = 1;  /* a never-used slot (n 0) would otherwise be granted with no buffer */
    pthread_mutex_lock(&pg_scratch_lock);
    /* free slots, best first: this thread's large enough, this thread's (grown), one never used,
       another thread's large enough, any */
    for (int i = 0; i < PG_SCRATCH_SLOTS && rank > 0; i++) {
        if (pg_scratch[i].busy) continue;
        const int mine = pg_scratch[i].owner == me, fits = pg_scratch[i].n >= n;
        const int r = mine ? (fits ? 0 : 1) : !pg_scratch[i].owner ? 2 : fits ? 3 : 4;
        if (r < rank) { pick = i; rank = r; }
    }
    if (pick >= 0) {
        pg_scratch[pick].busy = 1;
        pg_scratch[pick].owner = me;
    }
    pthread_mutex_unlock(&pg_scratch_lock);
    *slot = pick;
    if (pick < 0) return pg_scratch_alloc(n);  /* more threads than slots: uncached */
    if (pg_scratch[pick].n < n) {
        free(pg_scratch[pick].data);
        pg_scratch[pick].data = pg_scratch_alloc(n);
        pg_scratch[pick].n = pg_scratch[pick].data ? n : 0;
        if (!pg_scratch[pick].data) {  /* out of memory: the slot back at once, nothing to give later */
            pg_scratch_give(NULL, pick);
            *slot = -1;
            return NULL;
        }
    }
    return pg_scratch[pick].data;
}

void pg_scratch_give(float * data, int slot) {
    if (slot < 0) { free(data); return; }
    pthread_mutex_lock(&pg_scratch_lock);
    pg_scratch[slot].busy = 0;
    pthread_mutex_unlock(&pg_scratch_lock);
}
