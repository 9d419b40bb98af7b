/* LD_PRELOAD test library: the seed-002 mechanism inside a real vLLM process.
 *
 * On 2 CPU cores a real decode worker does almost no munmaps under the load a test can afford, so UCX's
 * own invalidation queue cannot grow measurably. This library reproduces the mechanism in the chosen
 * process of the instance it is preloaded into:
 *
 *  - an interposed munmap() forwards to the next munmap (libc's, itself patched by UCX's memory hooks
 *    when they are active, so UCX still sees every unmap), then queues an "invalidation entry";
 *  - the queue is never drained and its storage is mapped by raw syscall(SYS_mmap) in 148 KiB chunks,
 *    as ucs_rcache_mp_chunk_alloc does: invisible to LD_PRELOAD mmap hooks and to libc mmap uprobes;
 *  - a churn thread, started only in the process whose title (comm) begins with
 *    LEAKTRACE_TESTLEAK_COMM (default "VLLM::Worker", the process holding NIXL/UCX on the CPU build),
 *    maps and unmaps a small buffer LEAKTRACE_TESTLEAK_HZ times per second (default 2000), standing in
 *    for the per-request buffer churn of a busy GPU decode worker.
 *
 * LEAKTRACE_TESTLEAK_ENTRY: bytes per queued entry (default 148, as measured for UCX 1.20).
 * LEAKTRACE_TESTLEAK_QUEUE=0: churn only, no queue of our own (then only UCX's hooks see the munmaps).
 * Every other process of the instance (API server, EngineCore, resource tracker) is left alone: the
 * watcher thread there gives up after LEAKTRACE_TESTLEAK_WAIT seconds (default 300) without a match.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BYTES (148 * 1024)

static int (*next_munmap)(void *, size_t);
static volatile int active;
static int own_queue = 1;
static size_t entry_bytes = 148;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static char *chunk;
static size_t chunk_used = CHUNK_BYTES;
static unsigned long queued;

/* Storage for queue entries, by raw syscall: the caller glibc's syscall() reports is this library. */
static __attribute__((noinline)) char *invq_chunk_alloc(void)
{
    long p = syscall(SYS_mmap, NULL, (size_t)CHUNK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == -1 ? NULL : (char *)p;
}

static __attribute__((noinline)) void invq_push(void *addr, size_t len)
{
    pthread_mutex_lock(&queue_lock);
    if (chunk_used + entry_bytes > CHUNK_BYTES) {
        char *c = invq_chunk_alloc();
        if (!c) {
            pthread_mutex_unlock(&queue_lock);
            return;
        }
        chunk = c;
        chunk_used = 0;
    }
    char *e = chunk + chunk_used;
    memset(e, 0xab, entry_bytes); /* touched: the pages count in RSS, as UCX's entries do */
    memcpy(e, &addr, sizeof(addr));
    if (entry_bytes >= 2 * sizeof(len))
        memcpy(e + sizeof(addr), &len, sizeof(len));
    chunk_used += entry_bytes;
    queued++;
    pthread_mutex_unlock(&queue_lock);
}

int munmap(void *addr, size_t len)
{
    if (!next_munmap)
        next_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    int rc = next_munmap(addr, len);
    if (rc == 0 && active && own_queue)
        invq_push(addr, len);
    return rc;
}

/* The process title: /proc/self/comm is the main thread's name (prctl(PR_GET_NAME) would give this
 * thread's own name, which setproctitle never changes). */
static int comm_matches(const char *prefix)
{
    char comm[32] = {0};
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, comm, sizeof(comm) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    size_t len = strlen(prefix) < 15 ? strlen(prefix) : 15;
    return strncmp(comm, prefix, len) == 0;
}

static void *churn(void *arg)
{
    (void)arg;
    const char *prefix = getenv("LEAKTRACE_TESTLEAK_COMM");
    const char *hz_s = getenv("LEAKTRACE_TESTLEAK_HZ");
    const char *wait_s = getenv("LEAKTRACE_TESTLEAK_WAIT");
    double hz = hz_s ? atof(hz_s) : 2000.0;
    double wait = wait_s ? atof(wait_s) : 300.0;
    if (!prefix)
        prefix = "VLLM::Worker";
    /* The title is set by Python (setproctitle) well after this constructor ran: poll for it. */
    for (double waited = 0; !comm_matches(prefix); waited += 0.5) {
        if (waited >= wait)
            return NULL;
        usleep(500000);
    }
    active = 1;
    if (hz <= 0)
        return NULL;
    const long batch = 20;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (;;) {
        for (long i = 0; i < batch; i++) {
            char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED)
                continue;
            p[0] = 1;
            munmap(p, 4096); /* half of it: the unmapped ranges stay disjoint */
            munmap(p + 4096, 4096);
        }
        long ns = (long)(batch * 2 / hz * 1e9);
        next.tv_nsec += ns % 1000000000L;
        next.tv_sec += ns / 1000000000L + next.tv_nsec / 1000000000L;
        next.tv_nsec %= 1000000000L;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    return NULL;
}

__attribute__((constructor)) static void invq_init(void)
{
    const char *q = getenv("LEAKTRACE_TESTLEAK_QUEUE");
    if (q && q[0] == '0')
        own_queue = 0;
    const char *e = getenv("LEAKTRACE_TESTLEAK_ENTRY");
    if (e && atol(e) > 0)
        entry_bytes = (size_t)atol(e);
    if (entry_bytes > CHUNK_BYTES)
        entry_bytes = CHUNK_BYTES;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, churn, NULL);
    pthread_attr_destroy(&attr);
}
