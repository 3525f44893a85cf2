/* A GPU team for the host emulation suites (tests/test_*_emu.c, test_router_warp.c): the team's
 * threads run as fibers on the calling thread, one after another from sync point to sync point,
 * so a barrier costs one stack switch per thread instead of waking host threads (32 to 1024 of
 * them on a CI machine of 2 cores, at every emulated warp instruction).
 * Include before the kernel source: it defines the hooks OMPK_EMU_TID() and OMPK_EMU_SYNC()
 * that the kernels' emulation branches use (src/target/gpu/bare.h). Every thread must pass the
 * same number of sync points, as on the GPU; emu_team_run reports a team that does not. */
#ifndef OMPK_TEST_EMU_TEAM_H
#define OMPK_TEST_EMU_TEAM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(EMU_ASAN)
#define EMU_ASAN 1
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#define EMU_TEAM_MAX 1024
/* ASan frames of the unrolled kernels are large: a generous stack, committed lazily */
#define EMU_STACK ((size_t)512 << 10)
#define EMU_TOP ((size_t)64 << 10)

typedef struct {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
    char *stack;
    const void *bottom;
    size_t size;
    void *fake;
    unsigned long syncs;
    int done;
} emu_fiber;

static struct {
    emu_fiber f[EMU_TEAM_MAX], main, *prev;
    int n, cur, live;
    void (*fn)(void *);
    void *arg;
    char *pool;
    size_t page;
} emu_st;

static inline __attribute__((unused)) int emu_tid(void) {
    return emu_st.cur;
}

#if defined(__x86_64__)
/* saves the callee-saved registers on the current stack and its pointer in *save, then resumes
 * the stack `to` (a fresh one starts at the address below its six register slots) */
__asm__(".text\n"
        ".p2align 4\n"
        ".type ompk_emu_swap, @function\n"
        "ompk_emu_swap:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size ompk_emu_swap, .-ompk_emu_swap\n");
void ompk_emu_swap(void **save, void *to);
#endif

static __attribute__((unused, noinline)) void emu_switch(emu_fiber *from, int to, int exiting) {
    emu_fiber *t = to < 0 ? &emu_st.main : &emu_st.f[to];
    emu_st.prev = from;
    emu_st.cur = to;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? NULL : &from->fake, t->bottom, t->size);
#else
    (void)exiting;
#endif
#if defined(__x86_64__)
    ompk_emu_swap(&from->sp, t->sp);
#else
    swapcontext(&from->uc, &t->uc);
#endif
#ifdef EMU_ASAN
    emu_fiber *p = emu_st.prev;
    __sanitizer_finish_switch_fiber(from->fake, &p->bottom, &p->size);
#endif
}

/* the next thread of the team still running after thread i, or -1 (the caller) when none is */
static __attribute__((unused)) int emu_next(int i) {
    if (emu_st.live == 0) return -1;
    do i = (i + 1) % emu_st.n;
    while (emu_st.f[i].done);
    return i;
}

static __attribute__((unused)) void emu_entry(void) {
#ifdef EMU_ASAN
    emu_fiber *p = emu_st.prev;
    __sanitizer_finish_switch_fiber(NULL, &p->bottom, &p->size);
#endif
    const int me = emu_st.cur;
    emu_st.fn(emu_st.arg);
    emu_st.f[me].done = 1;
    emu_st.live--;
    emu_switch(&emu_st.f[me], emu_next(me), 1);
    abort(); /* a finished thread is never resumed */
}

/* a barrier of the whole team (the emulated block): every other thread runs up to its next
 * sync point before this one continues. Out of line, as the runtime call it stands for: the
 * kernels' unrolled loops hold thousands of them. */
static __attribute__((unused, noinline)) void emu_sync(void) {
    const int me = emu_st.cur, nx = emu_next(me);
    emu_st.f[me].syncs++;
    if (nx != me) emu_switch(&emu_st.f[me], nx, 0);
}

/* runs fn(arg) as a team of n threads (emu_tid() = 0 .. n-1); returns 0, or -1 when n is out of
 * range, the stacks could not be mapped or the threads passed different numbers of syncs */
static __attribute__((unused)) int emu_team_run(int n, void (*fn)(void *), void *arg) {
    if (n < 1 || n > EMU_TEAM_MAX) return -1;
    if (!emu_st.pool) {
        emu_st.page = (size_t)sysconf(_SC_PAGESIZE);
        const size_t one = EMU_STACK + emu_st.page;
        void *p = mmap(NULL, one * EMU_TEAM_MAX, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return -1;
        emu_st.pool = p;
        /* a guard page below each stack: an overflow faults instead of corrupting a neighbour */
        for (int i = 0; i < EMU_TEAM_MAX; i++) {
            emu_st.f[i].stack = emu_st.pool + one * (size_t)i + emu_st.page;
            mprotect(emu_st.pool + one * (size_t)i, emu_st.page, PROT_NONE);
        }
    }
    emu_st.n = n, emu_st.live = n, emu_st.fn = fn, emu_st.arg = arg;
    for (int i = 0; i < n; i++) {
        emu_fiber *f = &emu_st.f[i];
        f->done = 0, f->syncs = 0, f->fake = NULL;
        f->bottom = f->stack, f->size = EMU_STACK;
#ifdef EMU_ASAN
        /* the frames a thread left when it switched away for the last time (emu_entry's, at
         * the top of its stack) stay poisoned; every deeper frame had returned */
        ASAN_UNPOISON_MEMORY_REGION(f->stack + EMU_STACK - EMU_TOP, EMU_TOP);
#endif
#if defined(__x86_64__)
        /* the fresh stack as ompk_emu_swap leaves one: six zero registers, then emu_entry as
         * the return address, entered with the stack 8 past a 16-byte boundary like a call */
        uintptr_t *s = (uintptr_t *)(f->stack + EMU_STACK);
        s[-1] = 0;
        s[-2] = (uintptr_t)emu_entry;
        for (int r = 3; r <= 8; r++) s[-r] = 0;
        f->sp = &s[-8];
#else
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = EMU_STACK;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, emu_entry, 0);
#endif
    }
    emu_switch(&emu_st.main, 0, 0);
    emu_st.cur = 0;
    for (int i = 1; i < n; i++)
        if (emu_st.f[i].syncs != emu_st.f[0].syncs) {
            fprintf(stderr, "emu_team_run: thread %d passed %lu syncs, thread 0 %lu\n", i,
                    emu_st.f[i].syncs, emu_st.f[0].syncs);
            return -1;
        }
    return 0;
}

#define OMPK_EMU_TID() emu_tid()
#define OMPK_EMU_SYNC() emu_sync()

#endif
