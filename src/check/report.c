/* Report writers: a human table, JSON (schema in doc/conformance.md) and
 * JUnit XML. Strings from files (case and backend names) are escaped and
 * any invalid UTF-8 replaced, so every output parses. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check/check_priv.h"

int dl_report_format_parse(const char *name, dl_report_format_t *fmt)
{
    if (!name || !fmt)
        return DL_EINVAL;
    if (!strcasecmp(name, "table") || !strcasecmp(name, "text") || !strcasecmp(name, "human"))
        *fmt = DL_REPORT_TABLE;
    else if (!strcasecmp(name, "json"))
        *fmt = DL_REPORT_JSON;
    else if (!strcasecmp(name, "junit") || !strcasecmp(name, "xml"))
        *fmt = DL_REPORT_JUNIT;
    else
        return DL_EINVAL;
    return 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t len;
    uint32_t cp;
    if ((s[0] & 0xE0) == 0xC0)
        len = 2, cp = s[0] & 0x1F;
    else if ((s[0] & 0xF0) == 0xE0)
        len = 3, cp = s[0] & 0x0F;
    else if ((s[0] & 0xF8) == 0xF0)
        len = 4, cp = s[0] & 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < minv[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static void json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    fputc('"', f);
    while (n) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c == '\t') {
            fputs("\\t", f);
        } else if (c < 0x20 || c == 0x7F) {
            fprintf(f, "\\u%04x", c);
        } else if (c >= 0x80) {
            size_t l = utf8_len(p, n);
            if (!l) {
                fputs("\\ufffd", f);
                l = 1;
            } else {
                fwrite(p, 1, l, f);
            }
            p += l;
            n -= l;
            continue;
        } else {
            fputc(c, f);
        }
        p++;
        n--;
    }
    fputc('"', f);
}

static void xml_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    while (n) {
        unsigned char c = *p;
        size_t l = 1;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        case '\n': fputs("&#10;", f); break;
        case '\t': fputs("&#9;", f); break;
        default:
            if (c < 0x20 || c == 0x7F) {
                fputc('?', f); /* not allowed in XML 1.0 */
            } else if (c >= 0x80) {
                l = utf8_len(p, n);
                if (!l) {
                    fputc('?', f);
                    l = 1;
                } else {
                    fwrite(p, 1, l, f);
                }
            } else {
                fputc(c, f);
            }
        }
        p += l;
        n -= l;
    }
}

/* A JSON number, or null when it is NaN or infinite (JSON has neither). */
static void json_num(FILE *f, double x, int exact)
{
    if (!isfinite(x))
        fputs("null", f);
    else
        fprintf(f, exact ? "%.17g" : "%.6g", x);
}

static void counts(const dl_check_report_t *r, int64_t c[5])
{
    memset(c, 0, 5 * sizeof *c);
    for (size_t i = 0; i < r->n; i++)
        c[r->results[i].verdict]++;
}

