/* The AMX attention tile products (attention_amx_tmpl.h) on the tile emulation (amx_tile_emu.h):
 * the amx-emulated implementation, which CI runs in place of the real instructions. */
#include "amx_tile_emu.h"
#include "attention_amx.h"

#define ATX_FN
#define ATX_NAME(x) ompk_atx_emu_##x
#define T_CFG(c) amx_emu_cfg(c)
#define T_RELEASE() amx_emu_release()
#define T_LOAD(i, p, s) amx_emu_load(i, p, s)
#define T_STORE(i, p, s) amx_emu_store(i, p, s)
#define T_ZERO(i) amx_emu_zero(i)
#define T_DPBF16(c, a, b) amx_emu_dpbf16(c, a, b)

#include "attention_amx_tmpl.h"
