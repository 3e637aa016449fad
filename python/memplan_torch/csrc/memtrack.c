/*
 * memtrack: an exact live-bytes counter for CPU training runs.
 *
 * Loaded with LD_PRELOAD, it interposes malloc, free, calloc, realloc,
 * posix_memalign, aligned_alloc, memalign, valloc and pvalloc, and counts the
 * bytes of every live allocation whose requested size is >= a threshold
 * (MEMTRACK_THRESHOLD, default 1024 bytes).  PyTorch's CPU allocator
 * (c10::alloc_cpu) and oneDNN allocate through posix_memalign, so tensor data
 * and in-kernel scratch buffers are both seen.
 *
 * Two counter sets are kept: "all" (every interposed function) and "aligned"
 * (posix_memalign / aligned_alloc / memalign / valloc / pvalloc only, which is
 * what c10's CPU allocator uses for tensor storage).
 *
 * Counters are read through plain C functions (ctypes: CDLL(None).memtrack_live):
 *   memtrack_live(), memtrack_peak(), memtrack_reset_peak(),
 *   memtrack_aligned_live(), memtrack_aligned_peak(),
 *   memtrack_threshold(), memtrack_overflow(), memtrack_count()
 *
 * Pointers are kept in a fixed-size open-addressing hash table (linear probing,
 * backward-shift deletion) in mmap'd memory, guarded by one spinlock.  Frees
 * are pre-filtered with malloc_usable_size(): a block whose usable size is
 * below the threshold can never have been tracked, so small frees never touch
 * the lock.  During the dlsym() bootstrap, allocations come from a static
 * arena that is never returned to libc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TABLE_BITS 20 /* 1M slots, 16 MiB of mmap'd memory */
#define TABLE_SIZE (1u << TABLE_BITS)
#define TABLE_MAX_FILL (TABLE_SIZE / 4 * 3)

typedef struct {
  uintptr_t ptr; /* 0 = empty */
  uint64_t size; /* low bit 63: aligned family */
} slot_t;

#define ALIGNED_FLAG (1ull << 63)

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);

static slot_t *table;
static volatile int lock_word;
static int initialized;
static int initializing;
static size_t threshold = 1024;

static int64_t live_bytes, peak_bytes, aligned_live, aligned_peak;
static int64_t live_count, overflow;

/* bootstrap arena for allocations made by dlsym() before the real functions are known */
static char boot_arena[1 << 16] __attribute__((aligned(64)));
static size_t boot_used;

static int in_boot(void *p) {
  return (char *)p >= boot_arena && (char *)p < boot_arena + sizeof boot_arena;
}

static void *boot_alloc(size_t n) {
  size_t off = (boot_used + 63) & ~(size_t)63;
  if (off + n > sizeof boot_arena) return NULL;
  boot_used = off + n;
  return boot_arena + off;
}

static void lock(void) {
  while (__atomic_test_and_set(&lock_word, __ATOMIC_ACQUIRE)) {
    /* spin */
  }
}
static void unlock(void) { __atomic_clear(&lock_word, __ATOMIC_RELEASE); }

