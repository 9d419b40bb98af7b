/* leaktrace's kernel half (BCC): every mmap/munmap/mremap/brk (and SysV shmat/shmdt) of the target process set.
 *
 * Fast path: a successful plain mmap becomes an entry of `regions` (address-keyed, per process);
 * a munmap or mremap that exactly matches an entry is settled here (an entry born after the process's
 * last slow event that may have cut it: `targets`), so a balanced map/unmap workload sends nothing to
 * user space. Everything the kernel cannot settle by one key lookup
 * (partial unmaps, unmaps spanning regions, MAP_FIXED overlays, brk, fork/exec/exit) goes to
 * user space through a ring buffer whose wake-ups are batched; the user-space interval ledger
 * (leaktrace/probes/bpf/ledger.py) resolves it, ordering both sides with the `seq` timestamps.
 *
 * Processes: `targets` holds the traced tgids; children are added here at fork, so a child is
 * traced from its first syscall.
 *
 * Heaps: brk (the main heap) and mprotect (glibc's arena heaps grow by making their PROT_NONE reservation
 * read/write) are sent with a window of the raw user stack (emit_window): user space scans it for return
 * addresses, the first outside libc/ld.so naming the caller of malloc (leaktrace/probes/bpf/stackscan.py).
 * Anonymous mmaps called from libc (its code range per process in `runtime`: malloc's chunks above the mmap
 * threshold, new arena heaps, thread stacks) carry a window too: kept in the kernel beside their region
 * (`windows`) while there is room, else sent with a slow event, as are PROT_NONE reservations (a new arena heap,
 * grown by mprotect) and mremaps made through libc that the kernel cannot settle (glibc's variadic mremap
 * wrapper hides its caller). Brk and mprotect growth come once per growth of the heap (~128 KiB), not once per
 * malloc.
 * Memory hooks (UCX's libucm, `hooks`, struct lt_hook): an anonymous mmap called from the hook's code is blamed
 * on the code that called the hooked function, read at the stack offset user space learned for that path through
 * the hook (`hook_sites`, `hook_paths`); the region stays on the fast path (a process whose every mmap is hooked
 * sends no more than one whose mmaps are not).
 *
 * Attribution: the word at the user stack pointer at syscall entry is the return address into
 * the caller of glibc's syscall()/mmap() wrappers (they set up no frame), which names the
 * calling library even when it has no frame pointers. A frame-pointer user stack is captured
 * once per (process, return address), not once per call.
 *
 * PID namespaces: the kernel's pids (bpf_get_current_pid_tgid, sched_process_fork's child_pid) are
 * init-namespace pids, while user space names its targets, reads /proc and keys its ledger with the
 * pids of the namespace its /proc belongs to. When that is not the init namespace (a container without
 * hostPID, a node of the cluster test), user space compiles with LT_PIDNS_DEV/LT_PIDNS_INO (the device
 * and inode of that namespace's nsfs file) and:
 *   - names its targets by namespace pid in `ns_targets`;
 *   - a syscall from a host tgid missing from `targets` asks bpf_get_ns_current_pid_tgid() for its
 *     namespace tgid, and if that is in `ns_targets`, the host tgid joins `targets` (so later calls take
 *     the fast path, and forks keep working with sched_process_fork's host pids);
 *   - every key and event carries namespace pids (the helper, once per traced call);
 *   - a child's namespace pid is only known in the child, so its FORK event is sent at its first traced
 *     event (its `targets` value holds the parent's namespace tgid until then).
 * Tasks in a PID namespace nested below that one are not followed (the helper numbers only the task's
 * own namespace). Without LT_PIDNS_INO none of this is compiled in: the host-pid path is unchanged.
 *
 * Compile-time knobs (-D from leaktrace/probes/bpf/loader.py): LT_MAX_REGIONS, LT_MAX_SITES, LT_MAX_STACKS,
 * LT_RING_PAGES, LT_WAKE_EVERY, LT_WINDOW_EVERY_NS, LT_HOOK_LEARN_EVERY_NS, LT_HOOK_WINDOW_EVERY_NS,
 * LT_MAX_FAULT_KEYS, LT_FAULT_SAMPLE, LT_NO_FAULTS (no page-fault probe), LT_REGS_IP_OFF, LT_REGS_SP_OFF, LT_PIDNS_DEV + LT_PIDNS_INO,
 * LT_TASK_EXIT_CODE_OFF, LT_OOM_TRACEPOINT (defined when the kernel has oom:mark_victim), LT_SYSV_TRACEPOINTS
 * (defined when it has the shmat/shmdt syscall tracepoints).
 *
 * Page faults (raw tracepoints page_fault_user and page_fault_kernel, the kernel writing a user page for read() or
 * recv()): memory that grows with no mapping syscall at all (a region reserved before attach, written piece by
 * piece) is seen only as faults. A write fault of a traced process is counted in
 * `fault_counts` by (process, ip, site, 2 MiB bucket), never sent per fault; the first fault of a new
 * (process, ip, site) sends one stack window (LT_EV_FAULTWIN), from which user space names the code that
 * touched the page, past libc's memset/memcpy.
 *
 * How a process ended: at sched_process_exit the kernel has already stored the wait status in
 * task->exit_code (read at LT_TASK_EXIT_CODE_OFF, the offset user space takes from the kernel's BTF; no
 * headers needed); oom:mark_victim names the OOM killer's victims, remembered in `oom_victims` (host pids)
 * until the victim's exit event carries LT_EXIT_OOM.
 */
#include "leaktrace.h"

#ifndef LT_MAX_REGIONS
#define LT_MAX_REGIONS 262144
#endif
#ifndef LT_MAX_SITES
#define LT_MAX_SITES 65536
#endif
#ifndef LT_MAX_STACKS
#define LT_MAX_STACKS 16384
#endif
/* The ring's size, for every load (hunt and doctor alike): 8192 pages, 32 MiB, ~280,000 records. A loaded
 * P/D pair makes 2,000-3,200 traced calls a second and the poll thread can go 20-40 s undrained on two
 * busy cores; a lost munmap leaves its region outstanding, so the ring holds that much. */
