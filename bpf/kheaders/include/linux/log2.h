#ifndef _LINUX_LOG2_H
#define _LINUX_LOG2_H
/* BCC's ring-buffer macros size maps with this. */
#define roundup_pow_of_two(n) \
    ((n) <= 1 ? 1 : (1UL << (64 - __builtin_clzl((unsigned long)(n) - 1))))
#endif
