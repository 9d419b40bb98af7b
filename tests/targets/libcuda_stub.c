/* A stand-in libcuda.so.1 for NIXL 0.9.0's UCX plugin on a machine with no GPU (vintage P/D target).
 *
 * libplugin_UCX.so of nixl-cu12 0.9.0 has libcuda.so.1 as a NEEDED library and resolves the cu* entry
 * points below (nm -D --undefined-only libplugin_UCX.so | grep ' cu'). Each returns 100,
 * CUDA_ERROR_NO_DEVICE, so the plugin treats every buffer as host memory. Built by
 * tests/targets/setup_vllm_vintage.sh as .cache/libcuda-stub/libcuda.so.1 (put on LD_LIBRARY_PATH of the
 * vintage servers only). */
#define NO_DEVICE 100

int cuCtxGetCurrent(void *ctx) { (void)ctx; return NO_DEVICE; }
int cuCtxPopCurrent_v2(void *ctx) { (void)ctx; return NO_DEVICE; }
int cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return NO_DEVICE; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return NO_DEVICE; }
int cuDeviceGet(void *dev, int ordinal) { (void)dev; (void)ordinal; return NO_DEVICE; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return NO_DEVICE; }
int cuDevicePrimaryCtxRetain(void *ctx, int dev) { (void)ctx; (void)dev; return NO_DEVICE; }
int cuPointerGetAttributes(unsigned n, void *attrs, void **data, unsigned long long ptr)
{
    (void)n; (void)attrs; (void)data; (void)ptr;
    return NO_DEVICE;
}
/* Asked for by some loaders before anything else. */
int cuInit(unsigned flags) { (void)flags; return NO_DEVICE; }
int cuDriverGetVersion(int *v) { if (v) *v = 0; return NO_DEVICE; }