#ifndef LT_RING_PAGES
#define LT_RING_PAGES 8192
#endif
#ifndef LT_WINDOW_EVERY_NS
#define LT_WINDOW_EVERY_NS 1000000  /* contiguous mprotect commits of a thread: one stack window per ms */
#endif
#ifndef LT_HOOK_LEARN_EVERY_NS
#define LT_HOOK_LEARN_EVERY_NS 10000000  /* hooked mmaps on paths not learned yet: one window per 10 ms per process */
#endif
#ifndef LT_HOOK_WINDOW_EVERY_NS
#define LT_HOOK_WINDOW_EVERY_NS 5000000  /* malloc chunks through the hook: one stack window per thread per 5 ms */
#endif
/* Fault keys held between two ticks (user space takes and deletes them every tick): a fault storm over fresh
 * memory makes one key per 2 MiB touched per faulting instruction. */
#ifndef LT_MAX_FAULT_KEYS
#define LT_MAX_FAULT_KEYS 32768
#endif
/* 1 in LT_FAULT_SAMPLE write faults, at random, is counted: the counts name who touches a region (shares, not
 * sizes: the resident growth itself is read from /proc), and counting a quarter of them halves the probe's cost
 * on a fault storm (bench/bench_faults.py). faults.py's DEFAULT_SAMPLE says the same. */
#ifndef LT_FAULT_SAMPLE
#define LT_FAULT_SAMPLE 4
#endif
#ifndef LT_WAKE_EVERY
#define LT_WAKE_EVERY 2048
#endif
/* Stack windows of malloc's own chunks kept in the kernel (`windows`): each ~4 KiB, allocated as used (a
 * full map sends the next chunks the slow way, as before). */
#ifndef LT_MAX_WINDOWS
#define LT_MAX_WINDOWS 8192
#endif
/* struct pt_regs offsets of ip and sp (x86_64). */
#ifndef LT_REGS_IP_OFF
#define LT_REGS_IP_OFF 128
#endif
#ifndef LT_REGS_SP_OFF
#define LT_REGS_SP_OFF 152
#endif

#define LT_PAGE_MASK 4095ULL
#define LT_MAP_FIXED 0x10ULL
#define LT_PROT_EXEC 0x4ULL
#define LT_MAP_ANONYMOUS 0x20ULL
#define LT_MREMAP_FIXED 2ULL
#define LT_MREMAP_DONTUNMAP 4ULL
#define LT_SHM_RDONLY 010000ULL
#define LT_SHM_EXEC 0100000ULL
#define LT_MAX_ERRNO 4095

/* host tgid (and tid of threads) -> struct lt_target: in a PID namespace, the parent's namespace tgid while the
 * child's FORK event is still to be sent; and the process's `dirty` seq: that of its last slow event that may unmap or
 * map over kernel-owned regions (a munmap or mremap not settled here, a MAP_FIXED mmap, shmat, shmdt). Until user
 * space applies such an event, a region it cut is still whole in `regions`, and a later exact munmap or mremap of
 * that region's key would be settled against what it no longer is (its head unmapped and the hole mapped again, a
 * piece moved away): only regions born after the process's last such event are settled here; older ones go to
 * user space, after it. Kept in `targets`, whose lookup every traced call makes anyway. */
BPF_HASH(targets, u32, struct lt_target, 65536);
#ifdef LT_PIDNS_INO
#ifndef LT_PIDNS_DEV
#error "LT_PIDNS_INO needs LT_PIDNS_DEV"
#endif
BPF_HASH(ns_targets, u32, u8, 65536);  /* namespace tgids user space asked for */
#endif
BPF_HASH(regions, struct lt_region_key, struct lt_region, LT_MAX_REGIONS);
/* malloc's own chunks (an anonymous mmap called from libc, neither a reservation nor through a hook) stay on the
 * fast path: their stack window, which names malloc's caller, waits here under {tgid, born} and goes with its
 * region (an exact munmap deletes both; user space reads it for a region still held when the books are read, or
 * takes it with a region it absorbs). Under allocator churn nearly every chunk is unmapped within milliseconds:
 * the pair then sends nothing. */
