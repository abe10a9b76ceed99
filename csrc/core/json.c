/* JSON reader: RFC 8259 grammar, UTF-8 validated, Python json semantics
 * where the RFC is silent (see vtinfer/json.h). Recursive descent bounded
 * by max_depth; every node lives in one arena owned by the document. */
#include "vtinfer/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    /* data follows, max_align_t aligned */
} arena_block;

struct vt_json_doc {
    arena_block *blocks;
    vt_json *root;
};

#define ARENA_ALIGN 16
#define ARENA_HDR (((sizeof(arena_block) + ARENA_ALIGN - 1) / ARENA_ALIGN) * ARENA_ALIGN)

static void *arena_alloc(vt_json_doc *d, size_t n) {
    n = (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (n == 0) n = ARENA_ALIGN;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (cap > SIZE_MAX - ARENA_HDR) return NULL;
        b = (arena_block *)malloc(ARENA_HDR + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = d->blocks;
        d->blocks = b;
    }
    void *p = (char *)b + ARENA_HDR + b->used;
    b->used += n;
    return p;
}

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    int depth, max_depth;
    const char *name;
    vt_json_doc *doc;
    vt_error *err;
    /* scratch for decoding strings */
    char *buf;
    size_t buf_cap;
} parser;

static vt_status perr(parser *p, size_t at, const char *what) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else if ((p->s[i] & 0xC0) != 0x80) {
            col++;
        }
    }
    return vt_error_set(p->err, VT_ERR_PARSE, "%s:%zu:%zu: %s", p->name, line, col, what);
}

static vt_status nomem(parser *p) {
    return vt_error_set(p->err, VT_ERR_NOMEM, "vt_json_parse: out of memory reading %s", p->name);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->pos++;
        else
            break;
    }
}

static vt_json *new_node(parser *p, vt_json_kind kind) {
    vt_json *v = (vt_json *)arena_alloc(p->doc, sizeof(vt_json));
    if (v) {
        memset(v, 0, sizeof *v);
        v->kind = kind;
    }
    return v;
}

static int buf_put(parser *p, size_t *n, const char *src, size_t k) {
    if (p->buf_cap - *n < k + 1) {
        size_t cap = p->buf_cap ? p->buf_cap : 256;
        while (cap - *n < k + 1) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        char *nb = (char *)realloc(p->buf, cap);
        if (!nb) return -1;
        p->buf = nb;
        p->buf_cap = cap;
    }
    memcpy(p->buf + *n, src, k);
    *n += k;
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0..avail), or 0. */
static size_t utf8_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (avail < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

static size_t utf8_encode(unsigned cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parse a string at p->pos (on the opening quote) into an arena copy. */
static vt_status parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = p->pos;
    p->pos++;
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len) return perr(p, start, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return perr(p, p->pos, "invalid control character in string");
        if (c == '\\') {
            if (p->pos + 1 >= p->len) return perr(p, start, "unterminated string");
            unsigned char e = p->s[p->pos + 1];
            char ch;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': {
                unsigned cp;
                if (p->pos + 6 > p->len || hex4(p->s + p->pos + 2, &cp) < 0)
                    return perr(p, p->pos, "invalid \\uXXXX escape");
                p->pos += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF && p->pos + 6 <= p->len && p->s[p->pos] == '\\' &&
                    p->s[p->pos + 1] == 'u') {
                    unsigned lo;
                    if (hex4(p->s + p->pos + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        p->pos += 6;
                    }
                }
                char tmp[4];
                size_t k = utf8_encode(cp, tmp);
                if (buf_put(p, &n, tmp, k) < 0) return nomem(p);
                continue;
            }
            default: return perr(p, p->pos, "invalid escape in string");
            }
            if (buf_put(p, &n, &ch, 1) < 0) return nomem(p);
            p->pos += 2;
            continue;
        }
        size_t k = utf8_len(p->s + p->pos, p->len - p->pos);
        if (k == 0) return perr(p, p->pos, "invalid UTF-8");
        if (buf_put(p, &n, (const char *)p->s + p->pos, k) < 0) return nomem(p);
        p->pos += k;
    }
    char *s = (char *)arena_alloc(p->doc, n + 1);
    if (!s) return nomem(p);
    if (n) memcpy(s, p->buf, n);
    s[n] = '\0';
    *out = s;
    *out_len = n;
    return VT_OK;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static vt_status parse_number(parser *p, vt_json **out) {
    size_t start = p->pos, i = p->pos;
    int is_float = 0;
    if (i < p->len && p->s[i] == '-') i++;
    if (i >= p->len || !is_digit(p->s[i])) return perr(p, start, "expecting value");
    if (p->s[i] == '0') i++;
    else while (i < p->len && is_digit(p->s[i])) i++;
    if (i < p->len && p->s[i] == '.' && i + 1 < p->len && is_digit(p->s[i + 1])) {
        is_float = 1;
        i++;
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < p->len && (p->s[j] == '+' || p->s[j] == '-')) j++;
        if (j < p->len && is_digit(p->s[j])) {
            is_float = 1;
            i = j;
            while (i < p->len && is_digit(p->s[i])) i++;
        }
    }
    size_t n = i - start;
    char *txt = (char *)arena_alloc(p->doc, n + 1);
    vt_json *v = txt ? new_node(p, is_float ? VT_JSON_FLOAT : VT_JSON_INT) : NULL;
    if (!v) return nomem(p);
    memcpy(txt, p->s + start, n);
    txt[n] = '\0';
    v->str = txt;
    v->len = n;
    if (is_float) {
        v->f = strtod(txt, NULL);
    } else {
        errno = 0;
        long long x = strtoll(txt, NULL, 10);
        if (errno == ERANGE) v->big = 1;
        else v->i = (int64_t)x;
    }
    p->pos = i;
    *out = v;
    return VT_OK;
}

