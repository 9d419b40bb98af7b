/* Layouts shared by the BPF program (bpf/leaktrace.bpf.c) and user space
 * (leaktrace/probes/bpf/layout.py mirrors these structs with ctypes, once, next to its loader).
 * Keep every field 8-byte aligned and explicit so both sides agree without padding guesses. */
#ifndef LEAKTRACE_H
#define LEAKTRACE_H

/* Real kernel headers define it (linux/compiler_types.h); the stub tree does not. */
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* Slow-path event types (lt_event.type). */
#define LT_EV_MMAP 1     /* an mmap the kernel did not keep: MAP_FIXED overlay, or the region map was full */
#define LT_EV_MUNMAP 2   /* a munmap that is not exactly one kernel-tracked region (emitted at entry) */
#define LT_EV_MREMAP 3   /* an mremap of a region not kernel-tracked, or partial / DONTUNMAP / FIXED */
#define LT_EV_BRK 4      /* the program break moved (result of brk(addr != 0)) */
#define LT_EV_FORK 5     /* a task of the target set created a task: aux_pid is the child. In a PID
                          * namespace (LT_PIDNS_INO) it is sent at the child's first traced event, once
                          * its namespace pid is known, and only for processes (tid is then 0) */
#define LT_EV_EXEC 6     /* a traced process replaced its address space */
#define LT_EV_EXIT 7     /* a traced process's last thread exited (group_dead): result is the kernel's wait
                          * status (task->exit_code: status << 8, or the signal | 0x80 with a core dump),
                          * flags holds LT_EXIT_* bits */
#define LT_EV_LIBMAP 8   /* a file mapped executable (a library loaded): user space refreshes its maps copy */
#define LT_EV_MPROTECT 9 /* protection changed (a heap's PROT_NONE reservation committed, or decommitted) */
#define LT_EV_SHMAT 10   /* a SysV shm segment attached: addr = result, fd = shmid, flags = shmflg, len = the
                          * segment's page-rounded size when a traced process created it (shm_sizes), else 0 (user
                          * space reads it from /proc: leaktrace/probes/bpf/sysvshm.py) */
#define LT_EV_SHMDT 11   /* a SysV shm segment detached (emitted at entry, like MUNMAP): addr */
#define LT_EV_HOOKWIN 12 /* a stack window of an mmap made through a memory hook (UCX's libucm), sent while its
                          * path through the hook is not learned (hook_sites, hook_paths), or once per part of UCX
                          * that maps for itself: nothing to account (the mmap itself took its usual path), site
                          * and ip as an MMAP's */