BPF_F_TABLE("hash", struct lt_window_key, struct lt_window_event, windows, LT_MAX_WINDOWS, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(window_scratch, struct lt_window_event, 1);  /* a window being filled (too big for the stack) */
/* The traced call an exit program is handling, per CPU: the program runs to its end on one CPU, and the record
 * does not fit the BPF stack beside the event built from it. */
BPF_PERCPU_ARRAY(calls, struct lt_call, 1);
BPF_HASH(sites, struct lt_site_key, s64, LT_MAX_SITES);
BPF_HASH(runtime, u32, struct lt_range, 65536);  /* tgid (user-space numbering) -> libc's code */
/* tgid -> the code of an allocator preloaded or linked in glibc malloc's place (jemalloc, tcmalloc): its
 * mmaps are malloc's, blamed on the code that called malloc like glibc's own */
BPF_HASH(allocator_code, u32, struct lt_range, 65536);
BPF_HASH(hooks, u32, struct lt_hook, 65536);      /* tgid (user-space numbering) -> its memory hook, once mapped */
BPF_HASH(hook_sites, struct lt_hook_key, u64, 16384);                 /* learned: see struct lt_hook_key */
BPF_HASH(hook_paths, struct lt_hook_key, struct lt_hook_path, 16384);
BPF_HASH(hook_own, struct lt_hook_key, u8, 16384);  /* {tgid, UCX's caller of the trampoline}: its window was sent */
/* A thread's last mprotect commit: where it ended, and when the last one with a stack window was sent. */
struct lt_commit {
    u64 window_seq;
    u64 end;
};
BPF_TABLE("lru_hash", u32, struct lt_commit, last_commit, 65536);  /* host tid -> its last commit */
BPF_TABLE("lru_hash", u32, u64, last_hook_window, 65536);  /* host tid -> its last hooked malloc chunk's window */
BPF_STACK_TRACE(stacks, LT_MAX_STACKS);
BPF_PERCPU_ARRAY(counters, u64, LT_NCOUNTERS);
/* host pid (the thread the OOM killer marked) -> bpf_ktime_get_ns() of the mark; any process's, bounded */
BPF_TABLE("lru_hash", u32, u64, oom_victims, 1024);
BPF_RINGBUF_OUTPUT(events, LT_RING_PAGES);
/* Page faults: see struct lt_fault_key (bpf/leaktrace.h) and the probe at the end of this file. */
BPF_HASH(fault_counts, struct lt_fault_key, u64, LT_MAX_FAULT_KEYS);
BPF_TABLE("lru_hash", struct lt_fault_key, u8, fault_windows, LT_MAX_SITES);  /* {tgid, ip, site, 0}: window sent */
BPF_PERCPU_ARRAY(fault_stats, u64, LT_NFSTATS);

static __always_inline void count(u32 idx)
{
    u64 *v = counters.lookup(&idx);
    if (v)
        *v += 1;
}

/* A slow event of the current process that may cut its kernel-owned regions (see `targets`). */
static __always_inline void mark_dirty(u64 seq)
{
    u32 host_tgid = bpf_get_current_pid_tgid() >> 32;
    struct lt_target *t = targets.lookup(&host_tgid);
    if (t)
        t->dirty = seq;
}

static __always_inline u64 page_up(u64 len)
{
    return (len + LT_PAGE_MASK) & ~LT_PAGE_MASK;
}

static __always_inline int is_err(long ret)
{
    return ret < 0 && ret >= -LT_MAX_ERRNO;
}

/* Caller return address and syscall ip from the user registers saved at syscall entry. */
#if LT_REGS_SP_OFF <= LT_REGS_IP_OFF
#error "read_site reads ip..sp in one span: the saved sp must follow the saved ip in struct pt_regs"
#endif
static __always_inline void read_site(u64 *site, u64 *ip)
{
    struct task_struct *task = bpf_get_current_task_btf();
    char *regs = (char *)bpf_task_pt_regs(task);
    /* ip and sp in one read (x86_64: ip, cs, flags, sp): one helper call less on every traced syscall */
    u64 span[(LT_REGS_SP_OFF - LT_REGS_IP_OFF) / 8 + 1] = {};
    *site = 0;
    bpf_probe_read_kernel(span, sizeof(span), regs + LT_REGS_IP_OFF);
    *ip = span[0];
    u64 sp = span[(LT_REGS_SP_OFF - LT_REGS_IP_OFF) / 8];
    if (sp)
        bpf_probe_read_user(site, sizeof(*site), (void *)sp);
}

/* One user stack per (process, call site): the first call pays for the walk, later calls look it up. */
static __always_inline s64 site_stack(void *ctx, u32 tgid, u64 site)
{
    struct lt_site_key key = {.tgid = tgid, .pad = 0, .site = site};
    s64 *known = sites.lookup(&key);
    if (known)
        return *known;
    s64 id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    if (id >= 0)
        count(LT_CNT_STACKS);
    sites.update(&key, &id);
    return id;
}

/* Slow path. Wake-ups are batched: user space consumes on a timer and is woken early only every
 * LT_WAKE_EVERY events per CPU, so a burst costs no wake-up per event. */
static __always_inline void emit(struct lt_event *ev)
{
    u32 idx = LT_CNT_SLOW;
    u64 *sent = counters.lookup(&idx);
    u64 flags = BPF_RB_NO_WAKEUP;
    if (sent && (*sent % LT_WAKE_EVERY) == LT_WAKE_EVERY - 1)
        flags = BPF_RB_FORCE_WAKEUP;
    if (events.ringbuf_output(ev, sizeof(*ev), flags) != 0)
        count(LT_CNT_LOST);
    else if (sent)
        *sent += 1;
}

/* The raw user stack from the stack pointer at the syscall into w's window. */
static __always_inline void fill_window(struct lt_window_event *w)
{
    struct task_struct *task = bpf_get_current_task_btf();
    char *regs = (char *)bpf_task_pt_regs(task);
    u64 sp = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), regs + LT_REGS_SP_OFF);
    w->sp = sp;
    w->len = 0;
    if (sp && bpf_probe_read_user(w->data, LT_SCAN_BYTES, (void *)sp) == 0)
        w->len = LT_SCAN_BYTES;
    else if (sp && bpf_probe_read_user(w->data, LT_SCAN_MEDIUM, (void *)sp) == 0)
        w->len = LT_SCAN_MEDIUM;
    else if (sp && bpf_probe_read_user(w->data, LT_SCAN_SMALL, (void *)sp) == 0)
        w->len = LT_SCAN_SMALL;
}

/* A heap's growth: the event with a window of the raw user stack (struct lt_window_event), reserved in
 * the ring buffer itself (the window does not fit the BPF stack). Same wake-up batching as emit(). */
static __always_inline void emit_window(struct lt_event *ev)
{
    struct lt_window_event *w = events.ringbuf_reserve(sizeof(struct lt_window_event));
    if (!w) {
        count(LT_CNT_LOST);
        return;
    }
    __builtin_memcpy(&w->ev, ev, sizeof(*ev));
    fill_window(w);
    u32 idx = LT_CNT_SLOW;
    u64 *sent = counters.lookup(&idx);
    u64 flags = BPF_RB_NO_WAKEUP;
    if (sent && (*sent % LT_WAKE_EVERY) == LT_WAKE_EVERY - 1)
        flags = BPF_RB_FORCE_WAKEUP;
    events.ringbuf_submit(w, flags);
    if (sent)
        *sent += 1;
}

/* Keep w (its event: an mmap kept in `regions`) with its window in `windows` under {tgid, its seq}: 0 when there is
 * no room. */
static __always_inline int keep_window(struct lt_window_event *w)
{
    fill_window(w);
    struct lt_window_key wk = {.tgid = w->ev.tgid, .pad = 0, .born = w->ev.seq};
    return windows.insert(&wk, w) == 0;
}

static __always_inline void drop_window(u32 tgid, u64 born)
{
    struct lt_window_key wk = {.tgid = tgid, .pad = 0, .born = born};
    windows.delete(&wk);
}

/* Is a return address inside the process's libc code or its allocator's (the `runtime` and `allocator_code`
 * maps user space fills)? */