static int match_lit(parser *p, const char *lit) {
    size_t n = strlen(lit);
    if (p->len - p->pos >= n && memcmp(p->s + p->pos, lit, n) == 0) {
        p->pos += n;
        return 1;
    }
    return 0;
}

static vt_status parse_value(parser *p, vt_json **out);

static int member_cmp_key(const vt_json_member *a, const vt_json_member *b) {
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    if (c) return c;
    return a->key_len < b->key_len ? -1 : (a->key_len > b->key_len);
}

static const vt_json_member *g_sort_base; /* only read inside qsort below */
static int idx_cmp(const void *x, const void *y) {
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    int c = member_cmp_key(&g_sort_base[a], &g_sort_base[b]);
    if (c) return c;
    return a < b ? -1 : (a > b);
}

/* Python dict semantics for repeated keys: the first position, the last
 * value. Small objects use a quadratic scan; large ones sort indices. */
static vt_status dedupe(parser *p, vt_json_member *m, size_t *count) {
    size_t n = *count;
    if (n < 2) return VT_OK;
    unsigned char *dead = (unsigned char *)calloc(n, 1);
    if (!dead) return nomem(p);
    size_t ndead = 0;
    if (n <= 32) {
        for (size_t i = 0; i < n; i++) {
            if (dead[i]) continue;
            for (size_t j = i + 1; j < n; j++) {
                if (!dead[j] && member_cmp_key(&m[i], &m[j]) == 0) {
                    m[i].value = m[j].value;
                    dead[j] = 1;
                    ndead++;
                }
            }
        }
    } else {
        size_t *idx = (size_t *)malloc(n * sizeof(size_t));
        if (!idx) {
            free(dead);
            return nomem(p);
        }
        for (size_t i = 0; i < n; i++) idx[i] = i;
        g_sort_base = m; /* the reader is not re-entrant across threads for huge objects */
        qsort(idx, n, sizeof(size_t), idx_cmp);
        for (size_t a = 0; a < n;) {
            size_t b = a + 1;
            while (b < n && member_cmp_key(&m[idx[a]], &m[idx[b]]) == 0) b++;
            if (b - a > 1) {
                m[idx[a]].value = m[idx[b - 1]].value;
                for (size_t k = a + 1; k < b; k++) dead[idx[k]] = 1;
                ndead += b - a - 1;
            }
            a = b;
        }
        free(idx);
    }
    if (ndead) {
        size_t w = 0;
        for (size_t i = 0; i < n; i++)
            if (!dead[i]) m[w++] = m[i];
        *count = w;
    }
    free(dead);
    return VT_OK;
}

