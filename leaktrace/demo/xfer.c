/* libxfer_demo: the bundled leaking workload of `leaktrace demo` — seed 002 in miniature.
 *
 * A toy "transfer" library. xfer_send() maps a staging buffer with a raw syscall(SYS_mmap, ...) — as
 * UCX's memory hooks do, invisible to LD_PRELOAD and to uprobes on libc mmap — copies the payload in,
 * and, when the transfer completes, hands the buffer to a deferred-release queue instead of unmapping it.
 * The queue is drained only when it holds more than XFER_MAX_UNRELEASED entries, unbounded by default
 * (like UCX_RCACHE_MAX_UNRELEASED=inf), so in the default configuration every buffer stays mapped.
 * The queue's own descriptor array grows with mremap(MREMAP_MAYMOVE): an anonymous mapping that keeps
 * growing and changing address, the pmap picture of the original hunt.
 *
 * xfer_recv() is the innocent path: map, use, unmap at once (churn that must not be reported).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

struct release_entry {
    void *addr;
    size_t len;
    uint64_t transfer_id;
    char remote_key[104]; /* what a real transport keeps per registered region */
};

static struct release_entry *queue;
static size_t queue_len, queue_cap;
static size_t max_unreleased = (size_t)-1;
static uint64_t next_id;

static void *raw_map(size_t len) {
    long r = syscall(SYS_mmap, 0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return r == -1 ? NULL : (void *)r;
}

static void raw_unmap(void *p, size_t len) { syscall(SYS_munmap, p, len); }

int xfer_init(void) {
    const char *s = getenv("XFER_MAX_UNRELEASED");
    if (s && *s && strcmp(s, "inf") != 0) max_unreleased = strtoull(s, NULL, 10);
    return 0;
}

static void drain(size_t keep) {
    while (queue_len > keep) {
        queue_len--;
        raw_unmap(queue[queue_len].addr, queue[queue_len].len);
    }
}

static int defer_release(void *addr, size_t len) {
    if (queue_len == queue_cap) {
        size_t old = queue_cap * sizeof *queue;
        size_t cap = queue_cap ? queue_cap * 2 : 64;
        void *n = queue ? mremap(queue, old, cap * sizeof *queue, MREMAP_MAYMOVE) : raw_map(cap * sizeof *queue);
        if (n == MAP_FAILED || n == NULL) return -1;
        queue = n;
        queue_cap = cap;
    }
    struct release_entry *e = &queue[queue_len++];
    e->addr = addr;
    e->len = len;
    e->transfer_id = next_id++;
    memset(e->remote_key, 0x5a, sizeof e->remote_key);
    if (queue_len > max_unreleased) drain(max_unreleased / 2);
    return 0;
}

/* Sends len bytes: stage them in a freshly mapped buffer, "transmit", defer the release. */
long xfer_send(const char *payload, size_t len, size_t buffer_len) {
    if (buffer_len < len) buffer_len = len;
    char *buf = raw_map(buffer_len);
    if (!buf) return -1;
    memcpy(buf, payload, len);
    for (size_t o = len; o < buffer_len; o += 4096) buf[o] = 1; /* the transport touches the whole buffer */
    long sum = 0;
    for (size_t o = 0; o < buffer_len; o += 4096) sum += buf[o];
    if (defer_release(buf, buffer_len) != 0) raw_unmap(buf, buffer_len);
    return sum;
}

/* Receives into a scratch buffer and releases it immediately: churn, no leak. */
long xfer_recv(size_t buffer_len) {
    char *buf = raw_map(buffer_len);
    if (!buf) return -1;
    for (size_t o = 0; o < buffer_len; o += 4096) buf[o] = 2;
    long sum = buf[0];
    raw_unmap(buf, buffer_len);
    return sum;
}

size_t xfer_unreleased(void) { return queue_len; }
