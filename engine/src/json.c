/*
 * json.c -- the strict, bounded JSON reader declared in json.h.
 *
 * Recursive descent with an explicit depth limit (WPI_JSON_MAX_DEPTH), so the C stack
 * stays bounded whatever the input. Children are collected in a growing array and moved
 * into their parent when the container closes. Numbers are converted under the "C"
 * locale: a host process that set LC_NUMERIC (a Python program may) must not turn
 * "1.5" into 1.
 */
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* newlocale and strtod_l are POSIX 2008 / glibc in <locale.h> and <stdlib.h>; the BSDs
 * and macOS declare them in <xlocale.h>. */
#if defined(__has_include)
#if __has_include(<xlocale.h>)
#include <xlocale.h>
#endif
#endif

#include "util.h"
#include "json.h"

typedef struct parser {
    const char *s;
    size_t n, i;
    size_t values;
    wp_status status;
    char *err;
    size_t cap;
    locale_t c_locale;
} parser;

static int fail_at(parser *p, wp_status st, const char *why)
{
    if (p->status != WP_OK)
        return 0;
    size_t line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) {
        if (p->s[k] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    p->status = st;
    wpi_fail(p->err, p->cap, st, "line %zu column %zu: %s", line, col, why);
    return 0;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->i++;
    }
}

static void free_value(wpi_json *v)
{
    if (v->type == WPI_JSON_STRING) {
        free(v->str);
    } else if (v->type == WPI_JSON_ARRAY || v->type == WPI_JSON_OBJECT) {
        for (size_t k = 0; k < v->len; k++) {
            free_value(&v->items[k]);
            if (v->keys)
                free(v->keys[k]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof(*v));
}

static int hex4(parser *p, uint32_t *out)
{
    if (p->n - p->i < 4)
        return fail_at(p, WP_E_FORMAT, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (uint32_t)(c - 'A' + 10);
        else
            return fail_at(p, WP_E_FORMAT, "bad hex digit in \\u escape");
        v = v << 4 | d;
    }
    p->i += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s[0..avail), or 0 (overlong forms, encoded
 * surrogates and code points above U+10FFFF are invalid). */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2; cp = c & 0x1F; min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3; cp = c & 0x0F; min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4; cp = c & 0x07; min = 0x10000;
    } else {
        return 0;
    }
    if (avail < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Parses a string starting at the opening quote into a malloc'd NUL-terminated copy. */
static int parse_string(parser *p, char **out, size_t *out_len)
{
    p->i++; /* opening quote */
    /* The decoded form is never longer than the source, so one scan sizes it. */
    size_t start = p->i, end = start;
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->n) {
        p->i = p->n;
        return fail_at(p, WP_E_FORMAT, "unterminated string");
    }
    char *o = malloc(end - start + 1);
    if (!o)
        return fail_at(p, WP_E_OOM, "out of memory");
    size_t k = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            free(o);
            return fail_at(p, WP_E_FORMAT, "control character in string");
        }
        if (c != '\\') {
            size_t l = utf8_len((const unsigned char *)p->s + p->i, end - p->i);
            if (!l) {
                free(o);
                return fail_at(p, WP_E_FORMAT, "invalid UTF-8 in string");
            }
            memcpy(o + k, p->s + p->i, l);
            k += l;
            p->i += l;
            continue;
        }
        p->i++;
        char e = p->s[p->i++];
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (!hex4(p, &cp)) {
                free(o);
                return 0;
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(o);
                return fail_at(p, WP_E_FORMAT, "lone low surrogate in \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->n - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                    free(o);
                    return fail_at(p, WP_E_FORMAT, "lone high surrogate in \\u escape");
                }
                p->i += 2;
                if (!hex4(p, &lo)) {
                    free(o);
                    return 0;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(o);
                    return fail_at(p, WP_E_FORMAT, "high surrogate not followed by a low one");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) {
                free(o);
                return fail_at(p, WP_E_FORMAT, "\\u0000 is not allowed in strings");
            }
            /* A \uXXXX escape is 6 source bytes and at most 3 UTF-8 bytes; a pair is
             * 12 source bytes and 4 UTF-8 bytes, so the buffer suffices. */
            k += put_utf8(o + k, cp);
            break;
        }
        default:
            free(o);
            p->i--;
            return fail_at(p, WP_E_FORMAT, "bad escape in string");
        }
    }
    o[k] = '\0';
    p->i = end + 1;
    *out = o;
    *out_len = k;
    return 1;
}