static __always_inline int called_from_libc(u32 tgid, u64 site)
{
    struct lt_range *r = runtime.lookup(&tgid);
    if (r && site >= r->start && site < r->end)
        return 1;
    r = allocator_code.lookup(&tgid);
    return r && site >= r->start && site < r->end;
}

/* The user stack pointer saved at syscall entry. */
static __always_inline u64 user_sp(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    char *regs = (char *)bpf_task_pt_regs(task);
    u64 sp = 0;
    bpf_probe_read_kernel(&sp, sizeof(sp), regs + LT_REGS_SP_OFF);
    return sp;
}

/* A window of a hooked call for user space: to learn a path through the hook from (hook_learn: at most one per
 * LT_HOOK_LEARN_EVERY_NS per process), or to show which part of UCX maps for itself (once per caller). */
static __always_inline void hook_window(struct lt_call *p, u64 now)
{
    struct lt_event ev = {};
    ev.seq = now;
    ev.type = LT_EV_HOOKWIN;
    ev.tgid = p->tgid;
    ev.tid = p->tid;
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = -1;
    emit_window(&ev);
}

static __always_inline void hook_learn(struct lt_hook *h, struct lt_call *p, u64 now)
{
    if (now - h->learn_seq < LT_HOOK_LEARN_EVERY_NS)
        return;
    h->learn_seq = now;
    hook_window(p, now);
}

static __always_inline u64 read_user_word(u64 addr)
{
    u64 word = 0;
    if (bpf_probe_read_user(&word, sizeof(word), (void *)addr) != 0)
        return 0;
    return word;
}

/* An anonymous mmap whose call site is in the process's memory hook (`h`): the return address to blame. The
 * code that called the hooked function when the hook dispatched it (`*off` then says where it was read); the
 * site itself when UCX mapped for itself, or while the call's path is not known. */
static __always_inline u64 hooked_site(struct lt_hook *h, struct lt_call *p, u64 now, u32 *off)
{
    struct lt_hook_key key = {.tgid = p->tgid, .pad = 0, .addr = p->site};
    u64 *caller_off = hook_sites.lookup(&key);
    u64 sp = user_sp();
    if (!caller_off || !sp) {
        hook_learn(h, p, now);
        return p->site;
    }
    u64 caller = read_user_word(sp + *caller_off);
    if (caller < h->start || caller >= h->end) {
        /* UCX's own mapping: the trampoline was called from outside the hook. Its call path is shown once. */
        key.addr = caller;
        if (!hook_own.lookup(&key)) {
            u8 seen = 1;
            hook_own.update(&key, &seen);
            hook_window(p, now);
        }
        return p->site;
    }
    key.addr = caller;
    struct lt_hook_path *path = hook_paths.lookup(&key);
    if (!path || read_user_word(sp + path->last_off) != path->last_ret) {
        hook_learn(h, p, now);
        return p->site;
    }
    u64 word = read_user_word(sp + path->dispatch_off);
    if (!word)
        return p->site;
    *off = (u32)path->dispatch_off;
    return word;
}

/* The caller as user space numbers it, and as the kernel does. */
struct lt_ids {
    u32 tgid;
    u32 tid;
    u32 host_tgid;
    u32 host_tid;
    u64 dirty;  /* the process's lt_target.dirty */
};

/* Is the current task traced? Fills `ids` (user-space numbering) when it is. */
static __always_inline int current_ids(struct lt_ids *ids)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    ids->host_tgid = tgid;
    ids->host_tid = (u32)id;
#ifndef LT_PIDNS_INO
    struct lt_target *t = targets.lookup(&tgid);
    if (!t)
        return 0;
    ids->tgid = tgid;
    ids->tid = (u32)id;
    ids->dirty = t->dirty;
    return 1;
#else
    struct bpf_pidns_info ns = {};
    struct lt_target *t = targets.lookup(&tgid);
    /* Fails (and so does not trace) for tasks of any other PID namespace. */
    if (bpf_get_ns_current_pid_tgid(LT_PIDNS_DEV, LT_PIDNS_INO, &ns, sizeof(ns)) != 0)
        return 0;
    ids->tgid = ns.tgid;
    ids->tid = ns.pid;
    if (!t) {
        u32 nstgid = ns.tgid;
        if (!ns_targets.lookup(&nstgid))
            return 0;
        struct lt_target fresh = {};
        targets.update(&tgid, &fresh);
        ids->dirty = 0;
        return 1;
    }
    ids->dirty = t->dirty;
    if (t->parent) {
        /* First traced event of a child born traced: now its namespace pid is known. */
        struct lt_event ev = {};
        ev.seq = bpf_ktime_get_ns();
        ev.type = LT_EV_FORK;
        ev.tgid = t->parent;
        ev.aux_pid = ns.tgid;
        ev.stack_id = -1;
        t->parent = 0;
        emit(&ev);
    }
    return 1;
#endif
}

/* A syscall's arguments (x86_64: di, si, dx, r10, r8, r9), ip and stack pointer: the user registers the kernel
 * saved at its entry (struct pt_regs, r10 through sp), which it leaves as they were until the call returns. So
 * mmap, mremap, brk, mprotect and shmat are handled at their exit alone: no program at their entry, no record kept
 * per thread between the two. */
struct lt_uregs {
    u64 r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp;
};
#define LT_REGS_R10_OFF 56
_Static_assert(LT_REGS_R10_OFF + 9 * 8 == LT_REGS_IP_OFF && LT_REGS_R10_OFF + 12 * 8 == LT_REGS_SP_OFF,
               "struct lt_uregs follows struct pt_regs from r10 to sp");

/* The call at its exit, when the calling process is traced: who made it, its call site and stack, and its
 * registers in `u` (each handler takes its arguments from them). */
