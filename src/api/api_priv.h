/* Private to the bindings' API (src/api/); not installed. */
#ifndef DL_API_PRIV_H
#define DL_API_PRIV_H
#include <stdarg.h>
#include "golden/golden_priv.h"
#include "check/check_priv.h"
#include "dropless/api.h"
#include "dropless/golden.h"
#include "dropless/check.h"
#include "dropless/values.h"

/* Handle tags: a handle of the wrong kind is refused, never used. */
#define DL__API_GOLDEN 0x444c4731u    /* "DLG1" */
#define DL__API_CANDIDATE 0x444c4331u /* "DLC1" */
#define DL__API_REPORT 0x444c5231u    /* "DLR1" */

struct dl_api_golden {
    uint32_t tag;
    dl_golden_file_t g;
};

/* The candidate's arrays live in a dl_golden_file_t (malloc'ed, so
 * dl_golden_free releases them and dl_golden_write_candidate writes them). */
struct dl_api_candidate {
    uint32_t tag;
    dl_golden_file_t f;
    dl_valueset_t bad;      /* stages a loaded file's loader set aside (1 << dl_value_t) */
    dl_valueset_t off_grid; /* float stages with values off their storage grid */
    int from_file;     /* isolated_groups in f are the file's */
};

struct dl_api_report {
    uint32_t tag;
    dl_check_report_t r;
};

/* A growing text (text.c, a leaf). On allocation failure oom is set and
 * further appends do nothing; dl__api_text_take then returns NULL. */
typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} dl__api_text_t;

void dl__api_printf(dl__api_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string, quotes included. */
void dl__api_json_str(dl__api_text_t *t, const char *s);
/* Appends "key = value" lines (sep-separated) as JSON members, numbers
 * unquoted. */
void dl__api_json_config(dl__api_text_t *t, const dl_moe_config_t *c);
/* Appends {"T": .., "d": .., ...} for c. */
void dl__api_json_dims(dl__api_text_t *t, const dl_moe_config_t *c);
char *dl__api_text_take(dl__api_text_t *t);
/* Writes a one-line message into err (may be NULL); returns rc. */
int dl__api_fail(char *err, size_t n, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* "[2, 3]" for a shape, into buf. */
const char *dl__api_shape_str(char *buf, size_t n, int rank, const int64_t *dims);

/* The golden of a handle, or NULL for a bad handle. */
const dl_golden_file_t *dl__api_golden_file(const dl_api_golden_t *g);

/* The golden-format dataset of stage v (never an input's). */
const dl_golden_dataset_t *dl__api_dataset_of(dl_value_t v);

/* Parses an isolation spec (dl_check_parse_groups, or "*": every stage
 * of provided its own group) whose groups name only stages in provided
 * (bits 1 << dl_value_t) and cover all of them (check.c). */
int dl__api_groups(const char *spec, dl_valueset_t provided,
                   dl_valueset_t *groups, int *ngroups, char *err, size_t n);

#endif
