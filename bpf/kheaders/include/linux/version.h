/* Stub: BCC only needs the macro; tracepoint programs do not check the version. */
#define LINUX_VERSION_CODE 0
#define KERNEL_VERSION(a, b, c) (((a) << 16) + ((b) << 8) + ((c) > 255 ? 255 : (c)))
