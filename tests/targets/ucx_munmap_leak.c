/* A real UCX 1.20.1 process that reproduces the seed-002 mechanism.
 *
 * It creates a UCP context (memory hooks on by default: libc's mmap/munmap are patched to jump into
 * libucm), then mmaps and munmaps small anonymous regions at a steady rate. Each munmap is reported to
 * the registration cache, which queues an invalidation entry; the entries come from a memory pool that
 * UCX grows with raw mmap syscalls (ucs_rcache_mp_chunk_alloc, ~148 KiB chunks) and never returns while
 * nobody drains the queue. With UCX_RCACHE_MAX_UNRELEASED=1024, UCX_MEM_MMAP_HOOK_MODE=none or
 * UCX_RCACHE_ENABLE=n the same loop stays flat: the negative controls.
 *
 * usage: ucx_munmap_leak [munmaps_per_second] [seconds] [munmaps]
 *        (defaults: 5000/s, run until killed; seconds 0: no time limit; munmaps: stop after that many,
 *        a multiple of 100)
 * Prints "ready <pid>" once the context exists; with UCX_MUNMAP_LEAK_GO=PATH it then waits until PATH
 * exists before the first munmap (a handshake: the caller measures first). With UCX_MUNMAP_LEAK_KEEP=K the
 * program also leaks by itself: every K-th region is kept (its mmap, like every mmap of this process, goes
 * through UCX's hook: libc's mmap jumps into libucm, which makes the raw syscall). Prints "done N" (N munmaps)
 * when the time or the count is up, and keeps sleeping, so a tracer can still read the final state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long rate = argc > 1 ? atol(argv[1]) : 5000;
    double seconds = argc > 2 ? atof(argv[2]) : 0;
    long total = argc > 3 ? atol(argv[3]) : 0;
    const char *go = getenv("UCX_MUNMAP_LEAK_GO");
    const char *keep_env = getenv("UCX_MUNMAP_LEAK_KEEP");
    long keep = keep_env ? atol(keep_env) : 0;
    ucp_config_t *config;
    ucp_context_h context;
    ucp_params_t params;

    if (ucp_config_read(NULL, NULL, &config) != UCS_OK) {
        fprintf(stderr, "ucp_config_read failed\n");
        return 1;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG;
    if (ucp_init(&params, config, &context) != UCS_OK) {
        fprintf(stderr, "ucp_init failed\n");
        return 1;
    }
    ucp_config_release(config);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (go && access(go, F_OK) != 0)
        usleep(10000);

    /* Batches of 100 per tick keep the rate steady without a syscall-heavy sleep per munmap. */
    const long batch = 100;
    double start = now_s(), next = start;
    long done = 0;
    for (;;) {
        if ((seconds > 0 && now_s() - start >= seconds) || (total > 0 && done >= total))
            break;
        for (long i = 0; i < batch; i++) {
            /* Two pages, unmap one of them: the munmapped ranges stay disjoint, as in vLLM's
             * pattern, so nothing merges them in the queue. */
            char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                perror("mmap");
                return 1;
            }
            p[0] = 1;
            p[4096] = 1;
            if (keep > 0 && (done + i) % keep == keep - 1)
                continue;  /* the program's own leak */
            munmap(p, 8192);
        }
        done += batch;
        next += (double)batch / rate;
        double wait = next - now_s();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
    }
    printf("done %ld\n", done);
    fflush(stdout);
    for (;;)
        pause();
    ucp_cleanup(context);
    return 0;
}