static int parse_number(parser *p, wpi_json *v)
{
    size_t start = p->i;
    int integral = 1;
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    if (p->i >= p->n)
        return fail_at(p, WP_E_FORMAT, "truncated number");
    if (p->s[p->i] == '0') {
        p->i++;
    } else if (p->s[p->i] >= '1' && p->s[p->i] <= '9') {
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    } else {
        return fail_at(p, WP_E_FORMAT, "bad number");
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        integral = 0;
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return fail_at(p, WP_E_FORMAT, "digit expected after decimal point");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        integral = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
            return fail_at(p, WP_E_FORMAT, "digit expected in exponent");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    }
    size_t len = p->i - start;
    if (len > 400)
        return fail_at(p, WP_E_FORMAT, "number literal too long");
    char buf[408];
    memcpy(buf, p->s + start, len);
    buf[len] = '\0';
    double d = strtod_l(buf, NULL, p->c_locale);
    if (!isfinite(d))
        return fail_at(p, WP_E_FORMAT, "number out of range");
    v->type = WPI_JSON_NUMBER;
    v->number = d;
    v->is_int = 0;
    if (integral) {
        const char *q = buf;
        int neg = *q == '-';
        if (neg)
            q++;
        uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int ok = 1;
        for (; *q; q++) {
            uint64_t dgt = (uint64_t)(*q - '0');
            if (acc > (lim - dgt) / 10) {
                ok = 0;
                break;
            }
            acc = acc * 10 + dgt;
        }
        if (ok) {
            v->is_int = 1;
            v->integer = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc)
                             : (int64_t)acc;
        }
    }
    return 1;
}

static int match_word(parser *p, const char *w)
{
    size_t l = strlen(w);
    if (p->n - p->i < l || memcmp(p->s + p->i, w, l) != 0)
        return fail_at(p, WP_E_FORMAT, "unexpected character");
    p->i += l;
    return 1;
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

static int parse_value(parser *p, wpi_json *v, int depth);

/* Parses an array or an object whose opening bracket is at p->i. */
static int parse_container(parser *p, wpi_json *v, int depth, int is_obj)
{
    if (depth >= WPI_JSON_MAX_DEPTH)
        return fail_at(p, WP_E_FORMAT, "nesting too deep");
    char close = is_obj ? '}' : ']';
    p->i++;
    wpi_json *items = NULL;
    char **keys = NULL;
    size_t n = 0, cap = 0;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        goto done;
    }
    for (;;) {
        char *key = NULL;
        size_t key_len;
        skip_ws(p);
        if (is_obj) {
            if (p->i >= p->n || p->s[p->i] != '"') {
                fail_at(p, WP_E_FORMAT, "object key expected");
                goto bad;
            }
            if (!parse_string(p, &key, &key_len))
                goto bad;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                fail_at(p, WP_E_FORMAT, "':' expected after object key");
                goto bad;
            }
            p->i++;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 4;
            wpi_json *ni = realloc(items, nc * sizeof(*ni));
            if (ni)
                items = ni;
            char **nk = is_obj ? realloc(keys, nc * sizeof(*nk)) : NULL;
            if (nk)
                keys = nk;
            if (!ni || (is_obj && !nk)) {
                free(key);
                fail_at(p, WP_E_OOM, "out of memory");
                goto bad;
            }
            cap = nc;
        }
        memset(&items[n], 0, sizeof(items[n]));
        if (is_obj)
            keys[n] = key;
        n++; /* counted before parsing so that cleanup frees a partial child */
        if (!parse_value(p, &items[n - 1], depth + 1))
            goto bad;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            break;
        }
        fail_at(p, WP_E_FORMAT, is_obj ? "',' or '}' expected" : "',' or ']' expected");
        goto bad;
    }
    if (is_obj && n > 1) {
        /* Duplicate keys would make a lookup depend on which copy it finds. */
        char ***idx = malloc(n * sizeof(*idx));
        if (!idx) {
            fail_at(p, WP_E_OOM, "out of memory");
            goto bad;
        }
        for (size_t k = 0; k < n; k++)
            idx[k] = &keys[k];
        qsort(idx, n, sizeof(*idx), cmp_keys);
        int dup = 0;
        for (size_t k = 1; k < n && !dup; k++)
            dup = strcmp(*idx[k - 1], *idx[k]) == 0;
        free(idx);
        if (dup) {
            fail_at(p, WP_E_FORMAT, "duplicate key in object");
            goto bad;
        }
    }
done:
    v->type = is_obj ? WPI_JSON_OBJECT : WPI_JSON_ARRAY;
    v->items = items;
    v->keys = keys;
    v->len = n;
    return 1;
