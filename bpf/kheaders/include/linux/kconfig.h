/* Stub: the only configuration BCC's helpers.h tests. */
#ifndef __LINUX_KCONFIG_H
#define __LINUX_KCONFIG_H
#define CONFIG_BPF_SYSCALL 1
#define IS_ENABLED(option) 0
#endif
