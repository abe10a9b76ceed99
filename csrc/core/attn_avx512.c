/* The AVX-512 attention tile's instances for the float and per-tensor fp8 formats (attn_avx512_tile.h). */
#include "attn_internal.h"

#if VT_X86
#define T VT_TARGET_AVX512
#define VT_TILE_VBMI 0
#define VT_TILE_TABLE vt_attn_tiles_avx512
#include "attn_avx512_tile.h"
#endif
