/* The plain-C tests' check: CHECK(cond, fmt, ...) counts a failure (from any
 * thread) and prints the first 20 as "FAIL file:line: message"; finish()
 * ends main: the failure count on stderr and status 1, or `ok_line` on
 * stdout and status 0. */
#ifndef VTINFER_TEST_CHECK_H
#define VTINFER_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            if (__atomic_load_n(&failures, __ATOMIC_RELAXED) < 20) {      \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
                fprintf(stderr, __VA_ARGS__);                             \
                fputc('\n', stderr);                                      \
            }                                                             \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);           \
        }                                                                 \
    } while (0)

static inline int finish(const char *name, const char *ok_line) {
    if (failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, failures);
        return 1;
    }
    printf("%s: %s\n", name, ok_line);
    return 0;
}

#endif /* VTINFER_TEST_CHECK_H */
