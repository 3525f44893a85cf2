/* The selector (src/host/variant.h): OMPK_VARIANT / OMPK_ISA parsing and its messages, the
 * per-thread hook, the tables, and the environment read by a fresh process (ompk-info
 * --variants, spawned with its own environment). */
#include <criterion/criterion.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ompk/ompk.h"
#include "variant.h"

static ompk_status parse(const char *spec, const char *isa, int *chosen, char *err) {
    err[0] = '\0';
    return ompk_variant_parse(spec, isa, chosen, err, 768);
}

Test(variant, parse_accepts_known_names) {
    int ch[OMPK_OP_COUNT_];
    char err[768];
    cr_assert_eq(parse(NULL, NULL, ch, err), OMPK_OK);
    for (int o = 0; o < OMPK_OP_COUNT_; o++) cr_expect_eq(ch[o], -1);
    cr_assert_eq(parse("mhc_pre_fwd:portable,attention_bwd:portable", "auto", ch, err), OMPK_OK,
                 "%s", err);
    const ompk_impl_list t = ompk_impl_table(OMPK_OP_MHC_PRE_FWD);
    cr_expect_str_eq(t.impl[ch[OMPK_OP_MHC_PRE_FWD]].name, "portable");
    cr_expect_eq(ch[OMPK_OP_ATTENTION_FWD], -1);
    cr_expect_eq(ch[OMPK_OP_MOE], -1);
    cr_assert_eq(parse("moe:portable", "portable", ch, err), OMPK_OK, "%s", err);
    cr_assert_eq(parse("", "amx-emulated", ch, err), OMPK_OK, "%s", err);
    cr_expect_str_eq(ompk_impl_table(OMPK_OP_MOE).impl[ch[OMPK_OP_MOE]].name, "amx-emulated");
}

Test(variant, parse_rejects_bad_tokens_naming_them) {
    int ch[OMPK_OP_COUNT_];
    char err[768];
    cr_expect_eq(parse("mhc_pre_fwd:tc-bogus", NULL, ch, err), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "'tc-bogus'") && strstr(err, "portable") && strstr(err, "host"), "%s",
              err);
    cr_expect_eq(parse("attn:portable", NULL, ch, err), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "unknown op 'attn'") && strstr(err, "attention_fwd"), "%s", err);
    cr_expect_eq(parse("portable", NULL, ch, err), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "'portable' is not op:name"), "%s", err);
    cr_expect_eq(parse("router_fwd:portable,router_fwd:warp", NULL, ch, err),
                 OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "named twice"), "%s", err);
    cr_expect_eq(parse("moe:portable", "amx", ch, err), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "disagree"), "%s", err);
    cr_expect_eq(parse(NULL, "sse2", ch, err), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "'sse2'") && strstr(err, "avx512bf16"), "%s", err);
}

Test(variant, tables_end_in_an_always_available_portable_entry) {
    for (int o = 0; o < OMPK_OP_COUNT_; o++) {
        const ompk_impl_list t = ompk_impl_table((ompk_op)o);
        cr_assert_gt(t.count, 0, "%s", ompk_op_name((ompk_op)o));
        const ompk_impl *last = &t.impl[t.count - 1];
        cr_expect_str_eq(last->name, "portable", "%s", ompk_op_name((ompk_op)o));
        cr_expect(ompk_impl_available(last) && !last->named_only && !last->ok, "%s",
                  ompk_op_name((ompk_op)o));
        for (int i = 0; i < t.count; i++) {
            cr_expect_eq(ompk_variant_list(ompk_op_name((ompk_op)o), i), &t.impl[i]);
            for (int j = 0; j < i; j++)
                cr_expect_str_neq(t.impl[i].name, t.impl[j].name, "%s", ompk_op_name((ompk_op)o));
        }
        cr_expect_null(ompk_variant_list(ompk_op_name((ompk_op)o), t.count));
    }
}

Test(variant, force_is_checked_and_per_thread) {
    const ompk_impl *named;
    cr_assert_eq(ompk_variant_force("router_fwd", "portable"), OMPK_OK);
    cr_assert_eq(ompk_variant_selected(OMPK_OP_ROUTER_FWD, "t", &named), OMPK_OK);
    cr_expect(named && strcmp(named->name, "portable") == 0);
    cr_expect_eq(ompk_variant_force("router_fwd", "nope"), OMPK_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(ompk_last_error(), "'nope'") && strstr(ompk_last_error(), "warp"), "%s",
              ompk_last_error());
    cr_assert_eq(ompk_variant_selected(OMPK_OP_ROUTER_FWD, "t", &named), OMPK_OK);
    cr_expect(named && strcmp(named->name, "portable") == 0, "a refused name changes nothing");
    cr_expect_eq(ompk_variant_force("nope", "portable"), OMPK_ERR_INVALID_ARGUMENT);
    cr_assert_eq(ompk_variant_force("router_fwd", NULL), OMPK_OK);
    cr_assert_eq(ompk_variant_selected(OMPK_OP_ROUTER_FWD, "t", &named), OMPK_OK);
    cr_expect_null(named);
}

extern char **environ;

/* ompk-info beside the test's own directory (build/ompk-info for build/tests/test_variant; the
 * device bundles keep that layout), else where the build put it */
static const char *info_exe(void) {
    static char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
    if (n > 0) {
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash, "/../ompk-info");
            if (access(path, X_OK) == 0) return path;
        }
    }
    return OMPK_INFO_EXE;
}

/* ompk-info --variants in a fresh process whose environment is this one's without selections,
 * plus `var`: its exit status; its output must hold `want`. */
static int info_with(const char *var, const char *want) {
    static char *env[512];
    int ne = 0;
    for (char **e = environ; *e && ne < 510; e++)
        if (strncmp(*e, "OMPK_VARIANT=", 13) && strncmp(*e, "OMPK_ISA=", 9) &&
            !(strncmp(*e, "OMPK_", 5) == 0 && strstr(*e, "_VARIANT=")))
            env[ne++] = *e;
    env[ne++] = (char *)var;
    env[ne] = NULL;
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    const char *exe = info_exe();
    char *argv[] = {(char *)exe, (char *)"--variants", NULL};
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, exe, &fa, NULL, argv, env), 0);
    close(fd[1]);
    static char out[1 << 14];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    waitpid(pid, &status, 0);
    cr_expect(strstr(out, want), "want '%s' in:\n%s", want, out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(variant, environment_is_read_and_checked) {
    cr_expect_eq(
        info_with("OMPK_VARIANT=mhc_post_fwd:portable", "portable         default  <- selected"),
        0);
    cr_expect_eq(info_with("OMPK_VARIANT=mhc_post_fwd:u9",
                           "ERROR: OMPK_VARIANT: unknown mhc_post_fwd variant 'u9'"),
                 1);
    cr_expect_eq(info_with("OMPK_ISA=sse2", "ERROR: OMPK_ISA: unknown value 'sse2'"), 1);
    cr_expect_eq(info_with("OMPK_ATTN_VARIANT=portable",
                           "OMPK_ATTN_VARIANT=portable: this variable is not read"),
                 1);
}
