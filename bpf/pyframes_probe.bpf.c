/* A measurement, not part of the hunt (bench/bench_bpf_pyframes.py): can the kernel half read the Python frames
 * of the thread making an mmap, at the syscall, within the storm budget? At sys_enter_mmap of one process
 * (PY_TGID): its thread state (the interpreter's thread list, matched on the native thread id, at most
 * PY_MAX_THREADS), its current interpreter frame and the chain of previous frames (at most PY_MAX_DEPTH), each
 * frame's code object and instruction pointer sent to user space, which names them from the code objects
 * (leaktrace/pyframes.py). The structure offsets are the defines user space passes (leaktrace.pyframes.OFFSETS).
 */
/* the types BCC provides (u8 … u64) need no header of the kernel's */

#ifndef PY_MAX_DEPTH
#define PY_MAX_DEPTH 32
#endif
#define PY_MAX_THREADS 64

struct py_event {
    u32 tid;
    u32 depth;
    u64 ns;
    u64 code[PY_MAX_DEPTH];
    u64 instr[PY_MAX_DEPTH];
    u8 owner[PY_MAX_DEPTH];
};

BPF_RINGBUF_OUTPUT(py_events, 256);
BPF_PERCPU_ARRAY(py_scratch, struct py_event, 1); /* the walk is made here, then copied out (or dropped when
                                                     the ring is full: the cost is counted either way) */
BPF_ARRAY(py_cost, u64, 2); /* [0]: ns spent in the walk, [1]: events */

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    u64 id = bpf_get_current_pid_tgid();
    if ((id >> 32) != PY_TGID)
        return 0;
    u64 t0 = bpf_ktime_get_ns();
    u32 tid = (u32)id;
    u32 zero = 0;
    struct py_event *e = py_scratch.lookup(&zero);
    if (!e)
        return 0;
    e->tid = tid;
    u64 interp = 0, ts = 0, native = 0;
    bpf_probe_read_user(&interp, sizeof(interp), (void *)(PY_RUNTIME + PY_INTERP_MAIN));
    if (interp)
        bpf_probe_read_user(&ts, sizeof(ts), (void *)(interp + PY_THREADS_HEAD));
    for (int i = 0; i < PY_MAX_THREADS && ts; i++) {
        native = 0;
        bpf_probe_read_user(&native, sizeof(native), (void *)(ts + PY_TS_NATIVE_TID));
        if (native == tid)
            break;
        u64 next = 0;
        bpf_probe_read_user(&next, sizeof(next), (void *)(ts + PY_TS_NEXT));
        ts = next;
    }
    u64 frame = 0;
    if (ts && native == tid) {
#ifdef PY_TS_CURRENT_FRAME
        bpf_probe_read_user(&frame, sizeof(frame), (void *)(ts + PY_TS_CURRENT_FRAME));
#else
        u64 cframe = 0;
        bpf_probe_read_user(&cframe, sizeof(cframe), (void *)(ts + PY_TS_CFRAME));
        if (cframe)
            bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + PY_CFRAME_CURRENT));
#endif
    }
    u32 n = 0;
    for (int i = 0; i < PY_MAX_DEPTH; i++) {
        if (!frame)
            break;
        u64 words[PY_FRAME_WORDS] = {};
        if (bpf_probe_read_user(words, sizeof(words), (void *)frame))
            break;
        e->code[i] = words[PY_IF_CODE / 8];
        e->instr[i] = words[PY_IF_INSTR / 8];
        e->owner[i] = (u8)(words[PY_IF_OWNER / 8] >> ((PY_IF_OWNER % 8) * 8));
        frame = words[PY_IF_PREVIOUS / 8];
        n = i + 1;
    }
    e->depth = n;
    u64 spent = bpf_ktime_get_ns() - t0;
    e->ns = spent;
    py_events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP);
    u32 k = 0;
    u64 *total = py_cost.lookup(&k);
    if (total)
        __sync_fetch_and_add(total, spent);
    k = 1;
    u64 *count = py_cost.lookup(&k);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}