static vt_status parse_container(parser *p, vt_json **out, int is_obj) {
    size_t open_at = p->pos;
    if (p->depth >= p->max_depth) {
        char msg[96];
        snprintf(msg, sizeof msg, "nesting deeper than %d levels", p->max_depth);
        return perr(p, open_at, msg);
    }
    p->depth++;
    p->pos++;
    size_t cap = 8, n = 0;
    size_t esz = is_obj ? sizeof(vt_json_member) : sizeof(vt_json *);
    char *tmp = (char *)malloc(cap * esz);
    if (!tmp) return nomem(p);
    vt_status st = VT_OK;
    skip_ws(p);
    char close = is_obj ? '}' : ']';
    if (p->pos < p->len && p->s[p->pos] == (unsigned char)close) {
        p->pos++;
    } else {
        for (;;) {
            skip_ws(p);
            vt_json_member mem = {0};
            if (is_obj) {
                if (p->pos >= p->len || p->s[p->pos] != '"') {
                    st = perr(p, p->pos, "expecting property name enclosed in double quotes");
                    break;
                }
                if ((st = parse_string(p, &mem.key, &mem.key_len)) != VT_OK) break;
                skip_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') {
                    st = perr(p, p->pos, "expecting ':' delimiter");
                    break;
                }
                p->pos++;
            }
            vt_json *v = NULL;
            if ((st = parse_value(p, &v)) != VT_OK) break;
            if (n == cap) {
                char *nt = cap > SIZE_MAX / 2 / esz ? NULL : (char *)realloc(tmp, 2 * cap * esz);
                if (!nt) {
                    st = nomem(p);
                    break;
                }
                tmp = nt;
                cap *= 2;
            }
            if (is_obj) {
                mem.value = v;
                memcpy(tmp + n * esz, &mem, esz);
            } else {
                memcpy(tmp + n * esz, &v, esz);
            }
            n++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == (unsigned char)close) {
                p->pos++;
                break;
            }
            st = perr(p, p->pos, is_obj ? "expecting ',' delimiter or '}'" : "expecting ',' delimiter or ']'");
            break;
        }
    }
    if (st == VT_OK && is_obj) st = dedupe(p, (vt_json_member *)(void *)tmp, &n);
    vt_json *v = NULL;
    if (st == VT_OK) {
        v = new_node(p, is_obj ? VT_JSON_OBJECT : VT_JSON_ARRAY);
        void *arr = v && n ? arena_alloc(p->doc, n * esz) : NULL;
        if (!v || (n && !arr)) {
            st = nomem(p);
        } else {
            if (n) memcpy(arr, tmp, n * esz);
            v->count = n;
            if (is_obj) v->members = (vt_json_member *)arr;
            else v->items = (vt_json **)arr;
        }
    }
    free(tmp);
    p->depth--;
    if (st == VT_OK) *out = v;
    return st;
}

static vt_status parse_value(parser *p, vt_json **out) {
    skip_ws(p);
    if (p->pos >= p->len) return perr(p, p->pos, "expecting value");
    unsigned char c = p->s[p->pos];
    vt_json *v = NULL;
    switch (c) {
    case '{': return parse_container(p, out, 1);
    case '[': return parse_container(p, out, 0);
    case '"': {
        const char *s;
        size_t n;
        vt_status st = parse_string(p, &s, &n);
        if (st != VT_OK) return st;
        v = new_node(p, VT_JSON_STRING);
        if (!v) return nomem(p);
        v->str = s;
        v->len = n;
        *out = v;
        return VT_OK;
    }
    default: break;
    }
    vt_json_kind kind = VT_JSON_NULL;
    double f = 0.0;
    int is_lit = 1;
    if (match_lit(p, "null")) kind = VT_JSON_NULL;
    else if (match_lit(p, "true")) kind = VT_JSON_TRUE;
    else if (match_lit(p, "false")) kind = VT_JSON_FALSE;
    else if (match_lit(p, "NaN")) { kind = VT_JSON_FLOAT; f = NAN; }
    else if (match_lit(p, "Infinity")) { kind = VT_JSON_FLOAT; f = INFINITY; }
    else if (match_lit(p, "-Infinity")) { kind = VT_JSON_FLOAT; f = -INFINITY; }
    else is_lit = 0;
    if (is_lit) {
        v = new_node(p, kind);
        if (!v) return nomem(p);
        v->f = f;
        *out = v;
        return VT_OK;
    }
    if (c == '-' || is_digit(c)) return parse_number(p, out);
    return perr(p, p->pos, "expecting value");
}