static void write_json_one(FILE *f, const dl_check_report_t *r)
{
    int64_t c[5];
    counts(r, c);
    fputs("{\"format\":\"dropless-check\",\"version\":1,\"case\":", f);
    json_str(f, r->case_name);
    fputs(",\"backend\":", f);
    json_str(f, r->backend);
    fputs(",\"backend_version\":", f);
    json_str(f, r->backend_version);
    fputs(",\"profile\":", f);
    json_str(f, r->profile);
    fprintf(f, ",\"verdict\":\"%s\",\"conformant\":%s,\"checked\":%s,\"seconds\":",
            dl_verdict_name(r->verdict), dl_check_conformant(r) ? "true" : "false",
            dl_check_checked(r) ? "true" : "false");
    json_num(f, r->seconds, 0);
    fprintf(f,
            ",\"counts\":{\"PASS\":%lld,\"WARN\":%lld,\"FAIL\":%lld,\"SKIP\":%lld,\"INFO\":%lld}",
            (long long)c[DL_VERDICT_PASS], (long long)c[DL_VERDICT_WARN],
            (long long)c[DL_VERDICT_FAIL], (long long)c[DL_VERDICT_SKIP],
            (long long)c[DL_VERDICT_INFO]);
    /* every dropped pair (issue 24): "truncated" stays, always false */
    fprintf(f, ",\"dropped\":{\"count\":%lld,\"truncated\":false,\"pairs\":[",
            (long long)r->n_dropped);
    for (int64_t i = 0; i < r->n_dropped; i++)
        fprintf(f, "%s[%lld,%lld]", i ? "," : "", (long long)r->dropped[i].token,
                (long long)r->dropped[i].slot);
    fputs("]},\"checks\":[", f);
    for (size_t i = 0; i < r->n; i++) {
        const dl_check_result_t *x = &r->results[i];
        fputs(i ? ",\n  {" : "\n  {", f);
        fputs("\"stage\":", f);
        json_str(f, dl_value_name(x->stage));
        fputs(",\"check\":", f);
        json_str(f, x->check);
        fprintf(f, ",\"verdict\":\"%s\",\"n_checked\":%lld,\"n_over_pass\":%lld,"
                   "\"n_over_warn\":%lld,\"n_nonfinite\":%lld,\"K\":%lld,\"err_pass\":",
                dl_verdict_name(x->verdict), (long long)x->n_checked, (long long)x->n_over_pass,
                (long long)x->n_over_warn, (long long)x->n_nonfinite, (long long)x->K);
        json_num(f, x->err_pass, 0);
        fputs(",\"err_warn\":", f);
        json_num(f, x->err_warn, 0);
        fputs(",\"max_ulp\":", f);
        json_num(f, x->max_ulp, 0);
        fputs(",\"max_abs\":", f);
        json_num(f, x->max_abs, 0);
        /* the statistical tier (tolerances.md): which bound decided, the
         * statistic (err_stat, > 1 FAILs) and its multiplier */
        fputs(",\"tier\":", f);
        if (x->tier[0])
            json_str(f, x->tier);
        else
            fputs("null", f);
        fprintf(f, ",\"n_over_stat\":%lld,\"err_stat\":", (long long)x->n_over_stat);
        json_num(f, x->err_stat, 0);
        fputs(",\"lambda\":", f);
        json_num(f, x->lambda, 0);
        if (x->worst_index >= 0) {
            fprintf(f, ",\"worst\":{\"index\":%lld,\"candidate\":", (long long)x->worst_index);
            json_num(f, x->worst_cand, 1);
            fputs(",\"exact\":", f);
            json_num(f, x->worst_exact, 1);
            fputs("}", f);
        } else {
            fputs(",\"worst\":null", f);
        }
        fputs(",\"message\":", f);
        json_str(f, x->message);
        fputs("}", f);
    }
    fputs("\n]}", f);
}

static const char *colour_of(dl_verdict_t v)
{
    switch (v) {
    case DL_VERDICT_PASS: return "\033[32m";
    case DL_VERDICT_WARN: return "\033[33m";
    case DL_VERDICT_FAIL: return "\033[1;31m";
    default: return "\033[2m";
    }
}

static void fig(char *buf, size_t n, double x)
{
    if (isnan(x))
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.3g", x);
}

/* An unsealed golden file (a "golden_seal" WARN line, added by the
 * command) is said again under the header, where it cannot be missed. */
static void write_seal_banner(FILE *f, const dl_check_report_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->results[i].verdict == DL_VERDICT_WARN && !strcmp(r->results[i].check, "golden_seal"))
            fprintf(f, "WARNING: %s\n", r->results[i].message);
}

static void write_table_one(FILE *f, const dl_check_report_t *r, unsigned flags)
{
    const int col = (flags & DL_REPORT_COLOUR) != 0;
    int64_t c[5];
    counts(r, c);
    fprintf(f, "dropless check: case %s, backend %s%s%s, profile %s\n", r->case_name, r->backend,
            r->backend_version[0] ? " " : "", r->backend_version, r->profile);
    write_seal_banner(f, r);
    fprintf(f, "%-16s %-14s %-7s %9s %9s %9s %12s  %s\n", "stage", "check", "verdict", "err/PASS",
            "ulp", "over", "worst", "message");
    size_t nskip = 0;
    for (size_t i = 0; i < r->n; i++) {
        const dl_check_result_t *x = &r->results[i];
        if (x->verdict == DL_VERDICT_SKIP && !(flags & DL_REPORT_ALL)) {
            nskip++;
            continue;
        }
        char ep[32], ul[32], wi[32];
        fig(ep, sizeof ep, x->err_pass);
        fig(ul, sizeof ul, x->max_ulp);
        if (x->worst_index >= 0)
            snprintf(wi, sizeof wi, "%lld", (long long)x->worst_index);
        else
            snprintf(wi, sizeof wi, "-");
        fprintf(f, "%-16s %-14s %s%-7s%s %9s %9s %9lld %12s  %s\n", dl_value_name(x->stage),
                x->check, col ? colour_of(x->verdict) : "", dl_verdict_name(x->verdict),
                col ? "\033[0m" : "", ep, ul, (long long)x->n_over_pass, wi, x->message);
    }
    if (nskip) {
        fprintf(f, "skipped (not provided):");
        for (size_t i = 0; i < r->n; i++)
            if (r->results[i].verdict == DL_VERDICT_SKIP)
                fprintf(f, " %s", dl_value_name(r->results[i].stage));
        fputc('\n', f);
    }
    const int ok = dl_check_conformant(r), empty = !dl_check_checked(r);
    fprintf(f, "%s%s%s: %lld PASS, %lld WARN, %lld FAIL, %lld SKIP",
            col ? (ok ? "\033[1;32m" : "\033[1;31m") : "",
            ok ? "CONFORMANT" : empty ? "NOTHING CHECKED" : "NOT CONFORMANT",
            col ? "\033[0m" : "", (long long)c[DL_VERDICT_PASS], (long long)c[DL_VERDICT_WARN],
            (long long)c[DL_VERDICT_FAIL], (long long)c[DL_VERDICT_SKIP]);
    if (r->n_dropped)
        fprintf(f, "; %lld (token, slot) pairs dropped", (long long)r->n_dropped);
    fprintf(f, " (%.2f s)\n", r->seconds);
}

