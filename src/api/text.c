/* Texts for the bindings' API: a growing buffer, JSON strings, the
 * configuration as JSON members, the dataset of a stage value. A leaf:
 * calls nothing else of src/api. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api/api_priv.h"

static void vappend(dl__api_text_t *t, const char *fmt, va_list ap)
{
    if (t->oom)
        return;
    va_list cp;
    va_copy(cp, ap);
    int w = vsnprintf(NULL, 0, fmt, cp);
    va_end(cp);
    if (w < 0) {
        t->oom = 1;
        return;
    }
    if (t->len + (size_t)w + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + (size_t)w + 1)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->oom = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    t->len += (size_t)w;
}

void dl__api_printf(dl__api_text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(t, fmt, ap);
    va_end(ap);
}

void dl__api_json_str(dl__api_text_t *t, const char *s)
{
    dl__api_printf(t, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            dl__api_printf(t, "\\%c", *p);
        else if (*p < 0x20)
            dl__api_printf(t, "\\u%04x", *p);
        else
            dl__api_printf(t, "%c", *p);
    }
    dl__api_printf(t, "\"");
}

void dl__api_json_config(dl__api_text_t *t, const dl_moe_config_t *c)
{
    char buf[1024];
    if (dl_golden_config_string(c, "\n", buf, sizeof buf) != 0) {
        t->oom = 1;
        return;
    }
    int first = 1;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *eq = strstr(line, " = ");
        if (!eq)
            continue;
        *eq = '\0';
        const char *v = eq + 3;
        char *end;
        strtod(v, &end);
        dl__api_printf(t, "%s", first ? "" : ", ");
        dl__api_json_str(t, line);
        dl__api_printf(t, ": ");
        if (*v && !*end)
            dl__api_printf(t, "%s", v);
        else
            dl__api_json_str(t, v);
        first = 0;
    }
}

void dl__api_json_dims(dl__api_text_t *t, const dl_moe_config_t *c)
{
    static const char syms[] = "TdfEkMPSVR"; /* S: the shared experts' width (0: none); V: the hash table's rows; R: the router's width E + Z */
    dl__api_printf(t, "{");
    for (int i = 0; syms[i]; i++)
        dl__api_printf(t, "%s\"%c\": %lld", i ? ", " : "", syms[i],
                       (long long)dl_value_dim(c, syms[i]));
    dl__api_printf(t, "}");
}

char *dl__api_text_take(dl__api_text_t *t)
{
    if (t->oom || !t->s) {
        free(t->s);
        t->s = NULL;
        return t->oom ? NULL : calloc(1, 1);
    }
    char *s = t->s;
    t->s = NULL;
    return s;
}

int dl__api_fail(char *err, size_t n, int rc, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *dl__api_shape_str(char *buf, size_t n, int rank, const int64_t *dims)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

void dl_api_free_text(char *s)
{
    free(s);
}

int dl_api_version(void)
{
    return DL_API_VERSION;
}

const dl_golden_dataset_t *dl__api_dataset_of(dl_value_t v)
{
    for (int i = 0; i < dl_golden_dataset_count(); i++) {
        const dl_golden_dataset_t *ds = dl_golden_dataset(i);
        if (ds->group != DL_GOLDEN_INPUTS && !strcmp(ds->name, dl_value_name(v)))
            return ds;
    }
    return NULL;
}
