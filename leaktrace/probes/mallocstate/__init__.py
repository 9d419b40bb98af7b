"""The allocator's own books, read from outside: how much of a process's heap is in use and how much is free
memory the allocator keeps.

- :mod:`.glibc` — glibc malloc's arenas, bins and mmapped chunks (mallinfo2()'s figures) from
  ``/proc/PID/mem``, its layout from libc's debug information.
"""
