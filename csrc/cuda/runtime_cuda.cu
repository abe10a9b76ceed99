/* The CUDA arm's runtime glue: device count, memory helpers and the CUDA
 * error -> vt_error mapping (see vt_cuda.h). */
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

int vt_cuda_fail(cudaError_t e, const char *fn, vt_error *err) {
    (void)cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    vt_error_set(err, VT_ERR_INTERNAL, "%s: CUDA error %s: %s", fn ? fn : "vtinfer._cuda", cudaGetErrorName(e),
                 cudaGetErrorString(e));
    return VT_CUDA_ERR_RUNTIME;
}

extern "C" int vt_cuda_device_count(int *count, char *msg, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (msg && cap) msg[0] = '\0';
    if (e == cudaSuccess) {
        *count = n;
        if (msg && cap) snprintf(msg, cap, "%d CUDA device%s", n, n == 1 ? "" : "s");
        return VT_OK;
    }
    *count = 0;
    (void)cudaGetLastError();
    if (msg && cap) snprintf(msg, cap, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    /* "no device" and "no driver" are answers, not failures. */
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return VT_OK;
    return VT_CUDA_ERR_RUNTIME;
}

extern "C" int vt_cuda_runtime_version(void) {
    int v = 0;
    return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

extern "C" int vt_cuda_driver_version(void) {
    int v = 0;
    return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

extern "C" int vt_cuda_set_device(int device, const char *fn, vt_error *err) {
    VT_CUDA_TRY(cudaSetDevice(device), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_malloc(void **ptr, size_t bytes, const char *fn, vt_error *err) {
    *ptr = NULL;
    if (bytes == 0) return VT_OK;
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *ptr = NULL;
        return vt_error_set(err, VT_ERR_NOMEM, "%s: workspace must fit in device memory; got a request of %zu bytes",
                            fn, bytes);
    }
    if (e != cudaSuccess) return vt_cuda_fail(e, fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_free(void *ptr, const char *fn, vt_error *err) {
    if (!ptr) return VT_OK;
    VT_CUDA_TRY(cudaFree(ptr), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_to_host(void *dst, const void *src, size_t bytes, const char *fn, vt_error *err) {
    if (bytes == 0) return VT_OK;
    VT_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_to_device(void *dst, const void *src, size_t bytes, const char *fn, vt_error *err) {
    if (bytes == 0) return VT_OK;
    VT_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_copy_async(void *dst, const void *src, size_t bytes, void *stream, const char *fn,
                                  vt_error *err) {
    if (bytes == 0) return VT_OK;
    VT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_synchronize(const char *fn, vt_error *err) {
    VT_CUDA_TRY(cudaDeviceSynchronize(), fn, err);
    return VT_OK;
}

extern "C" int vt_cuda_last_error(const char *fn, vt_error *err) {
    VT_CUDA_TRY(cudaGetLastError(), fn, err);
    return VT_OK;
}
