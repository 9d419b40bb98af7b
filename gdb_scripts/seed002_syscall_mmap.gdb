# seed002_syscall_mmap.gdb — the manual gdb recipe of the vLLM/UCX leak hunt ("Heaps do lie", seed 002).
#
# Stops at glibc's syscall() wrapper only when it is asked for SYS_mmap (rdi == 9 on x86-64), then puts a
# temporary breakpoint at the caller's return address to print the mapped address ($rax) and the
# backtrace. This finds raw `syscall(SYS_mmap, ...)` callers such as UCX's libucm hooks, which
# LD_PRELOAD and uprobes on libc's mmap() never see.
#
# Usage (manual; leaktrace itself uses sampler.py, which patches no code):
#     gdb -nx -batch -p PID -x gdb_scripts/seed002_syscall_mmap.gdb
# It stops after 20 mmap calls (change `set $seed002_max` below), then detaches.
#
# Caution: unlike `catch syscall`, breakpoints write int3 instructions into the target's code. gdb
# removes them on detach; if gdb itself is killed (SIGKILL) while attached, the target can die with
# SIGTRAP at the next hit. Each hit stops the whole process (all-stop mode), ~4 ms per stop.

set pagination off
set confirm off
set width 0
set debuginfod enabled off
set print thread-events off
handle all nostop noprint pass
handle SIGINT nostop noprint pass

set $seed002_max = 20
set $seed002_hits = 0

# glibc's wrapper: long syscall(long number, ...). The number arrives in rdi.
break syscall if $rdi == 9
commands
  silent
  set $seed002_hits = $seed002_hits + 1
  printf "=== seed002 hit %d: syscall(SYS_mmap, addr=%#lx, len=%lu) thread %d\n", $seed002_hits, $rsi, $rdx, $_thread
  # At the breakpoint (function entry) the return address is the word at the stack pointer; the
  # temporary breakpoint is for this thread only (others may pass the same address first).
  eval "tbreak *%lu thread %d", *(unsigned long *)$rsp, $_thread
  commands
    silent
    printf "=== seed002 mmap returned %#lx\n", $rax
    bt
    if $seed002_hits >= $seed002_max
      printf "=== seed002 done: %d hits\n", $seed002_hits
      detach
      quit
    end
    continue
  end
  continue
end

continue