#define LT_EV_FAULTWIN 13 /* a stack window of the first write fault of a (process, ip, site) key of `fault_counts`:
                           * addr = the faulting address, ip = the faulting instruction, site = the word at the user
                           * stack pointer when ip is in libc (memset's caller), else 0; len = the error code.
                           * Nothing to account: user space names the code that touched the page from it */
#define LT_EV_MLOCK 14    /* pages locked in RAM (mlock, mlock2): addr, len (page-rounded), flags (mlock2's) */
#define LT_EV_MUNLOCK 15  /* pages unlocked (munlock): addr, len */
#define LT_EV_MLOCKALL 16 /* mlockall: flags (MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT) */
#define LT_EV_MUNLOCKALL 17 /* munlockall */
#define LT_EV_MEMFD 18    /* a memfd created (memfd_create): fd = the descriptor it returned, flags = its MFD_* */

/* EXIT event flags (lt_event.flags). */
#define LT_EXIT_OOM 1         /* the OOM killer chose this process (oom:mark_victim) */
#define LT_EXIT_NO_CODE 2     /* the exit code could not be read (no task_struct offset from BTF) */

/* Per-CPU counters (index into the `counters` array). */
#define LT_CNT_SYSCALLS 0      /* every traced mmap/munmap/mremap/brk/mprotect/shmat/shmdt/mlock*, memfd_create of the target set */
#define LT_CNT_FAST_MAPS 1     /* mmaps kept in the kernel region map */
#define LT_CNT_SETTLED 2       /* munmaps/mremaps settled in the kernel (exact match) */
#define LT_CNT_SLOW 3          /* events handed to user space */
#define LT_CNT_LOST 4          /* events the ring buffer had no room for */
#define LT_CNT_MAP_FULL 5      /* regions the kernel map had no room for (sent as slow events) */
#define LT_CNT_STACKS 6        /* user stacks captured (once per call site) */
#define LT_CNT_FAILED 7        /* syscalls that failed (nothing to account) */
#define LT_NCOUNTERS 8

/* A traced task: the value of `targets`, keyed by host pid (a process's own entry is its tgid's; its threads have
 * theirs, for the exit of each). */
struct lt_target {
    __u32 parent;    /* in a PID namespace: the parent's namespace tgid while the child's FORK is still to be sent */
    __u32 pad;
    __u64 dirty;     /* seq of the process's last slow event that may have cut kernel-owned regions: only regions
                      * born after it are settled in the kernel (bpf/leaktrace.bpf.c, `targets`) */
};

/* Address-space key of the in-kernel ledger. */
struct lt_region_key {
    __u32 tgid;
    __u32 pad;
    __u64 start;
};

/* One outstanding region the kernel owns (born by a plain mmap, possibly moved by an exact mremap). */
struct lt_region {
    __u64 len;       /* page-rounded */
    __u64 seq;       /* bpf_ktime_get_ns() at the syscall exit: orders it against slow-path events */
    __u64 born;      /* the seq of the mmap that made it, kept when an exact mremap grows or moves it (`seq` is
                      * then the mremap's): user space leaves out regions born after the events it has applied */
    __u64 site;      /* caller's return address, read at the user stack pointer at syscall entry */
    __u64 ip;        /* user instruction pointer at the syscall (where the syscall instruction is) */
    __s64 stack_id;  /* user stack of the first call from this site (-1: none) */
    __u32 tid;
    __u32 prot;
    __u32 flags;
    __u32 fd;        /* (u32)-1 for anonymous */
    __u32 window;    /* 1: its mmap's stack window is kept in `windows` under {tgid, born} (malloc's own chunk) */
    __u32 pad;
};

/* Key of a kept stack window (`windows`): the process and the birth seq of the region it belongs to, which an
 * exact mremap keeps, so a moved region's window stays where it is. */
struct lt_window_key {
    __u32 tgid;
    __u32 pad;
    __u64 born;
};

/* A traced call at its exit: its arguments (read from the user registers saved at its entry), call site and
 * stack, and who made it. */
struct lt_call {
    __u64 addr;
    __u64 len;
    __u64 new_len;
    __u64 new_addr;
    __u64 flags;
    __u64 prot;
    __u64 fd;
    __u64 site;
    __u64 ip;
    __s64 stack_id;
    __u64 dirty;     /* the process's lt_target.dirty at the call */
    __u32 tgid;      /* the caller as user space numbers it (its PID namespace's ids) */
    __u32 tid;
};

/* A slow-path event (ring buffer record). Every pid in it (tgid, tid, aux_pid) and in the map keys
 * below is numbered as leaktrace's /proc numbers it: host pids, or, when leaktrace runs inside a PID
 * namespace, that namespace's pids (see "PID namespaces" in leaktrace.bpf.c). */
struct lt_event {
    __u64 seq;       /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
    __u32 type;
    __u32 tgid;
    __u32 tid;
    __u32 aux_pid;   /* FORK: child pid; MMAP through a memory hook: where its window's scan starts (lt_hook) */
    __u64 addr;      /* MMAP: result address; MUNMAP/MREMAP: old address; BRK: new break */
    __u64 len;       /* MMAP/MUNMAP: length; MREMAP: old length */
    __u64 new_addr;  /* MREMAP: result address */
    __u64 new_len;   /* MREMAP: new length */
    __u64 flags;     /* mmap/mremap flags */
    __u64 prot;
    __u64 fd;
    __u64 site;
    __u64 ip;
    __s64 stack_id;
    __s64 result;    /* syscall return value where it matters */
};

/* Bytes of raw user stack (from the stack pointer at the syscall) sent with the events of a heap's
 * growth (BRK, MPROTECT making memory accessible): user space scans them for return addresses, which
 * names the caller of malloc through code without frame pointers (glibc's malloc, stripped libraries).
 * LT_SCAN_MEDIUM and LT_SCAN_SMALL are the fall-backs when the stack's top lies closer than that. 4 KiB
 * reaches past libc's deeper paths into malloc (stdio's buffers under vfprintf's large frames). */
#define LT_SCAN_BYTES 4096
#define LT_SCAN_MEDIUM 1024
#define LT_SCAN_SMALL 256

/* A slow-path event followed by a window of the user stack (ring buffer record, larger than lt_event). */
struct lt_window_event {
    struct lt_event ev;
    __u64 sp;        /* user stack pointer at the syscall: the address of data[0] */
    __u64 len;       /* bytes of data read (0: the stack could not be read) */
    __u8 data[LT_SCAN_BYTES];
};

/* The C runtime's code (libc's executable mapping) in one process, set by user space: anonymous mmaps
 * called from there (malloc's big chunks and new arena heaps, thread stacks) leave the fast path and carry
 * a stack window, so they are blamed on the library that called malloc, not on libc. */
struct lt_range {
    __u64 start;
    __u64 end;
};

/* A memory-hook library in one process (UCX's libucm: in bistro mode it patches libc's mmap & co., so every
 * mmap of the process reaches the kernel from its raw-syscall trampoline, and the call site alone would blame
 * UCX for all of them). Set by user space when the library is mapped. */
struct lt_hook {
    __u64 start;      /* the hook library's code */
    __u64 end;
    __u64 learn_seq;  /* kernel-owned: when the last LT_EV_HOOKWIN was sent */
};

/* What user space learned of the hook's frames, from LT_EV_HOOKWIN windows walked with the library's unwind
 * tables (leaktrace/probes/bpf/hookframes.py). Offsets are from the user stack pointer at the syscall.
 *   hook_sites {tgid, site} -> caller_off: where the trampoline's caller's return address is. Inside the hook:
 *     the hook dispatching someone else's mmap. Outside: UCX mapping for itself (libucs's registration cache),
 *     which stays blamed on the hook.
 *   hook_paths {tgid, that caller} -> struct lt_hook_path: on that dispatch path, the return address into the
 *     code that called the hooked function (dispatch_off), once the hook's outermost frame is checked (the
 *     return address last_ret at last_off). The region is kept with that as its site; an MMAP event of such a
 *     call (a malloc chunk: the caller is libc) carries dispatch_off in aux_pid, where its window's scan starts.
 * Until a call's path is known it keeps the hook's site, and a window is sent now and then to learn from. */
struct lt_hook_key {
    __u32 tgid;
    __u32 pad;
    __u64 addr;
};

struct lt_hook_path {
    __u64 dispatch_off;
    __u64 last_off;
    __u64 last_ret;
};

/* Page faults (exceptions:page_fault_user): write faults of the traced processes, counted in the kernel per
 * (process, faulting ip, site, address bucket of 1 << LT_FAULT_BUCKET_SHIFT bytes). site is the word at the user
 * stack pointer when the ip is in libc (memset/memcpy are leaf functions: that word is their caller), else 0.
 * User space takes and deletes the counts every tick (the map stays small); a fault whose key the map has no
 * room for is counted in fault_stats[LT_FSTAT_DROPPED]. */
#define LT_FAULT_BUCKET_SHIFT 21
struct lt_fault_key {
    __u32 tgid;
    __u32 pad;
    __u64 ip;
    __u64 site;
    __u64 bucket;    /* faulting address >> LT_FAULT_BUCKET_SHIFT */
};

/* fault_stats (per-CPU array) indices. */
#define LT_FSTAT_WRITES 0   /* write faults of the traced processes */
#define LT_FSTAT_SAMPLED 1  /* of them, counted in fault_counts (1 in LT_FAULT_SAMPLE; not kept when that is 1) */
#define LT_FSTAT_DROPPED 2  /* sampled faults fault_counts had no room for */
#define LT_FSTAT_WINDOWS 3  /* LT_EV_FAULTWIN windows sent */
#define LT_NFSTATS 4

/* Call-site cache key: one user stack per (process, return address). */
struct lt_site_key {
    __u32 tgid;
    __u32 pad;
    __u64 site;
};

#endif
