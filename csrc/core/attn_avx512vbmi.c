/* The AVX-512 attention tile's fp8 instances with AVX512-VBMI: codes decoded by byte lookups
 * (attn_avx512_tile.h); cpu.c puts them in the AVX-512 table where the CPU has VBMI. */
#include "attn_internal.h"

#if VT_X86
#define T VT_TARGET_AVX512VBMI
#define VT_TILE_VBMI 1
#define VT_TILE_TABLE vt_attn_tiles_avx512vbmi
#include "attn_avx512_tile.h"
#endif