void vt_json_free(vt_json_doc *doc) {
    if (!doc) return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *nx = b->next;
        free(b);
        b = nx;
    }
    free(doc);
}

vt_status vt_json_parse(const char *text, size_t len, const char *name, const vt_json_limits *limits,
                        vt_json_doc **out, vt_error *err) {
    if (!out) return vt_error_set(err, VT_ERR_VALUE, "vt_json_parse: out must be non-NULL; got NULL");
    *out = NULL;
    if (!text && len) return vt_error_set(err, VT_ERR_VALUE, "vt_json_parse: text must be non-NULL; got NULL");
    size_t max_bytes = limits && limits->max_bytes ? limits->max_bytes : VT_JSON_DEFAULT_MAX_BYTES;
    int max_depth = limits && limits->max_depth > 0 ? limits->max_depth : VT_JSON_DEFAULT_MAX_DEPTH;
    if (max_depth > 100000) max_depth = 100000; /* recursion must stay bounded */
    if (!name) name = "<string>";
    if (len > max_bytes)
        return vt_error_set(err, VT_ERR_PARSE, "%s: document must be at most %zu bytes; got %zu", name, max_bytes,
                            len);
    vt_json_doc *doc = (vt_json_doc *)calloc(1, sizeof *doc);
    if (!doc) return vt_error_set(err, VT_ERR_NOMEM, "vt_json_parse: out of memory reading %s", name);
    parser p = {(const unsigned char *)text, len, 0, 0, max_depth, name, doc, err, NULL, 0};
    vt_status st;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        st = perr(&p, 0, "unexpected UTF-8 BOM");
    } else {
        st = parse_value(&p, &doc->root);
        if (st == VT_OK) {
            skip_ws(&p);
            if (p.pos != p.len) st = perr(&p, p.pos, "extra data after the document");
        }
    }
    free(p.buf);
    if (st != VT_OK) {
        vt_json_free(doc);
        return st;
    }
    *out = doc;
    return VT_OK;
}

vt_status vt_json_parse_file(const char *path, const vt_json_limits *limits, vt_json_doc **out, vt_error *err) {
    if (!out) return vt_error_set(err, VT_ERR_VALUE, "vt_json_parse_file: out must be non-NULL; got NULL");
    *out = NULL;
    if (!path) return vt_error_set(err, VT_ERR_VALUE, "vt_json_parse_file: path must be non-NULL; got NULL");
    size_t max_bytes = limits && limits->max_bytes ? limits->max_bytes : VT_JSON_DEFAULT_MAX_BYTES;
    FILE *f = fopen(path, "rb");
    if (!f) return vt_error_set(err, VT_ERR_IO, "vt_json_parse_file: path must be a readable file; got '%s'", path);
    size_t cap = 65536, n = 0;
    char *buf = (char *)malloc(cap);
    vt_status st = VT_OK;
    if (!buf) st = vt_error_set(err, VT_ERR_NOMEM, "vt_json_parse_file: out of memory reading %s", path);
    while (st == VT_OK) {
        if (n == cap) {
            if (cap > max_bytes) break;
            char *nb = (char *)realloc(buf, cap * 2);
            if (!nb) {
                st = vt_error_set(err, VT_ERR_NOMEM, "vt_json_parse_file: out of memory reading %s", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f)) st = vt_error_set(err, VT_ERR_IO, "vt_json_parse_file: reading '%s' failed", path);
            break;
        }
    }
    fclose(f);
    if (st == VT_OK) {
        if (n > max_bytes)
            st = vt_error_set(err, VT_ERR_PARSE, "%s: document must be at most %zu bytes; got more", path,
                              max_bytes);
        else
            st = vt_json_parse(buf, n, path, limits, out, err);
    }
    free(buf);
    return st;
}

vt_json *vt_json_root(const vt_json_doc *doc) { return doc ? doc->root : NULL; }

vt_json *vt_json_get(const vt_json *obj, const char *key) {
    if (!obj || obj->kind != VT_JSON_OBJECT || !key) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->count; i++)
        if (obj->members[i].key_len == kl && memcmp(obj->members[i].key, key, kl) == 0) return obj->members[i].value;
    return NULL;
}

