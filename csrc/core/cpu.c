/* CPU feature detection (CPUID + XGETBV), the ISA choice and the kernel
 * tables: one const table per ISA (codec row kernels and attention tile
 * together), published by one atomic pointer store. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"

#if VT_X86
#include <cpuid.h>
#endif

static vt_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

/* What each ISA brings: its codec, its own tile instances per format (arrays indexed by dtype, NULL
 * entries allowed, the first array naming a format wins) and one attention tile per read family. The
 * kernel tables below are (ISA x format), filled at init: a format takes the ISA's instance for it, else
 * the ISA's tile for its read family, else the scalar tile of that family; so a new format names no tile
 * here and runs wherever its family runs. */
typedef struct isa_kernels {
    vt_isa isa;
    const vt_codec_kernels *codec;
    const vt_attn_tile_fn *format_tiles[2];
    vt_attn_tile_fn tile[VT_READ_FAMILY_COUNT];
} isa_kernels;

static const isa_kernels ISA_KERNELS[] = {
    {VT_ISA_SCALAR, &vt_codec_scalar, {NULL},
     {[VT_READ_ELEMENTS] = vt_attn_tile_scalar, [VT_READ_INT4_ROTATED] = vt_attn_tile_scalar,
      [VT_READ_SLOTS] = vt_attn_tile_slots}},
#if VT_X86
    {VT_ISA_AVX2, &vt_codec_avx2, {vt_attn_tiles_avx2}, {0}},
    /* AVX-512 reads the per-token-head formats with the AVX2 instances (faster there on every CPU measured) */
    {VT_ISA_AVX512, &vt_codec_avx512, {vt_attn_tiles_avx2_for_avx512, vt_attn_tiles_avx512}, {0}},
#endif
};
#define N_ISA ((int)(sizeof ISA_KERNELS / sizeof ISA_KERNELS[0]))

#if VT_X86
/* Tile instances keyed by a CPU feature beyond their ISA's: where the CPU has it, the ISA's table takes the
 * instance of every format `tiles` names (its own instance or family tile otherwise). Rows apply in order, so
 * a later row's instance stands over an earlier one's; an instance that hands some items on calls the table
 * without its feature. */
typedef struct feature_tile {
    vt_isa isa;
    int (*has)(const vt_cpu_features *cpu);
    const vt_attn_tile_fn *tiles;
} feature_tile;

static int has_avx512vbmi(const vt_cpu_features *cpu) { return cpu->avx512vbmi; }
static int has_avx512bf16(const vt_cpu_features *cpu) { return cpu->avx512bf16; }

static const feature_tile FEATURE_TILES[] = {
    /* AVX512-VBMI: fp8 codes decoded by 64-code byte lookups */
    {VT_ISA_AVX512, has_avx512vbmi, vt_attn_tiles_avx512vbmi},
    /* AVX512-BF16: grouped bf16 rows on the pair dot product (vdpbf16ps); every other item goes to the table
     * without AVX512-BF16 (vt_kernels_table(VT_ISA_AVX512, 0)), so this row stands last */
    {VT_ISA_AVX512, has_avx512bf16, vt_attn_tiles_avx512bf16},
};

static void apply_feature_tiles(vt_kernels *k, const vt_cpu_features *cpu) {
    for (size_t i = 0; i < sizeof FEATURE_TILES / sizeof FEATURE_TILES[0]; i++) {
        const feature_tile *ft = &FEATURE_TILES[i];
        if (k->isa != ft->isa || !ft->has(cpu)) continue;
        for (int d = 0; d < VT_DTYPE_COUNT; d++)
            if (ft->tiles[d]) k->attn_tile[d] = ft->tiles[d];
    }
}
#endif

/* [isa][b]: the table on this CPU with its AVX512-BF16 bit set to b */
static vt_kernels tables[N_ISA][2];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill(vt_kernels *k, const isa_kernels *src) {
    k->isa = src->isa;
    k->codec = src->codec;
    for (int d = 0; d < VT_DTYPE_COUNT; d++) {
        vt_read_family f = vt_dtype_get(d)->read_family;
        vt_attn_tile_fn t = NULL;
        for (int i = 0; i < 2 && f != VT_READ_NONE && !t; i++) t = src->format_tiles[i] ? src->format_tiles[i][d] : NULL;
        if (!t && f != VT_READ_NONE) t = src->tile[f] ? src->tile[f] : ISA_KERNELS[0].tile[f];
        k->attn_tile[d] = t;
    }
}

static void fill_tables(void) {
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < N_ISA; i++) {
            fill(&tables[i][b], &ISA_KERNELS[i]);
#if VT_X86
            vt_cpu_features cpu = *vt_cpu_get();
            cpu.avx512bf16 = b;
            apply_feature_tiles(&tables[i][b], &cpu);
#endif
        }
}

