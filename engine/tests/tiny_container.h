/* tiny_container.h -- tiny containers built by hand for the C tests, and PASS/FAIL reporting. */
#ifndef WP_TESTS_TINY_CONTAINER_H
#define WP_TESTS_TINY_CONTAINER_H

#include <stdint.h>
#include <stddef.h>

#include "container.h"

typedef struct tspec {
    const char *kinds;     /* one char per layer: 'd' dense, 'm' moe */
    uint32_t vocab, hidden, n_experts, top_k, moe_inter, inter;
    int tie;
    int edtype;            /* expert dtype */
    uint64_t record_bytes; /* 0: the smallest multiple of 4096 */
    const char *model_type;
} tspec;

typedef struct ttensor {
    char name[64];
    int dtype, nd;
    uint64_t s[2], off, bytes;
    uint32_t crc;
} ttensor;

typedef struct tbuilt {
    tspec sp;
    uint32_t n_layers, n_moe;
    ttensor t[8];
    int nt;
    uint64_t trunk_size, rec, mat_bytes[3], payload;
    char dir[256];
} tbuilt;

enum { MUT_NONE = 0, MUT_DELETE = 1, MUT_REPLACE = 2 };

typedef struct jframe {
    char path[160];
    int is_arr, idx, first, skip;
} jframe;

typedef struct jw {
    char *s;
    size_t n, cap;
    jframe st[16];
    int d;
    const char *target, *repl;
    int mode, applied;
    char (*rec)[160];      /* when set, every value path is recorded here */
    int n_rec;
} jw;

extern int n_pass, n_fail;
void report(int ok, const char *fmt, ...);
extern uint64_t rng_state;
uint64_t rng(void);
const char *dt_name(int d);
void put32(uint8_t *p, uint32_t v);
void put64(uint8_t *p, uint64_t v);
uint8_t payload_byte(uint32_t layer, uint32_t expert, uint64_t k);
void make_record(const tbuilt *b, uint32_t layer, uint32_t expert, uint8_t *r);
char *path_in(const tbuilt *b, const char *name);
char *bank_name(uint32_t layer);
int write_file(const char *path, const void *data, size_t n);
uint8_t *read_file(const char *path, size_t *n);
void jput(jw *w, const char *fmt, ...);
int jmember(jw *w, const char *key);
void jleaf(jw *w, const char *key, const char *fmt, ...);
void jbegin(jw *w, const char *key, int is_arr);
void jend(jw *w);
void jshape(jw *w, const char *key, int nd, const uint64_t *s);
int write_manifest(const tbuilt *b, const char *target, int mode, const char *repl,
                          char (*rec)[160], int *n_rec);
void add_tensor(tbuilt *b, const char *name, int dtype, int nd, uint64_t s0, uint64_t s1);
void write_banks(const tbuilt *b);
void build(tbuilt *b, const tspec *sp, const char *base);
void destroy(tbuilt *b);

#endif
