#include "pg_kernels.h"
#include <time.h>

/* Graph.timeline: a compiled kernel called through pg_timed (or pg_timed2, a MAP_CUSTOM2 op's),
 * which reads CLOCK_MONOTONIC on each thread's entry and exit. userdata: int64 [3 + 8 T] = the
 * kernel's callback, its userdata, T, then thread ith's entry and exit (ns) at [3 + 8 ith] and
 * [4 + 8 ith], a cache line apart from the next thread's; threads from T on are not timed. The
 * kernel gets its own userdata: the same values, with two clock reads per thread around it. */
typedef void (*pg_op_t)(void *, int, int, void *);
typedef void (*pg_op2_t)(void *, void *, void *, int, int, void *);

static inline int64_t pg_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void pg_stamp(int64_t * p, int ith, int64_t t0, int64_t t1) {
    if (ith < p[2]) p[3 + 8 * ith] = t0, p[4 + 8 * ith] = t1;
}

void pg_timed(void * dst, int ith, int nth, void * userdata) {
    int64_t * p = userdata;
    const int64_t t0 = pg_now_ns();
    ((pg_op_t)(uintptr_t)p[0])(dst, ith, nth, (void *)(uintptr_t)p[1]);
    pg_stamp(p, ith, t0, pg_now_ns());
}

void pg_timed2(void * dst, void * a, void * b, int ith, int nth, void * userdata) {
    int64_t * p = userdata;
    const int64_t t0 = pg_now_ns();
    ((pg_op2_t)(uintptr_t)p[0])(dst, a, b, ith, nth, (void *)(uintptr_t)p[1]);
    pg_stamp(p, ith, t0, pg_now_ns());
}

int64_t pg_clock_ns(void) { return pg_now_ns(); }