/* The figures of a result, those that apply only: a non-numeric check
 * has no error ratios, no ulp, no worst element (blank, never "nan"). */
static void junit_figures(FILE *f, const dl_check_result_t *x)
{
    char buf[1024];
    size_t w = (size_t)snprintf(buf, sizeof buf, "%s\nchecked %lld, over PASS bound %lld, over WARN "
                                "bound %lld, non-finite %lld", x->message, (long long)x->n_checked,
                                (long long)x->n_over_pass, (long long)x->n_over_warn,
                                (long long)x->n_nonfinite);
    /* error ratios are the numerics rows' figures: another check's
     * err_pass (zero_drops' floor ratio) is no error figure */
    const int num = !strcmp(x->check, "numerics");
    const double v[5] = {x->err_pass, x->err_warn, x->max_ulp, x->err_stat, x->lambda};
    static const char *const nm[5] = {"err/PASS", "err/WARN", "max ulp", "err/statistical",
                                      "lambda"};
    for (int i = 0; num && i < 5 && w < sizeof buf; i++)
        if (!isnan(v[i]))
            w += (size_t)snprintf(buf + w, sizeof buf - w, ", %s %.6g", nm[i], v[i]);
    if (num && x->tier[0] && w < sizeof buf)
        w += (size_t)snprintf(buf + w, sizeof buf - w, ", decided by the %s bound", x->tier);
    if (x->worst_index >= 0 && w < sizeof buf) {
        w += (size_t)snprintf(buf + w, sizeof buf - w, ", worst index %lld",
                              (long long)x->worst_index);
        if (!isnan(x->worst_cand) && w < sizeof buf)
            snprintf(buf + w, sizeof buf - w, ": candidate %.9g, exact %.9g", x->worst_cand,
                     x->worst_exact);
    }
    xml_str(f, buf);
}

static void write_junit(FILE *f, const dl_check_report_t *const *r, size_t n)
{
    int64_t tests = 0, fails = 0, skips = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c[5];
        counts(r[i], c);
        tests += (int64_t)r[i]->n;
        fails += c[DL_VERDICT_FAIL];
        skips += c[DL_VERDICT_SKIP];
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<testsuites name=\"dropless-check\" tests=\"%lld\" failures=\"%lld\" errors=\"0\" "
               "skipped=\"%lld\">\n",
            (long long)tests, (long long)fails, (long long)skips);
    for (size_t i = 0; i < n; i++) {
        const dl_check_report_t *rp = r[i];
        int64_t c[5];
        counts(rp, c);
        /* named by case and backend: several backends of one case stay apart */
        fputs("  <testsuite name=\"", f);
        xml_str(f, rp->case_name);
        fputs(" [", f);
        xml_str(f, rp->backend);
        fprintf(f, "]\" tests=\"%lld\" failures=\"%lld\" errors=\"0\" skipped=\"%lld\" "
                   "time=\"%.3f\">\n",
                (long long)rp->n, (long long)c[DL_VERDICT_FAIL], (long long)c[DL_VERDICT_SKIP],
                rp->seconds);
        fputs("    <properties>\n      <property name=\"backend\" value=\"", f);
        xml_str(f, rp->backend);
        fputs("\"/>\n      <property name=\"backend_version\" value=\"", f);
        xml_str(f, rp->backend_version);
        fputs("\"/>\n      <property name=\"profile\" value=\"", f);
        xml_str(f, rp->profile);
        fprintf(f, "\"/>\n      <property name=\"verdict\" value=\"%s\"/>\n",
                dl_verdict_name(rp->verdict));
        /* the worst error figure, over the numerics rows only */
        double worst = NAN;
        for (size_t j = 0; j < rp->n; j++)
            if (!strcmp(rp->results[j].check, "numerics") && !isnan(rp->results[j].err_pass) &&
                !(rp->results[j].err_pass <= worst))
                worst = rp->results[j].err_pass;
        if (!isnan(worst))
            fprintf(f, "      <property name=\"worst_err_pass\" value=\"%.6g\"/>\n", worst);
        fputs("    </properties>\n", f);
        for (size_t j = 0; j < rp->n; j++) {
            const dl_check_result_t *x = &rp->results[j];
            fputs("    <testcase classname=\"dropless.", f);
            xml_str(f, rp->case_name);
            fprintf(f, "\" name=\"%s.%s\" time=\"0\">", dl_value_name(x->stage), x->check);
            switch (x->verdict) {
            case DL_VERDICT_FAIL:
                fputs("\n      <failure type=\"FAIL\" message=\"", f);
                xml_str(f, x->message);
                fputs("\">", f);
                junit_figures(f, x);
                fputs("</failure>\n    ", f);
                break;
            case DL_VERDICT_SKIP:
                fputs("\n      <skipped message=\"", f);
                xml_str(f, x->message);
                fputs("\"/>\n    ", f);
                break;
            case DL_VERDICT_WARN:
            case DL_VERDICT_INFO:
                fprintf(f, "\n      <system-out>%s: ", dl_verdict_name(x->verdict));
                junit_figures(f, x);
                fputs("</system-out>\n    ", f);
                break;
            default:
                break;
            }
            fputs("</testcase>\n", f);
        }
        fputs("  </testsuite>\n", f);
    }
    fputs("</testsuites>\n", f);
}

