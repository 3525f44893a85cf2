/* Bad inputs for the router entries: every one returns a status and a message and leaves the
 * poisoned outputs untouched. */
#include <criterion/criterion.h>
#include <string.h>

#include "ompk/router.h"
#include "test_util.h"

#define T_ 4
#define N_ 6
#define K_ 5

typedef struct fx {
    tu_buf sx, sy, sc, ix, sx16, dx, dy;
    ompk_tensor tsx, tsy, tsc, tix, tsx16, tdx, tdy;
} fx;

static void fx_new(fx *f, ompk_device dev) {
    tu_rng r = tu_rng_make(1);
    f->sx = tu_buf_new(dev, OMPK_F32, T_ * N_);
    f->sy = tu_buf_new(dev, OMPK_F32, T_ * N_);
    f->sx16 = tu_buf_new(dev, OMPK_BF16, T_ * N_);
    f->sc = tu_buf_new(dev, OMPK_F32, T_ * K_);
    f->ix = tu_buf_new(dev, OMPK_I32, T_ * K_);
    f->dx = tu_buf_new(dev, OMPK_F32, T_ * N_);
    f->dy = tu_buf_new(dev, OMPK_F32, T_ * N_);
    tu_buf_randn(&f->sx, &r, 1.0);
    tu_buf_randn(&f->sy, &r, 1.0);
    tu_buf_randn(&f->sx16, &r, 1.0);
    for (int64_t e = 0; e < T_ * K_; e++) tu_buf_set(&f->ix, e, (double)(e % (N_ * N_)));
    tu_buf_upload(&f->ix);
    tu_buf_fill_bytes(&f->sc, 0xA5);
    tu_buf_fill_bytes(&f->dx, 0xA5);
    tu_buf_fill_bytes(&f->dy, 0xA5);
    const int64_t sn[2] = {T_, N_}, sk[2] = {T_, K_};
    f->tsx = tu_view(&f->sx, 2, sn);
    f->tsy = tu_view(&f->sy, 2, sn);
    f->tsx16 = tu_view(&f->sx16, 2, sn);
    f->tsc = tu_view(&f->sc, 2, sk);
    f->tix = tu_view(&f->ix, 2, sk);
    f->tdx = tu_view(&f->dx, 2, sn);
    f->tdy = tu_view(&f->dy, 2, sn);
}

static void fx_free(fx *f) {
    tu_buf_free(&f->sx);
    tu_buf_free(&f->sy);
    tu_buf_free(&f->sx16);
    tu_buf_free(&f->sc);
    tu_buf_free(&f->ix);
    tu_buf_free(&f->dx);
    tu_buf_free(&f->dy);
}

/* the forward's outputs (scores poisoned; indices hold the known pattern) are unchanged */
static void expect_fwd_untouched(fx *f, ompk_status st, const char *what) {
    cr_expect_neq(st, OMPK_OK, "%s: accepted", what);
    cr_expect(strlen(ompk_last_error()) > 0, "%s: no message", what);
    cr_expect(tu_buf_all_bytes(&f->sc, 0xA5), "%s: scores written", what);
    tu_buf_download(&f->ix);
    for (int64_t e = 0; e < T_ * K_; e++)
        cr_expect_eq(((int32_t *)f->ix.host)[e], e % (N_ * N_), "%s: indices written", what);
}

static void expect_bwd_untouched(fx *f, ompk_status st, const char *what) {
    cr_expect_neq(st, OMPK_OK, "%s: accepted", what);
    cr_expect(strlen(ompk_last_error()) > 0, "%s: no message", what);
    cr_expect(tu_buf_all_bytes(&f->dx, 0xA5), "%s: dsx written", what);
    cr_expect(tu_buf_all_bytes(&f->dy, 0xA5), "%s: dsy written", what);
}