/* NULL until vt_runtime_init (or the first kernel call) chose a table. */
static _Atomic(const vt_kernels *) active;

const vt_kernels *vt_kernels_table(vt_isa isa, int avx512bf16) {
    if ((int)isa < VT_ISA_SCALAR || (int)isa >= N_ISA) return NULL;
    pthread_once(&tables_once, fill_tables);
    return &tables[isa][avx512bf16 != 0];
}

static void publish(vt_isa isa) {
    /* the caller checked isa <= vt_isa_best(), which is VT_ISA_SCALAR off x86 */
    int bf16 = 0;
#if VT_X86
    bf16 = vt_cpu_get()->avx512bf16;
#endif
    atomic_store_explicit(&active, vt_kernels_table(isa, bf16), memory_order_release);
}

const vt_kernels *vt_kernels_active(void) {
    const vt_kernels *k = atomic_load_explicit(&active, memory_order_acquire);
    if (k) return k;
    (void)vt_runtime_init(NULL, NULL);
    return atomic_load_explicit(&active, memory_order_acquire);
}

#if VT_X86
static uint64_t read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

static void detect(void) {
    memset(&features, 0, sizeof features);
#if VT_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = (c >> 27) & 1;
    features.sse42 = (c >> 20) & 1;
    features.fma = (c >> 12) & 1;
    features.f16c = (c >> 29) & 1;
    int avx_hw = (c >> 28) & 1;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    int ymm_os = (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    int zmm_os = ymm_os && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    features.avx = avx_hw && ymm_os;
    if (!features.avx) features.fma = features.f16c = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        features.avx2 = features.avx && ((b >> 5) & 1);
        if (zmm_os) {
            features.avx512f = (b >> 16) & 1;
            features.avx512dq = (b >> 17) & 1;
            features.avx512bw = (b >> 30) & 1;
            features.avx512vl = (b >> 31) & 1;
            features.avx512vbmi = (c >> 1) & 1;
            features.avx512vnni = (c >> 11) & 1;
            features.avx512fp16 = (d >> 23) & 1;
            unsigned a1, b1, c1, d1;
            __cpuid_count(7, 1, a1, b1, c1, d1);
            features.avx512bf16 = (a1 >> 5) & 1;
            (void)b1, (void)c1, (void)d1;
        }
    }
#endif
}

const vt_cpu_features *vt_cpu_get(void) {
    pthread_once(&features_once, detect);
    return &features;
}

vt_isa vt_isa_best(void) {
    const vt_cpu_features *f = vt_cpu_get();
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx2 && f->fma && f->f16c)
        return VT_ISA_AVX512;
    if (f->avx2 && f->fma && f->f16c) return VT_ISA_AVX2;
    return VT_ISA_SCALAR;
}

const char *vt_isa_name(vt_isa isa) {
    switch (isa) {
    case VT_ISA_SCALAR: return "scalar";
    case VT_ISA_AVX2: return "avx2";
    case VT_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

vt_isa vt_isa_active(void) { return vt_kernels_active()->isa; }

vt_status vt_isa_set(vt_isa isa, vt_error *err) {
    if ((int)isa < VT_ISA_SCALAR || (int)isa > VT_ISA_AVX512)
        return vt_error_set(err, VT_ERR_VALUE, "vt_isa_set: isa must be scalar, avx2 or avx512; got %d", (int)isa);
    vt_isa best = vt_isa_best();
    if (isa > best)
        return vt_error_set(err, VT_ERR_UNSUPPORTED,
                            "vt_isa_set: isa must be supported by this CPU (best: %s); got %s",
                            vt_isa_name(best), vt_isa_name(isa));
    publish(isa);
    return VT_OK;
}

vt_status vt_runtime_init(const char *request, vt_error *err) {
    vt_isa want = vt_isa_best();
    vt_status st = VT_OK;
    if (request && request[0]) {
        if (strcmp(request, "scalar") == 0) want = VT_ISA_SCALAR;
        else if (strcmp(request, "avx2") == 0) want = want < VT_ISA_AVX2 ? want : VT_ISA_AVX2;
        else if (strcmp(request, "avx512") == 0) want = want < VT_ISA_AVX512 ? want : VT_ISA_AVX512;
        else
            st = vt_error_set(err, VT_ERR_VALUE,
                              "vt_runtime_init: VTINFER_ISA must be scalar, avx2 or avx512; got '%.32s'", request);
    }
    publish(want);
    return st;
}

const char *vt_compiler_string(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown C compiler";
#endif
}