bad:
    for (size_t k = 0; k < n; k++) {
        free_value(&items[k]);
        if (keys)
            free(keys[k]);
    }
    free(items);
    free(keys);
    return 0;
}

static int parse_value(parser *p, wpi_json *v, int depth)
{
    skip_ws(p);
    if (p->i >= p->n)
        return fail_at(p, WP_E_FORMAT, "value expected");
    if (++p->values > WPI_JSON_MAX_VALUES)
        return fail_at(p, WP_E_FORMAT, "too many values");
    char c = p->s[p->i];
    switch (c) {
    case '{':
        return parse_container(p, v, depth, 1);
    case '[':
        return parse_container(p, v, depth, 0);
    case '"':
        v->type = WPI_JSON_STRING;
        if (!parse_string(p, &v->str, &v->len)) {
            v->type = WPI_JSON_NULL;
            return 0;
        }
        return 1;
    case 't':
        v->type = WPI_JSON_BOOL;
        v->boolean = 1;
        return match_word(p, "true");
    case 'f':
        v->type = WPI_JSON_BOOL;
        v->boolean = 0;
        return match_word(p, "false");
    case 'n':
        v->type = WPI_JSON_NULL;
        return match_word(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, v);
        return fail_at(p, WP_E_FORMAT, "unexpected character");
    }
}

wp_status wpi_json_parse(const char *text, size_t len, wpi_json **out, char *err, size_t cap)
{
    if (!out || (!text && len))
        return wpi_fail(err, cap, WP_E_ARG, "json: NULL argument");
    *out = NULL;
    if (len > WPI_JSON_MAX_BYTES)
        return wpi_fail(err, cap, WP_E_FORMAT, "json: %zu bytes exceeds the limit of %zu",
                        len, WPI_JSON_MAX_BYTES);
    parser p = {.s = text, .n = len, .status = WP_OK, .err = err, .cap = cap};
    p.c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!p.c_locale)
        return wpi_fail(err, cap, WP_E_OOM, "json: cannot create the C locale");
    wpi_json *root = calloc(1, sizeof(*root));
    if (!root) {
        freelocale(p.c_locale);
        return wpi_fail(err, cap, WP_E_OOM, "json: out of memory");
    }
    if (parse_value(&p, root, 0)) {
        skip_ws(&p);
        if (p.i != p.n)
            fail_at(&p, WP_E_FORMAT, "trailing characters after the document");
    } else if (p.status == WP_OK) {
        fail_at(&p, WP_E_FORMAT, "invalid JSON");
    }
    freelocale(p.c_locale);
    if (p.status != WP_OK) {
        free_value(root);
        free(root);
        return p.status;
    }
    *out = root;
    return WP_OK;
}

void wpi_json_free(wpi_json *root)
{
    if (!root)
        return;
    free_value(root);
    free(root);
}

const wpi_json *wpi_json_get(const wpi_json *obj, const char *key)
{
    if (!obj || obj->type != WPI_JSON_OBJECT || !key)
        return NULL;
    for (size_t k = 0; k < obj->len; k++)
        if (strcmp(obj->keys[k], key) == 0)
            return &obj->items[k];
    return NULL;
}

const wpi_json *wpi_json_at(const wpi_json *arr, size_t i)
{
    if (!arr || arr->type != WPI_JSON_ARRAY || i >= arr->len)
        return NULL;
    return &arr->items[i];
}

int wpi_json_int(const wpi_json *v, int64_t *out)
{
    if (!v || v->type != WPI_JSON_NUMBER || !v->is_int)
        return 0;
    *out = v->integer;
    return 1;
}

int wpi_json_num(const wpi_json *v, double *out)
{
    if (!v || v->type != WPI_JSON_NUMBER)
        return 0;
    *out = v->number;
    return 1;
}

int wpi_json_bool(const wpi_json *v, int *out)
{
    if (!v || v->type != WPI_JSON_BOOL)
        return 0;
    *out = v->boolean;
    return 1;
}

const char *wpi_json_str(const wpi_json *v)
{
    return v && v->type == WPI_JSON_STRING ? v->str : NULL;
}

const char *wpi_json_type_name(const wpi_json *v)
{
    if (!v)
        return "missing";
    switch (v->type) {
    case WPI_JSON_NULL: return "null";
    case WPI_JSON_BOOL: return "bool";
    case WPI_JSON_NUMBER: return "number";
    case WPI_JSON_STRING: return "string";
    case WPI_JSON_ARRAY: return "array";
    case WPI_JSON_OBJECT: return "object";
    }
    return "unknown";
}