vt_status vt_json_set_string(vt_json_doc *doc, vt_json *obj, const char *key, const char *value, size_t value_len,
                             vt_error *err) {
    if (!doc || !obj || !key || (!value && value_len))
        return vt_error_set(err, VT_ERR_VALUE, "vt_json_set_string: arguments must be non-NULL; got NULL");
    if (obj->kind != VT_JSON_OBJECT)
        return vt_error_set(err, VT_ERR_TYPE, "vt_json_set_string: obj must be an object; got kind %d",
                            (int)obj->kind);
    char *s = (char *)arena_alloc(doc, value_len + 1);
    vt_json *v = s ? (vt_json *)arena_alloc(doc, sizeof(vt_json)) : NULL;
    if (!v) return vt_error_set(err, VT_ERR_NOMEM, "vt_json_set_string: out of memory");
    if (value_len) memcpy(s, value, value_len);
    s[value_len] = '\0';
    memset(v, 0, sizeof *v);
    v->kind = VT_JSON_STRING;
    v->str = s;
    v->len = value_len;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->count; i++) {
        if (obj->members[i].key_len == kl && memcmp(obj->members[i].key, key, kl) == 0) {
            obj->members[i].value = v;
            return VT_OK;
        }
    }
    vt_json_member *m = (vt_json_member *)arena_alloc(doc, (obj->count + 1) * sizeof(vt_json_member));
    char *k = m ? (char *)arena_alloc(doc, kl + 1) : NULL;
    if (!k) return vt_error_set(err, VT_ERR_NOMEM, "vt_json_set_string: out of memory");
    memcpy(k, key, kl + 1);
    if (obj->count) memcpy(m, obj->members, obj->count * sizeof(vt_json_member));
    m[obj->count].key = k;
    m[obj->count].key_len = kl;
    m[obj->count].value = v;
    obj->members = m;
    obj->count++;
    return VT_OK;
}

int vt_json_truthy(const vt_json *v) {
    if (!v) return 0;
    switch (v->kind) {
    case VT_JSON_NULL:
    case VT_JSON_FALSE: return 0;
    case VT_JSON_TRUE: return 1;
    case VT_JSON_INT: return v->big || v->i != 0;
    case VT_JSON_FLOAT: return v->f != 0.0; /* NaN is truthy in Python: NaN != 0 */
    case VT_JSON_STRING: return v->len != 0;
    case VT_JSON_ARRAY:
    case VT_JSON_OBJECT: return v->count != 0;
    }
    return 0;
}

int vt_json_num_eq(const vt_json *v, int64_t x) {
    if (!v) return 0;
    if (v->kind == VT_JSON_INT) return !v->big && v->i == x;
    if (v->kind == VT_JSON_FLOAT) return v->f == (double)x && (double)x == (double)(int64_t)(double)x;
    return 0;
}

int vt_json_str_eq(const vt_json *v, const char *s) {
    if (!v || v->kind != VT_JSON_STRING || !s) return 0;
    size_t n = strlen(s);
    return v->len == n && memcmp(v->str, s, n) == 0;
}

/* ---- repr ---------------------------------------------------------------- */

typedef struct outbuf {
    char *b;
    size_t cap, n;
    int full;
} outbuf;

static void ob_put(outbuf *o, const char *s, size_t k) {
    if (o->full) return;
    if (o->n + k + 1 > o->cap) {
        o->full = 1;
        return;
    }
    memcpy(o->b + o->n, s, k);
    o->n += k;
}
static void ob_puts(outbuf *o, const char *s) { ob_put(o, s, strlen(s)); }

/* Python's repr(float): shortest round-trip digits, fixed notation for
 * decimal exponents in [-4, 16), scientific otherwise. */
