/*
 * json.h -- a small, strict JSON reader for manifest.json (untrusted input).
 *
 * RFC 8259 only: no comments, trailing commas, NaN/Infinity, BOM, duplicate object keys,
 * lone surrogates, invalid UTF-8 or escaped NUL. Input size, nesting depth and the
 * number of values are bounded, so any input either parses or returns WP_E_FORMAT
 * with the line and column; nothing crashes or recurses without bound.
 */
#ifndef WP_JSON_H
#define WP_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "wp.h"

#define WPI_JSON_MAX_BYTES ((size_t)32 << 20) /* larger inputs are refused */
#define WPI_JSON_MAX_DEPTH 64                 /* arrays + objects nested */
#define WPI_JSON_MAX_VALUES ((size_t)2 << 20) /* values in one document */

typedef enum wpi_json_type {
    WPI_JSON_NULL = 0,
    WPI_JSON_BOOL,
    WPI_JSON_NUMBER,
    WPI_JSON_STRING,
    WPI_JSON_ARRAY,
    WPI_JSON_OBJECT
} wpi_json_type;

typedef struct wpi_json wpi_json;
struct wpi_json {
    wpi_json_type type;
    int boolean;        /* BOOL */
    int is_int;         /* NUMBER: an integer literal (no fraction or exponent) in int64 */
    int64_t integer;    /* NUMBER when is_int */
    double number;      /* NUMBER, always set (finite) */
    char *str;          /* STRING: UTF-8, NUL-terminated, no embedded NUL */
    size_t len;         /* STRING: bytes; ARRAY/OBJECT: children */
    wpi_json *items;    /* ARRAY/OBJECT children */
    char **keys;        /* OBJECT: key of each child, in document order */
};

/* Parses text[0..len) into a tree owned by *out (free with wpi_json_free).
 * Errors: WP_E_FORMAT (err: "line L column C: reason"), WP_E_OOM. */
wp_status wpi_json_parse(const char *text, size_t len, wpi_json **out, char *err, size_t cap);
void wpi_json_free(wpi_json *root);

/* Member of an object, or NULL when absent or when obj is not an object. */
const wpi_json *wpi_json_get(const wpi_json *obj, const char *key);
/* Element i of an array, or NULL. */
const wpi_json *wpi_json_at(const wpi_json *arr, size_t i);
/* 1 and *out set when v is an integer literal; 0 otherwise. */
int wpi_json_int(const wpi_json *v, int64_t *out);
/* 1 and *out set when v is a number (integer or not); 0 otherwise. */
int wpi_json_num(const wpi_json *v, double *out);
/* 1 and *out set when v is true or false; 0 otherwise. */
int wpi_json_bool(const wpi_json *v, int *out);
/* The string, or NULL when v is not a string. */
const char *wpi_json_str(const wpi_json *v);
/* "null", "bool", "number", "string", "array", "object" ("missing" for NULL). */
const char *wpi_json_type_name(const wpi_json *v);

#endif /* WP_JSON_H */