static __always_inline struct lt_call *call_at_exit(void *ctx, struct lt_uregs *u)
{
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    count(LT_CNT_SYSCALLS);
    u32 zero = 0;
    struct lt_call *p = calls.lookup(&zero);
    if (!p)
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    if (bpf_probe_read_kernel(u, sizeof(*u), (char *)bpf_task_pt_regs(task) + LT_REGS_R10_OFF) != 0)
        __builtin_memset(u, 0, sizeof(*u));
    __builtin_memset(p, 0, sizeof(*p));
    p->tgid = ids.tgid;
    p->tid = ids.tid;
    p->dirty = ids.dirty;
    p->ip = u->ip;
    if (u->sp)
        bpf_probe_read_user(&p->site, sizeof(p->site), (void *)u->sp);
    p->stack_id = site_stack(ctx, ids.tgid, p->site);
    return p;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(args, &u);
    if (!p)
        return 0;
    p->addr = u.di;
    p->len = u.si;
    p->prot = u.dx;
    p->flags = u.r10;
    p->fd = u.r8;
    long ret = args->ret;
    if (is_err(ret)) {
        count(LT_CNT_FAILED);
        return 0;
    }
    u32 tgid = p->tgid, tid = p->tid;
    u64 len = page_up(p->len);
    u64 now = bpf_ktime_get_ns();
    int anon = (p->flags & LT_MAP_ANONYMOUS) != 0;
    u64 site = p->site;
    s64 stack_id = p->stack_id;
    u32 hook_off = 0;  /* a hooked call: where the hooked function's caller sits in the window */
    struct lt_hook *h = anon ? hooks.lookup(&tgid) : 0;
    if (h && site >= h->start && site < h->end) {
        u64 caller = hooked_site(h, p, now, &hook_off);
        if (caller != site) {
            site = caller;
            stack_id = site_stack(args, tgid, caller);
        }
    }
    int from_libc = anon && called_from_libc(tgid, site);
    if (from_libc && hook_off) {
        /* malloc's chunk through the hook: with a small mmap threshold a worker makes ~1,000 a second, and a
         * window for each (plus its munmap, then not settled here) would overflow the ring. One window per thread
         * per LT_HOOK_WINDOW_EVERY_NS; the others stay on the fast path with libc's site, and user space gives
         * them the caller of their thread's last window (a thread's burst of chunks has one caller). */
        u32 host_tid = (u32)bpf_get_current_pid_tgid();
        u64 *last = last_hook_window.lookup(&host_tid);
        if (last && now - *last < LT_HOOK_WINDOW_EVERY_NS)
            from_libc = 0;
        else
            last_hook_window.update(&host_tid, &now);
    }
    /* The event is built in the window's scratch (the BPF stack has no room for both). */
    u32 zero = 0;
    struct lt_window_event *w = window_scratch.lookup(&zero);
    if (!w)
        return 0;
    struct lt_event *ev = &w->ev;
    __builtin_memset(ev, 0, sizeof(*ev));
    ev->seq = now;
    ev->type = LT_EV_MMAP;
    ev->tgid = tgid;
    ev->tid = tid;
    ev->addr = (u64)ret;
    ev->len = len;
    ev->flags = p->flags;
    ev->prot = p->prot;
    ev->fd = anon ? (u64)-1 : p->fd;
    ev->site = site;
    ev->ip = p->ip;
    ev->stack_id = stack_id;
    ev->aux_pid = hook_off;
    ev->result = ret;
    /* malloc's own chunk (not a PROT_NONE reservation, not through a hook): kept here with its window while
     * `windows` has room (see there); the slow way otherwise. */
    int windowed = from_libc && !hook_off && p->prot != 0 && !(p->flags & LT_MAP_FIXED) && keep_window(w);
    if (!(p->flags & LT_MAP_FIXED) && (!from_libc || windowed)) {
        /* A plain mmap always returns a range that was free: the kernel can own it outright. */
        struct lt_region_key key = {.tgid = tgid, .pad = 0, .start = (u64)ret};
        struct lt_region r = {};
        r.len = len;
        r.seq = now;
        r.born = now;
        r.site = site;
        r.ip = p->ip;
        r.stack_id = stack_id;
        r.tid = tid;
        r.prot = (u32)p->prot;
        r.flags = (u32)p->flags;
        r.fd = anon ? (u32)-1 : (u32)p->fd;
        r.window = windowed;
        /* Never over a region still keyed at this start: one cut by a slow event not applied yet (its head
         * unmapped, now reused). It stays for user space to absorb, and this mapping goes the slow way. */
        if (regions.insert(&key, &r) == 0) {
            count(LT_CNT_FAST_MAPS);
            if (!anon && (p->prot & LT_PROT_EXEC)) {
                struct lt_event hint = {};
                hint.seq = now;
                hint.type = LT_EV_LIBMAP;
                hint.tgid = tgid;
                hint.tid = tid;
                hint.addr = (u64)ret;
                hint.len = len;
                emit(&hint);
            }
            return 0;
        }
        if (!regions.lookup(&key))
            count(LT_CNT_MAP_FULL);
        if (windowed)
            drop_window(tgid, now);
    }
    if (p->flags & LT_MAP_FIXED)
        mark_dirty(now);
    if (from_libc)
        emit_window(ev);  /* malloc's own mmap: who called malloc is in the raw stack */
    else
        emit(ev);
    return 0;
}

/* munmap is decided at entry: an exact match is settled here; anything else is sent before the
 * unmap happens, so it is ordered before any mmap that reuses the freed range. */
TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    u32 tgid = ids.tgid, tid = ids.tid;
    count(LT_CNT_SYSCALLS);
    u64 addr = args->addr;
    u64 len = page_up(args->len);
    struct lt_region_key key = {.tgid = tgid, .pad = 0, .start = addr};
    struct lt_region *r = regions.lookup(&key);
    if (r && r->len == len && r->seq > ids.dirty) {
        if (r->window)
            drop_window(tgid, r->born);
        regions.delete(&key);
        count(LT_CNT_SETTLED);
        return 0;
    }
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    mark_dirty(ev.seq);
    ev.type = LT_EV_MUNMAP;
    ev.tgid = tgid;
    ev.tid = tid;
    ev.addr = addr;
    ev.len = len;
    read_site(&ev.site, &ev.ip);
    ev.stack_id = -1;
    emit(&ev);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mremap)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(args, &u);
    if (!p)
        return 0;
    p->addr = u.di;
    p->len = u.si;
    p->new_len = u.dx;
    p->flags = u.r10;
    p->new_addr = u.r8;
    long ret = args->ret;
    if (is_err(ret)) {
        count(LT_CNT_FAILED);
        return 0;
    }
    u32 tgid = p->tgid, tid = p->tid;
    u64 old_len = page_up(p->len);
    u64 new_len = page_up(p->new_len);
    u64 now = bpf_ktime_get_ns();
    struct lt_region_key key = {.tgid = tgid, .pad = 0, .start = p->addr};
    struct lt_region *r = regions.lookup(&key);
    if (r && r->len == old_len && old_len != 0 && !(p->flags & (LT_MREMAP_FIXED | LT_MREMAP_DONTUNMAP))
        && r->seq > p->dirty) {
        /* The whole region grew, shrank or moved into space that was free: still the kernel's. */
        struct lt_region moved = *r;
        moved.len = new_len;
        moved.seq = now;
        struct lt_region_key nkey = {.tgid = tgid, .pad = 0, .start = (u64)ret};
        regions.delete(&key);
        if (regions.insert(&nkey, &moved) == 0) {
            count(LT_CNT_SETTLED);
            return 0;
        }
        if (!regions.lookup(&nkey))
            count(LT_CNT_MAP_FULL);
        /* No room, or a cut region still keyed there (see sys_exit_mmap): hand the moved region to user space as
         * a fresh mapping (named by its call site: its window, if kept, goes). */
        if (moved.window)
            drop_window(tgid, moved.born);
        struct lt_event lost = {};
        lost.seq = now;
        lost.type = LT_EV_MMAP;
        lost.tgid = tgid;
        lost.tid = tid;
        lost.addr = (u64)ret;
        lost.len = new_len;
        lost.flags = moved.flags | LT_MAP_FIXED;
        lost.prot = moved.prot;
        lost.fd = moved.fd == (u32)-1 ? (u64)-1 : moved.fd;
        lost.site = moved.site;
        lost.ip = moved.ip;
        lost.stack_id = moved.stack_id;
        lost.result = ret;
        emit(&lost);
        return 0;
    }
    struct lt_event ev = {};
    ev.seq = now;
    mark_dirty(now);
    ev.type = LT_EV_MREMAP;
    ev.tgid = tgid;
    ev.tid = tid;
    ev.addr = p->addr;
    ev.len = old_len;
    ev.new_addr = (u64)ret;
    ev.new_len = new_len;
    ev.flags = p->flags;
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = p->stack_id;
    ev.result = ret;
    /* glibc's mremap is variadic: its frame hides the return address from the site read at entry (and the
     * frame-pointer walk); who called it is found in the raw stack, as for malloc's growth. */
    if (called_from_libc(tgid, ev.ip))
        emit_window(&ev);
    else
        emit(&ev);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_brk)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(args, &u);
    if (!p || u.di == 0)  /* brk(0) is a query: nothing moves */
        return 0;
    p->addr = u.di;
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_BRK;
    ev.tgid = p->tgid;
    ev.tid = p->tid;
    ev.addr = (u64)args->ret;  /* the break after the call, moved or not */
    ev.len = p->addr;          /* what was asked */
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = p->stack_id;
    ev.result = args->ret;
    emit_window(&ev);  /* the heap grew (or shrank): who called malloc is in the raw stack */
    return 0;
}

/* mprotect: how glibc grows an arena heap (a 64 MiB PROT_NONE reservation, made read/write piece by
 * piece; no mmap or brk after the first). Rare outside heaps (the loader's RELRO), so every successful
 * call is sent; those making memory accessible carry a stack window. */
TRACEPOINT_PROBE(syscalls, sys_exit_mprotect)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(args, &u);
    if (!p)
        return 0;
    p->addr = u.di;
    p->len = u.si;
    p->prot = u.dx;
    long ret = args->ret;
    if (is_err(ret)) {
        count(LT_CNT_FAILED);
        return 0;
    }
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_MPROTECT;
    ev.tgid = p->tgid;
    ev.tid = p->tid;
    ev.addr = p->addr;
    ev.len = page_up(p->len);
    ev.prot = p->prot;
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = p->stack_id;
    ev.result = ret;
    if (!(ev.prot & 3)) {  /* neither PROT_READ nor PROT_WRITE: nothing is committed */
        emit(&ev);
        return 0;
    }
    /* An arena grows page by page (thousands of calls a second under a fast leak): a commit that continues
     * the thread's previous one, within LT_WINDOW_EVERY_NS of its last window, goes without a window; user
     * space gives it to the growth it continues. */
    u32 host_tid = (u32)bpf_get_current_pid_tgid();
    struct lt_commit *last = last_commit.lookup(&host_tid);
    if (last && last->end == ev.addr && ev.seq - last->window_seq < LT_WINDOW_EVERY_NS) {
        last->end = ev.addr + ev.len;
        emit(&ev);
        return 0;
    }
    struct lt_commit now = {.window_seq = ev.seq, .end = ev.addr + ev.len};
    last_commit.update(&host_tid, &now);
    emit_window(&ev);
    return 0;
}

/* Locked memory (mlock, mlock2, munlock, mlockall, munlockall): nothing to account in the ledger (a lock maps
 * nothing), but the call path of the pages a process keeps locked, as an mmap's: VmLck growth names its library
 * even where the locked pages were mapped long before (a pool locked slice by slice). memfd_create's events are
 * sent by it too: nothing to account, the call path alone. Rare calls: every one is sent. */
static __always_inline int lock_event(void *ctx, long ret, u32 type, int has_flags)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(ctx, &u);
    if (!p)
        return 0;
    if (is_err(ret)) {
        count(LT_CNT_FAILED);
        return 0;
    }
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = type;
    ev.tgid = p->tgid;
    ev.tid = p->tid;
    if (type == LT_EV_MLOCK || type == LT_EV_MUNLOCK) {
        u64 start = u.di & ~(u64)LT_PAGE_MASK;  /* the kernel locks every page the range touches */
        ev.addr = start;
        ev.len = page_up(u.di + u.si - start);
        ev.flags = has_flags ? u.dx : 0;  /* mlock2's MLOCK_ONFAULT */
    } else if (type == LT_EV_MEMFD) {
        ev.fd = ret;      /* the descriptor it returned */
        ev.flags = u.si;  /* MFD_* */
    } else if (has_flags) {
        ev.flags = u.di;  /* mlockall's MCL_* */
    }
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = p->stack_id;
    ev.result = ret;
    emit(&ev);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mlock)
{
    return lock_event(args, args->ret, LT_EV_MLOCK, 0);
}