int dl_check_write(FILE *f, dl_report_format_t fmt, const dl_check_report_t *const *r, size_t n,
                   unsigned flags)
{
    if (!f || (!r && n))
        return DL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!r[i])
            return DL_EINVAL;
    switch (fmt) {
    case DL_REPORT_TABLE:
        for (size_t i = 0; i < n; i++) {
            if (i)
                fputc('\n', f);
            write_table_one(f, r[i], flags);
        }
        break;
    case DL_REPORT_JSON:
        if (n != 1)
            fputc('[', f);
        for (size_t i = 0; i < n; i++) {
            if (i)
                fputs(",\n", f);
            write_json_one(f, r[i]);
        }
        fputs(n != 1 ? "]\n" : "\n", f);
        break;
    case DL_REPORT_JUNIT:
        write_junit(f, r, n);
        break;
    default:
        return DL_EINVAL;
    }
    return fflush(f) || ferror(f) ? DL_EIO : 0;
}

/* An I/O error says what the system said, the others what they are. */
static const char *why(int rc, int e)
{
    return rc == DL_EIO && e ? strerror(e) : dl_strerror(rc);
}

struct dl_report_out {
    int to_stdout;
    int force;
    dl__outfile_t file;
};

int dl_report_open(const char *path, unsigned flags, dl_report_out_t **out, char *err,
                   size_t errlen)
{
    if (!out)
        return DL_EINVAL;
    *out = NULL;
    dl_report_out_t *o = calloc(1, sizeof *o);
    if (!o) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", path ? path : "report");
        return DL_ENOMEM;
    }
    o->force = (flags & DL_REPORT_FORCE) != 0;
    if (path && !strcmp(path, "-")) {
        o->to_stdout = 1;
    } else {
        int rc = dl__out_begin(&o->file, path, o->force, err, errlen);
        if (rc) {
            free(o);
            return rc;
        }
    }
    *out = o;
    return 0;
}

int dl_report_commit(dl_report_out_t *o, dl_report_format_t fmt, const dl_check_report_t *const *r,
                     size_t n, unsigned flags, char *err, size_t errlen)
{
    if (!o)
        return DL_EINVAL;
    int rc;
    if (o->to_stdout) {
        rc = dl_check_write(stdout, fmt, r, n, flags);
        if (rc && err && errlen)
            snprintf(err, errlen, "standard output: %s", why(rc, errno));
        free(o);
        return rc;
    }
    const char *path = o->file.path;
    int e = 0;
    /* the FILE owns a duplicate: dl__out_commit fsyncs and closes the original */
    int fd = dup(o->file.fd);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        e = errno;
        if (fd >= 0)
            close(fd);
        rc = DL_EIO;
    } else {
        rc = dl_check_write(f, fmt, r, n, flags);
        e = errno;
        if (fclose(f) != 0 && !rc)
            rc = DL_EIO, e = errno;
    }
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot write the report: %s", path, why(rc, e));
        dl__out_abort(&o->file);
    } else {
        rc = dl__out_commit(&o->file, o->force, err, errlen);
    }
    free(o);
    return rc;
}

void dl_report_discard(dl_report_out_t *o)
{
    if (!o)
        return;
    if (!o->to_stdout)
        dl__out_abort(&o->file);
    free(o);
}

int dl_check_save(const char *path, dl_report_format_t fmt, const dl_check_report_t *const *r,
                  size_t n, unsigned flags)
{
    dl_report_out_t *o;
    int rc = dl_report_open(path, flags, &o, NULL, 0);
    return rc ? rc : dl_report_commit(o, fmt, r, n, flags, NULL, 0);
}
