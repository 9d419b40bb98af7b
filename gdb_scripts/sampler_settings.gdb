# gdb settings for leaktrace's in-gdb stack sampler (sourced by sampler.py before it attaches).
#
# Non-stop mode: a catchpoint stops only the thread that made the syscall; every other thread of the
# target keeps running. In all-stop mode gdb would SIGSTOP every thread at every stop.
set non-stop on
set pagination off
set confirm off
set width 0
set height 0
set print thread-events off
set print inferior-events off
# Never wait on the network for debug info, never prompt.
set debuginfod enabled off
# Signals the target receives go straight through: no stop, no print, delivered unchanged. (SIGINT and
# SIGTRAP are not covered by "all"; SIGINT is listed so a Ctrl-C aimed at the target still reaches it.)
handle all nostop noprint pass
handle SIGINT nostop noprint pass
# Forks made by the target are not followed: the child runs untraced (leaktrace samples it on its own).
set detach-on-fork on
set follow-fork-mode parent
# Shared-library symbols are read by sampler.py (`leaktrace-symbols`: add-symbol-file) before the attach,
# never while attached (see sampler.py's docstring).
set auto-solib-add off
