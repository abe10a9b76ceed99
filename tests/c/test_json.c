/* JSON reader tests in plain C: grammar, Python semantics (repeated keys,
 * int vs float, 8.0 == 8, truthiness, repr), UTF-8 validation, limits and
 * error positions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vtinfer/json.h"

#include "check.h"

static vt_json_doc *parse(const char *s, vt_status *st, vt_error *err) {
    vt_json_doc *d = NULL;
    *st = vt_json_parse(s, strlen(s), "t.json", NULL, &d, err);
    return d;
}

static void expect_error(const char *s, size_t len, const char *needle) {
    vt_error err;
    vt_json_doc *d = (vt_json_doc *)1;
    vt_status st = vt_json_parse(s, len, "t.json", NULL, &d, &err);
    CHECK(st == VT_ERR_PARSE, "'%.40s' should fail, got %d", s, (int)st);
    CHECK(d == NULL, "out must be NULL on failure");
    CHECK(strstr(err.message, needle) != NULL, "'%.40s': message '%s' lacks '%s'", s, err.message, needle);
}

static void test_semantics(void) {
    vt_error err;
    vt_status st;
    vt_json_doc *d = parse(" {\"a\": 1, \"b\": 8.0, \"a\": 3, \"c\": [true, false, null], \"e\": 8e0, \"f\": -0}", &st, &err);
    CHECK(st == VT_OK, "parse: %s", err.message);
    vt_json *r = vt_json_root(d);
    CHECK(r->kind == VT_JSON_OBJECT && r->count == 5, "object of 5 unique keys, got %zu", r->count);
    CHECK(!strcmp(r->members[0].key, "a") && vt_json_get(r, "a")->i == 3, "repeated key: first position, last value");
    CHECK(vt_json_get(r, "b")->kind == VT_JSON_FLOAT && vt_json_num_eq(vt_json_get(r, "b"), 8), "8.0 == 8");
    CHECK(vt_json_get(r, "e")->kind == VT_JSON_FLOAT && vt_json_num_eq(vt_json_get(r, "e"), 8), "8e0 == 8");
    CHECK(!vt_json_num_eq(vt_json_get(vt_json_get(r, "c"), "x"), 8), "missing is not 8");
    CHECK(!vt_json_num_eq(vt_json_get(r, "c")->items[0], 1), "true is not a number here");
    CHECK(!vt_json_truthy(vt_json_get(r, "f")) && vt_json_truthy(vt_json_get(r, "c")), "truthiness");
    char buf[256];
    vt_json_repr(r, buf, sizeof buf);
    CHECK(!strcmp(buf, "{'a': 3, 'b': 8.0, 'c': [True, False, None], 'e': 8.0, 'f': 0}"), "repr: %s", buf);
    CHECK(vt_json_set_string(d, r, "a", "x", 1, &err) == VT_OK && vt_json_str_eq(vt_json_get(r, "a"), "x"), "set");
    CHECK(vt_json_set_string(d, r, "new", "", 0, &err) == VT_OK && r->count == 6, "append");
    vt_json_free(d);

    d = parse("[1e16, 1e-5, 0.0001, 123456789.125, 1e400, NaN, -Infinity, 99999999999999999999999, \"it's\"]", &st, &err);
    CHECK(st == VT_OK, "parse: %s", err.message);
    vt_json_repr(vt_json_root(d), buf, sizeof buf);
    CHECK(!strcmp(buf, "[1e+16, 1e-05, 0.0001, 123456789.125, inf, nan, -inf, 99999999999999999999999, \"it's\"]"),
          "repr: %s", buf);
    CHECK(vt_json_root(d)->items[7]->big, "big int flagged");
    vt_json_free(d);

    d = parse("\"\\u00e9\\ud83d\\ude00\\ud800\"", &st, &err);
    CHECK(st == VT_OK && vt_json_root(d)->len == 2 + 4 + 3, "escapes incl. surrogate pair and lone surrogate");
    vt_json_free(d);
}

static void test_errors(void) {
    expect_error("", 0, "t.json:1:1: expecting value");
    expect_error("{\"a\":\n  tru}", 12, "t.json:2:3");
    expect_error("[1,]", 4, "expecting value");
    expect_error("{\"a\" 1}", 7, "':' delimiter");
    expect_error("01", 2, "extra data");
    expect_error("\"\x01\"", 3, "control character");
    expect_error("\"\xff\"", 3, "invalid UTF-8");
    expect_error("\"\xed\xa0\x80\"", 5, "invalid UTF-8"); /* encoded surrogate */
    expect_error("\"\xc0\xaf\"", 4, "invalid UTF-8");     /* overlong */
    expect_error("\xef\xbb\xbf{}", 5, "BOM");
    expect_error("\"abc", 4, "unterminated");
    expect_error("[1] x", 5, "extra data");
    expect_error("{'a': 1}", 8, "double quotes");
    size_t n = 100000;
    char *deep = (char *)malloc(n);
    memset(deep, '[', n);
    expect_error(deep, n, "nesting deeper than 512");
    free(deep);
    vt_json_limits lim = {8, 0};
    vt_json_doc *d = NULL;
    vt_error err;
    CHECK(vt_json_parse("[1, 2, 3, 4]", 12, "t.json", &lim, &d, &err) == VT_ERR_PARSE && strstr(err.message, "at most 8"),
          "max_bytes: %s", err.message);
    CHECK(vt_json_parse_file("/nonexistent/x.json", NULL, &d, &err) == VT_ERR_IO, "missing file is VT_ERR_IO");
}

static void test_big_object(void) {
    /* 1000 keys, each repeated: the sorted dedupe path */
    size_t cap = 64 * 2000;
    char *s = (char *)malloc(cap);
    size_t w = 0;
    w += (size_t)snprintf(s + w, cap - w, "{");
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < 1000; i++)
            w += (size_t)snprintf(s + w, cap - w, "%s\"k%d\": %d", (rep || i) ? ", " : "", i, rep * 10000 + i);
    w += (size_t)snprintf(s + w, cap - w, "}");
    vt_json_doc *d = NULL;
    vt_error err;
    CHECK(vt_json_parse(s, w, "big", NULL, &d, &err) == VT_OK, "%s", err.message);
    vt_json *r = vt_json_root(d);
    CHECK(r->count == 1000, "1000 unique keys, got %zu", r->count);
    CHECK(!strcmp(r->members[5].key, "k5") && r->members[5].value->i == 10005, "order of first, value of last");
    vt_json_free(d);
    free(s);
}

int main(void) {
    test_semantics();
    test_errors();
    test_big_object();
    return finish("test_json", "ok");
}
