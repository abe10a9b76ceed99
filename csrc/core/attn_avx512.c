/* The AVX-512 attention tile for every element dtype (attn_avx512_tile.h). */
#include "attn_internal.h"

#if VT_X86
#define T VT_TARGET_AVX512
#define VT_TILE_VBMI 0
#define VT_TILE_ENTRY vt_attn_tile_avx512
#include "attn_avx512_tile.h"
#endif