TRACEPOINT_PROBE(syscalls, sys_exit_mlock2)
{
    return lock_event(args, args->ret, LT_EV_MLOCK, 1);
}

TRACEPOINT_PROBE(syscalls, sys_exit_munlock)
{
    return lock_event(args, args->ret, LT_EV_MUNLOCK, 0);
}

TRACEPOINT_PROBE(syscalls, sys_exit_mlockall)
{
    return lock_event(args, args->ret, LT_EV_MLOCKALL, 1);
}

TRACEPOINT_PROBE(syscalls, sys_exit_munlockall)
{
    return lock_event(args, args->ret, LT_EV_MUNLOCKALL, 0);
}

/* A memfd created: memory a process keeps by descriptor (written with write(), never mapped) is in no address
 * space and no RSS; the call path of the memfd_create calls names who keeps it (analysis/heldfiles.py). */
TRACEPOINT_PROBE(syscalls, sys_exit_memfd_create)
{
    return lock_event(args, args->ret, LT_EV_MEMFD, 1);
}

#ifdef LT_SYSV_TRACEPOINTS
/* shmid -> bytes of the segments the traced processes created (shmget of a new segment: IPC_PRIVATE, or IPC_CREAT |
 * IPC_EXCL), so a SHMAT event carries the size of what it mapped: read from /proc later, the segment may be gone
 * (destroyed once detached), and with it the extent of what an SHM_REMAP attach replaced. */
BPF_TABLE("lru_hash", u32, u64, shm_sizes, 4096);

#define LT_IPC_CREAT 01000
#define LT_IPC_EXCL 02000
TRACEPOINT_PROBE(syscalls, sys_exit_shmget)
{
    struct lt_ids ids;
    long ret = args->ret;
    if (ret < 0 || !current_ids(&ids))
        return 0;
    struct lt_uregs u;
    struct task_struct *task = bpf_get_current_task_btf();
    if (bpf_probe_read_kernel(&u, sizeof(u), (char *)bpf_task_pt_regs(task) + LT_REGS_R10_OFF) != 0)
        return 0;
    u64 flg = u.dx;  /* shmget(key_t key, size_t size, int shmflg) */
    if ((int)u.di != 0 && (flg & (LT_IPC_CREAT | LT_IPC_EXCL)) != (LT_IPC_CREAT | LT_IPC_EXCL))
        return 0;  /* maybe an existing segment: its size is not the one asked */
    u32 id = (u32)ret;
    u64 size = page_up(u.si);
    shm_sizes.update(&id, &size);
    return 0;
}

/* SysV shared memory: shmat maps a segment without an mmap syscall, and shmdt unmaps it by address alone.
 * Both are rare (set-up time, not per request), so both go to user space. The kernel half does not size the
 * segment (no helper reaches the new VMA or the segment from a tracepoint under BCC): the SHMAT event carries
 * the shmid and user space takes the size of the mapping at the returned address whose inode is that shmid
 * (/proc/PID/maps: exact, and checked against the id). The call site is captured as for mmap. */
TRACEPOINT_PROBE(syscalls, sys_exit_shmat)
{
    struct lt_uregs u;
    struct lt_call *p = call_at_exit(args, &u);
    if (!p)
        return 0;
    u64 flg = (u64)(s64)(int)u.dx;  /* shmat(int shmid, const void *shmaddr, int shmflg) */
    p->addr = u.si;
    p->flags = flg;
    p->prot = 1 | ((flg & LT_SHM_RDONLY) ? 0 : 2) | ((flg & LT_SHM_EXEC) ? LT_PROT_EXEC : 0);
    p->fd = (u64)(u32)u.di;
    long ret = args->ret;
    if (is_err(ret)) {
        count(LT_CNT_FAILED);
        return 0;
    }
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    mark_dirty(ev.seq);  /* SHM_REMAP maps over what was there */
    ev.type = LT_EV_SHMAT;
    ev.tgid = p->tgid;
    ev.tid = p->tid;
    ev.addr = (u64)ret;
    ev.flags = p->flags;
    ev.prot = p->prot;
    ev.fd = p->fd;  /* the shmid */
    u32 shmid = (u32)p->fd;
    u64 *size = shm_sizes.lookup(&shmid);
    if (size)
        ev.len = *size;
    ev.site = p->site;
    ev.ip = p->ip;
    ev.stack_id = p->stack_id;
    ev.result = ret;
    emit(&ev);
    return 0;
}

/* Decided at entry, like munmap: sent before the range is freed, so it is ordered before any mapping that
 * reuses it. A shmdt that fails (no segment attached there) finds nothing to remove in user space either. */
TRACEPOINT_PROBE(syscalls, sys_enter_shmdt)
{
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    count(LT_CNT_SYSCALLS);
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    mark_dirty(ev.seq);
    ev.type = LT_EV_SHMDT;
    ev.tgid = ids.tgid;
    ev.tid = ids.tid;
    ev.addr = (u64)args->shmaddr;
    read_site(&ev.site, &ev.ip);
    ev.stack_id = -1;
    emit(&ev);
    return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    /* The tracepoint runs in the parent; parent_pid is its thread id, so use the current tgid. */
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    u32 child = args->child_pid;  /* a host pid */
    /* Threads are added too (their tid is never another live process's tgid) and removed at exit. */
#ifndef LT_PIDNS_INO
    struct lt_target fresh = {};
    targets.update(&child, &fresh);
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_FORK;
    ev.tgid = ids.tgid;
    ev.tid = ids.tid;
    ev.aux_pid = child;
    ev.stack_id = -1;
    emit(&ev);
#else
    /* The child's namespace pid is not known here: its first traced event sends the FORK. */
    struct lt_target fresh = {.parent = ids.tgid};
    targets.update(&child, &fresh);
#endif
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_EXEC;
    ev.tgid = ids.tgid;
    ev.tid = ids.tid;  /* == args->pid: the exec'ing thread became the leader */
#ifndef LT_PIDNS_INO
    ev.aux_pid = args->old_pid;
#endif
    ev.stack_id = -1;
    emit(&ev);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    u32 tgid = ids.host_tgid, tid = ids.host_tid;
    /* The OOM killer marks one thread of its victim (any with an mm): carry the mark to the process. */
    u64 *marked = oom_victims.lookup(&tid);
    if (marked && tid != tgid) {
        u64 when = *marked;
        oom_victims.update(&tgid, &when);
        oom_victims.delete(&tid);
    }
    if (tid != tgid)
        targets.delete(&tid);
    if (!args->group_dead)
        return 0;
    targets.delete(&tgid);
#ifdef LT_PIDNS_INO
    ns_targets.delete(&ids.tgid);
#endif
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_EXIT;
    ev.tgid = ids.tgid;
    ev.tid = ids.tid;
    ev.stack_id = -1;
#ifdef LT_TASK_EXIT_CODE_OFF
    int code = 0;
    char *task = (char *)bpf_get_current_task();
    if (bpf_probe_read_kernel(&code, sizeof(code), task + LT_TASK_EXIT_CODE_OFF) == 0)
        ev.result = code;
    else
        ev.flags |= LT_EXIT_NO_CODE;
#else
    ev.flags |= LT_EXIT_NO_CODE;
#endif
    if (oom_victims.lookup(&tgid)) {
        ev.flags |= LT_EXIT_OOM;
        oom_victims.delete(&tgid);
    }
    emit(&ev);
    return 0;
}