Test(router_bad, forward) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        fx f;
        fx_new(&f, devs[di]);
        ompk_tensor t;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, 0, &f.tsc, &f.tix), "k = 0");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, -3, &f.tsc, &f.tix), "k < 0");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, N_ * N_ + 1, &f.tsc, &f.tix),
                             "k > N^2");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_ + 1, &f.tsc, &f.tix),
                             "k disagrees with the outputs' shape");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(NULL, &f.tsy, K_, &f.tsc, &f.tix), "null sx");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &f.tsc, NULL),
                             "null indices");
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx16, &f.tsy, K_, &f.tsc, &f.tix),
                             "sx bf16, sy f32");
        t = f.tsy;
        t.shape[1] = N_ - 1;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &t, K_, &f.tsc, &f.tix),
                             "sy [T,N-1]");
        t = f.tsy;
        t.shape[0] = T_ - 1;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &t, K_, &f.tsc, &f.tix),
                             "sy [T-1,N]");
        t = f.tsx;
        t.ndim = 3;
        t.shape[2] = 1;
        t.strides[2] = 1;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&t, &f.tsy, K_, &f.tsc, &f.tix), "sx rank 3");
        t = f.tsx;
        t.dtype = OMPK_I32;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&t, &f.tsy, K_, &f.tsc, &f.tix), "sx i32");
        t = f.tsc;
        t.dtype = OMPK_BF16;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &t, &f.tix),
                             "scores bf16");
        t = f.tix;
        t.dtype = OMPK_F32;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &f.tsc, &t),
                             "indices f32");
        t = f.tsc;
        t.shape[0] = T_ - 1;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &t, &f.tix),
                             "scores [T-1,k]");
        /* aliasing: an output over an input, the two outputs over each other */
        t = f.tsc;
        t.data = f.sx.dev;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &t, &f.tix),
                             "scores over sx");
        t = f.tix;
        t.data = f.sc.dev;
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &f.tsy, K_, &f.tsc, &t),
                             "indices over scores");
        /* device mismatch: sy claims another device (a real one when there is a GPU) */
        t = f.tsy;
        t.device = devs[di].type == OMPK_HOST ? ompk_device_target(0) : ompk_device_host();
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&f.tsx, &t, K_, &f.tsc, &f.tix),
                             "sy on another device");
        t = f.tsx;
        t.device = ompk_device_target(99);
        expect_fwd_untouched(&f, ompk_router_topk_fwd(&t, &f.tsy, K_, &f.tsc, &f.tix),
                             "sx on a device that does not exist");
        fx_free(&f);
    }
}

Test(router_bad, backward) {
    ompk_device devs[4];
    const int nd = tu_devices(devs, 4);
    for (int di = 0; di < nd; di++) {
        fx f;
        fx_new(&f, devs[di]);
        ompk_tensor t;
        tu_rng r = tu_rng_make(3);
        tu_buf ds = tu_buf_new(devs[di], OMPK_F32, T_ * K_);
        tu_buf_randn(&ds, &r, 1.0);
        const int64_t sk[2] = {T_, K_};
        ompk_tensor tds = tu_view(&ds, 2, sk);
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, 0, &f.tdx, &f.tdy), "N = 0");
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, 2, &f.tdx, &f.tdy),
                             "k > N^2 (and N disagrees with dsx)");
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_ + 1, &f.tdx, &f.tdy),
                             "N disagrees with dsx");
        expect_bwd_untouched(&f, ompk_router_topk_bwd(NULL, &f.tix, N_, &f.tdx, &f.tdy),
                             "null dscores");
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &f.tdx, NULL), "null dsy");
        t = f.tix;
        t.dtype = OMPK_I64;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &t, N_, &f.tdx, &f.tdy), "indices i64");
        t = f.tix;
        t.shape[1] = K_ - 1;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &t, N_, &f.tdx, &f.tdy),
                             "indices [T,k-1]");
        t = f.tdy;
        t.dtype = OMPK_BF16;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &f.tdx, &t),
                             "dsx f32, dsy bf16");
        t = f.tdy;
        t.shape[0] = T_ - 1;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &f.tdx, &t), "dsy [T-1,N]");
        t = f.tdy;
        t.data = f.dx.dev;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &f.tdx, &t), "dsy == dsx");
        t = f.tdx;
        t.strides[1] = 0;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &t, &f.tdy),
                             "dsx overlapping itself (stride 0)");
        t = tds;
        t.data = f.dx.dev;
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&t, &f.tix, N_, &f.tdx, &f.tdy),
                             "dscores inside dsx");
        t = f.tdx;
        t.device = devs[di].type == OMPK_HOST ? ompk_device_target(0) : ompk_device_host();
        expect_bwd_untouched(&f, ompk_router_topk_bwd(&tds, &f.tix, N_, &t, &f.tdy),
                             "dsx on another device");
        tu_buf_free(&ds);
        fx_free(&f);
    }
}