static void repr_float(outbuf *o, double f) {
    if (isnan(f)) { ob_puts(o, "nan"); return; }
    if (isinf(f)) { ob_puts(o, f < 0 ? "-inf" : "inf"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = tmp;
    if (*q == '-') { neg = 1; q++; }
    while (*q && *q != 'e') {
        if (*q != '.') digits[nd++] = *q;
        q++;
    }
    int e10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char res[64];
    size_t r = 0;
    if (neg) res[r++] = '-';
    if (e10 >= -5 + 1 && e10 < 16) {
        if (e10 < 0) {
            res[r++] = '0';
            res[r++] = '.';
            for (int i = 0; i < -e10 - 1; i++) res[r++] = '0';
            for (int i = 0; i < nd; i++) res[r++] = digits[i];
        } else {
            for (int i = 0; i <= e10; i++) res[r++] = i < nd ? digits[i] : '0';
            res[r++] = '.';
            if (nd > e10 + 1) for (int i = e10 + 1; i < nd; i++) res[r++] = digits[i];
            else res[r++] = '0';
        }
        res[r] = '\0';
    } else {
        res[r++] = digits[0];
        if (nd > 1) {
            res[r++] = '.';
            for (int i = 1; i < nd; i++) res[r++] = digits[i];
        }
        res[r] = '\0';
        snprintf(res + r, sizeof res - r, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
    }
    ob_puts(o, res);
}

static void repr_str(outbuf *o, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    ob_put(o, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[16];
        if (c == (unsigned char)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            ob_put(o, tmp, 2);
        } else if (c == '\n') ob_puts(o, "\\n");
        else if (c == '\r') ob_puts(o, "\\r");
        else if (c == '\t') ob_puts(o, "\\t");
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            ob_puts(o, tmp);
        } else if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0xA0) {
            /* C1 controls and NBSP are not printable in Python */
            snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned char)s[i + 1]);
            ob_puts(o, tmp);
            i++;
        } else if (c == 0xED && i + 2 < n && (unsigned char)s[i + 1] >= 0xA0) {
            unsigned cp = ((c & 0x0Fu) << 12) | (((unsigned char)s[i + 1] & 0x3Fu) << 6) | ((unsigned char)s[i + 2] & 0x3Fu);
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            ob_puts(o, tmp);
            i += 2;
        } else {
            ob_put(o, (const char *)&s[i], 1);
        }
    }
    ob_put(o, &q, 1);
}

static void repr_value(outbuf *o, const vt_json *v, int depth) {
    if (depth > 64) { ob_puts(o, "..."); return; }
    char tmp[32];
    switch (v->kind) {
    case VT_JSON_NULL: ob_puts(o, "None"); break;
    case VT_JSON_FALSE: ob_puts(o, "False"); break;
    case VT_JSON_TRUE: ob_puts(o, "True"); break;
    case VT_JSON_INT:
        if (v->big) {
            ob_put(o, v->str, v->len);
        } else {
            snprintf(tmp, sizeof tmp, "%lld", (long long)v->i);
            ob_puts(o, tmp);
        }
        break;
    case VT_JSON_FLOAT: repr_float(o, v->f); break;
    case VT_JSON_STRING: repr_str(o, v->str, v->len); break;
    case VT_JSON_ARRAY:
        ob_puts(o, "[");
        for (size_t i = 0; i < v->count; i++) {
            if (i) ob_puts(o, ", ");
            repr_value(o, v->items[i], depth + 1);
        }
        ob_puts(o, "]");
        break;
    case VT_JSON_OBJECT:
        ob_puts(o, "{");
        for (size_t i = 0; i < v->count; i++) {
            if (i) ob_puts(o, ", ");
            repr_str(o, v->members[i].key, v->members[i].key_len);
            ob_puts(o, ": ");
            repr_value(o, v->members[i].value, depth + 1);
        }
        ob_puts(o, "}");
        break;
    }
}

size_t vt_json_repr(const vt_json *v, char *buf, size_t cap) {
    if (!buf || cap == 0) return 0;
    outbuf o = {buf, cap, 0, 0};
    if (!v) ob_puts(&o, "None");
    else repr_value(&o, v, 0);
    if (o.full) {
        /* truncate with "..." */
        size_t keep = cap > 4 ? cap - 4 : 0;
        if (o.n > keep) o.n = keep;
        while (o.n > 0 && ((unsigned char)buf[o.n] & 0xC0) == 0x80) o.n--; /* stay on a UTF-8 boundary */
        if (cap >= 4) {
            memcpy(buf + o.n, "...", 3);
            o.n += 3;
        }
    }
    buf[o.n] = '\0';
    return o.n;
}