#ifdef LT_OOM_TRACEPOINT
/* Any process the OOM killer chose (the victim may not be a target: the map is small and LRU). */
TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 pid = args->pid;
    u64 now = bpf_ktime_get_ns();
    oom_victims.update(&pid, &now);
    return 0;
}
#endif

#ifndef LT_NO_FAULTS
static __always_inline u64 *fault_stat(u32 idx)
{
    return fault_stats.lookup(&idx);
}

/* A write fault of a traced process (error_code bit 1) at a user address: who touches fresh memory, and where.
 * Read faults map the zero page or file pages already cached, which is not memory the process grows by. `uregs`:
 * the user registers of the faulting context (0: the task's, saved at its syscall entry). */
static __always_inline int count_fault(u64 address, u64 error_code, char *uregs)
{
#ifdef LT_PIDNS_INO
    /* Faults are machine-wide and frequent: a host tgid not in `targets` is not looked up in the namespace (a
     * traced process joins `targets` at its first traced syscall; its faults before that go uncounted). */
    u32 host_tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&host_tgid))
        return 0;
#endif
    struct lt_ids ids;
    if (!current_ids(&ids))
        return 0;
    u64 *writes = fault_stat(LT_FSTAT_WRITES);
    if (writes)
        *writes += 1;
#if LT_FAULT_SAMPLE > 1
    /* at random, not every Nth: touchers whose faults alternate would otherwise be seen one and not the other */
    if (bpf_get_prandom_u32() % LT_FAULT_SAMPLE)
        return 0;
    u64 *sampled = fault_stat(LT_FSTAT_SAMPLED);
    if (sampled)
        *sampled += 1;
#endif
    /* ip and sp of the faulting user context in one read (x86_64: ip, cs, flags, sp) */
    u64 span[(LT_REGS_SP_OFF - LT_REGS_IP_OFF) / 8 + 1] = {};
    if (!uregs)
        uregs = (char *)bpf_task_pt_regs(bpf_get_current_task_btf());
    bpf_probe_read_kernel(span, sizeof(span), uregs + LT_REGS_IP_OFF);
    struct lt_fault_key key = {.tgid = ids.tgid, .pad = 0, .ip = span[0], .site = 0,
                               .bucket = address >> LT_FAULT_BUCKET_SHIFT};
    if (called_from_libc(ids.tgid, key.ip)) {
        u64 sp = span[(LT_REGS_SP_OFF - LT_REGS_IP_OFF) / 8];
        if (sp)
            key.site = read_user_word(sp);
    }
    u64 *c = fault_counts.lookup(&key);
    if (c) {
        __sync_fetch_and_add(c, 1);
        return 0;
    }
    u64 one = 1;
    if (fault_counts.insert(&key, &one) != 0) {
        c = fault_counts.lookup(&key);  /* another CPU inserted it meanwhile */
        if (c)
            __sync_fetch_and_add(c, 1);
        else {
            u64 *dropped = fault_stat(LT_FSTAT_DROPPED);
            if (dropped)
                *dropped += 1;
        }
        return 0;
    }
    struct lt_fault_key wkey = key;
    wkey.bucket = 0;
    if (fault_windows.lookup(&wkey))
        return 0;
    u8 seen = 1;
    fault_windows.update(&wkey, &seen);
    u64 *windows = fault_stat(LT_FSTAT_WINDOWS);
    if (windows)
        *windows += 1;
    struct lt_event ev = {};
    ev.seq = bpf_ktime_get_ns();
    ev.type = LT_EV_FAULTWIN;
    ev.tgid = ids.tgid;
    ev.tid = ids.tid;
    ev.addr = address;
    ev.len = error_code;
    ev.ip = key.ip;
    ev.site = key.site;
    ev.stack_id = -1;
    emit_window(&ev);
    return 0;
}

/* Raw tracepoints (arguments: address, pt_regs, error_code): every write fault on the machine runs these up to the
 * tgid check, and the classic tracepoints would first copy their record for every one of them. */
RAW_TRACEPOINT_PROBE(page_fault_user)
{
    u64 error_code = ctx->args[2];
    if (!(error_code & 2))
        return 0;
    return count_fault(ctx->args[0], error_code, (char *)ctx->args[1]);  /* the user's registers at the fault */
}

/* The kernel writing a user page on the process's behalf (read(), recv(): copy_to_user): a server can grow by
 * receiving into memory it never touched, with no fault of its own. The user context is the syscall's, so the
 * toucher is the code that called read() or recv() (found in the window like memset's caller). */
RAW_TRACEPOINT_PROBE(page_fault_kernel)
{
    u64 address = ctx->args[0];
    u64 error_code = ctx->args[2];
    if (!(error_code & 2) || (address >> 63))
        return 0;
    return count_fault(address, error_code, 0);
}
#endif