static void init(void) {
  if (initialized || initializing) return;
  initializing = 1;
  real_malloc = dlsym(RTLD_NEXT, "malloc");
  real_free = dlsym(RTLD_NEXT, "free");
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  real_memalign = dlsym(RTLD_NEXT, "memalign");
  real_valloc = dlsym(RTLD_NEXT, "valloc");
  real_pvalloc = dlsym(RTLD_NEXT, "pvalloc");
  const char *t = getenv("MEMTRACK_THRESHOLD");
  if (t && *t) {
    long v = strtol(t, NULL, 10);
    if (v >= 1) threshold = (size_t)v;
  }
  void *m = mmap(NULL, sizeof(slot_t) * TABLE_SIZE, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  table = (m == MAP_FAILED) ? NULL : (slot_t *)m;
  initialized = 1;
  initializing = 0;
}

static inline uint32_t hash_ptr(uintptr_t p) {
  uint64_t x = (uint64_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint32_t)(x & (TABLE_SIZE - 1));
}

static void track(void *p, size_t n, int aligned) {
  if (!p || n < threshold || !table) return;
  lock();
  if (live_count >= TABLE_MAX_FILL) {
    overflow++;
    unlock();
    return;
  }
  uint32_t i = hash_ptr((uintptr_t)p);
  while (table[i].ptr) i = (i + 1) & (TABLE_SIZE - 1);
  table[i].ptr = (uintptr_t)p;
  table[i].size = (uint64_t)n | (aligned ? ALIGNED_FLAG : 0);
  live_count++;
  live_bytes += (int64_t)n;
  if (live_bytes > peak_bytes) peak_bytes = live_bytes;
  if (aligned) {
    aligned_live += (int64_t)n;
    if (aligned_live > aligned_peak) aligned_peak = aligned_live;
  }
  unlock();
}

/* removes p from the table; returns its size (0 if untracked) */
static size_t untrack(void *p) {
  if (!p || !table || !initialized) return 0;
  if (malloc_usable_size(p) < threshold) return 0;
  size_t n = 0;
  lock();
  uint32_t i = hash_ptr((uintptr_t)p);
  while (table[i].ptr && table[i].ptr != (uintptr_t)p) i = (i + 1) & (TABLE_SIZE - 1);
  if (table[i].ptr) {
    uint64_t s = table[i].size;
    n = (size_t)(s & ~ALIGNED_FLAG);
    live_bytes -= (int64_t)n;
    if (s & ALIGNED_FLAG) aligned_live -= (int64_t)n;
    live_count--;
    /* backward-shift deletion keeps probe chains intact */
    uint32_t j = i;
    for (;;) {
      j = (j + 1) & (TABLE_SIZE - 1);
      if (!table[j].ptr) break;
      uint32_t k = hash_ptr(table[j].ptr);
      /* can slot j's entry move to i? only if k is cyclically outside (i, j] */
      int move = (i <= j) ? (k <= i || k > j) : (k <= i && k > j);
      if (move) {
        table[i] = table[j];
        i = j;
      }
    }
    table[i].ptr = 0;
    table[i].size = 0;
  }
  unlock();
  return n;
}

void *malloc(size_t n) {
  if (!initialized) {
    if (initializing) return boot_alloc(n);
    init();
  }
  void *p = real_malloc(n);
  track(p, n, 0);
  return p;
}

void free(void *p) {
  if (!p || in_boot(p)) return;
  if (!initialized) init();
  untrack(p);
  real_free(p);
}

void *calloc(size_t a, size_t b) {
  if (!initialized) {
    if (initializing) {
      void *p = boot_alloc(a * b);
      if (p) memset(p, 0, a * b);
      return p;
    }
    init();
  }
  void *p = real_calloc(a, b);
  track(p, a * b, 0);
  return p;
}

void *realloc(void *p, size_t n) {
  if (!initialized) {
    if (initializing) return boot_alloc(n);
    init();
  }
  if (in_boot(p)) {
    void *q = real_malloc(n);
    size_t avail = (size_t)(boot_arena + sizeof boot_arena - (char *)p);
    if (q) memcpy(q, p, n < avail ? n : avail);
    track(q, n, 0);
    return q;
  }
  size_t old = untrack(p);
  void *q = real_realloc(p, n);
  if (!q && n != 0 && p) {
    /* failed: the old block is still live */
    if (old) track(p, old, 0);
    return q;
  }
  track(q, n, 0);
  return q;
}

int posix_memalign(void **out, size_t align, size_t n) {
  if (!initialized) init();
  int r = real_posix_memalign(out, align, n);
  if (r == 0) track(*out, n, 1);
  return r;
}

void *aligned_alloc(size_t align, size_t n) {
  if (!initialized) init();
  void *p = real_aligned_alloc(align, n);
  track(p, n, 1);
  return p;
}

void *memalign(size_t align, size_t n) {
  if (!initialized) init();
  void *p = real_memalign(align, n);
  track(p, n, 1);
  return p;
}

void *valloc(size_t n) {
  if (!initialized) init();
  void *p = real_valloc(n);
  track(p, n, 1);
  return p;
}

void *pvalloc(size_t n) {
  if (!initialized) init();
  void *p = real_pvalloc(n);
  track(p, n, 1);
  return p;
}

/* ---- counters, callable through ctypes ---- */

static int64_t read64(int64_t *v) {
  lock();
  int64_t x = *v;
  unlock();
  return x;
}

int64_t memtrack_live(void) { return read64(&live_bytes); }
int64_t memtrack_peak(void) { return read64(&peak_bytes); }
int64_t memtrack_aligned_live(void) { return read64(&aligned_live); }
int64_t memtrack_aligned_peak(void) { return read64(&aligned_peak); }
int64_t memtrack_count(void) { return read64(&live_count); }
int64_t memtrack_overflow(void) { return read64(&overflow); }
int64_t memtrack_threshold(void) { return (int64_t)threshold; }

void memtrack_reset_peak(void) {
  lock();
  peak_bytes = live_bytes;
  aligned_peak = aligned_live;
  unlock();
}

/* 1 when the interposer is active (lets Python check it is really preloaded) */
int memtrack_active(void) { return initialized && table != NULL; }
