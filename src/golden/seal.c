/* The seal of a golden file: a 512-byte HDF5 user block (which HDF5 itself
 * ignores) holding the SHA-256 of every byte after it. A damaged or
 * truncated golden file is then refused before HDF5 parses it: HDF5 1.10
 * can crash or loop on damaged metadata. The digest is checkable with
 * standard tools: tail -c +513 FILE | sha256sum. */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "golden/golden_priv.h"

/* ------------------------------------------------------------- SHA-256 */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void dl__sha256_init(dl__sha256_t *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->nbuf = 0;
}

void dl__sha256_update(dl__sha256_t *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->len += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take;
        p += take;
        n -= take;
        if (s->nbuf == 64) {
            sha256_block(s->h, s->buf);
            s->nbuf = 0;
        }
    }
    for (; n >= 64; n -= 64, p += 64)
        sha256_block(s->h, p);
    memcpy(s->buf, p, n);
    s->nbuf += n;
}

void dl__sha256_final(dl__sha256_t *s, unsigned char out[32])
{
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, zero = 0;
    dl__sha256_update(s, &pad, 1);
    while (s->nbuf != 56)
        dl__sha256_update(s, &zero, 1);
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
    dl__sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

/* ------------------------------------------------------------- the seal */

#define SEAL_MAGIC "dropless-golden user block 1\n"

/* SHA-256 (hex) and length of the bytes of f from offset 512 to the end. */
static int digest_after_block(FILE *f, char hex[65], uint64_t *len)
{
    if (fseek(f, DL__GOLDEN_USERBLOCK, SEEK_SET) != 0)
        return DL_EIO;
    dl__sha256_t s;
    dl__sha256_init(&s);
    size_t cap = 1 << 20, n;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return DL_ENOMEM;
    while ((n = fread(buf, 1, cap, f)) > 0)
        dl__sha256_update(&s, buf, n);
    int bad = ferror(f);
    free(buf);
    if (bad)
        return DL_EIO;
    unsigned char d[32];
    *len = s.len;
    dl__sha256_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return 0;
}

/* What the user block says while the file is being written: a writer
 * killed before the seal leaves a file that loads as damaged, never as a
 * valid unsealed golden. */
#define INCOMPLETE "incomplete: being written, not sealed yet\n"

int dl__golden_mark_incomplete(int fd, char *err, size_t errlen, const char *path)
{
    char block[DL__GOLDEN_USERBLOCK];
    memset(block, 0, sizeof block);
    snprintf(block, sizeof block, SEAL_MAGIC INCOMPLETE);
    size_t done = 0;
    while (done < sizeof block) {
        ssize_t w = pwrite(fd, block + done, sizeof block - done, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            dl__golden_msg(err, errlen, "%s: cannot write: %s", path,
                           w < 0 ? strerror(errno) : "short write");
            return DL_EIO;
        }
        done += (size_t)w;
    }
    return 0;
}

int dl_golden_seal(const char *path, char *err, size_t errlen)
{
    if (!path)
        return DL_EINVAL;
    FILE *f = fopen(path, "r+b");
    if (!f) {
        dl__golden_msg(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return DL_EIO;
    }
    /* the HDF5 signature must sit right after the user block, not before */
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[DL__GOLDEN_USERBLOCK + 8];
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, sig, 8) == 0 ||
        memcmp(head + DL__GOLDEN_USERBLOCK, sig, 8) != 0) {
        dl__golden_msg(err, errlen, "%s: not an HDF5 file with a %d-byte user block", path,
                       DL__GOLDEN_USERBLOCK);
        fclose(f);
        return DL_EFORMAT;
    }
    char hex[65];
    uint64_t len;
    int rc = digest_after_block(f, hex, &len);
    if (rc) {
        dl__golden_msg(err, errlen, "%s: cannot read it to seal it", path);
        fclose(f);
        return rc;
    }
    char block[DL__GOLDEN_USERBLOCK];
    memset(block, 0, sizeof block);
    snprintf(block, sizeof block,
             SEAL_MAGIC "sha256 %s\nbytes %" PRIu64 "\n"
             "The SHA-256 of this file after its first 512 bytes: tail -c +513 FILE | sha256sum\n",
             hex, len);
    if (fseek(f, 0, SEEK_SET) != 0 || fwrite(block, 1, sizeof block, f) != sizeof block ||
        fflush(f) != 0) {
        dl__golden_msg(err, errlen, "%s: cannot write the seal: %s", path, strerror(errno));
        fclose(f);
        return DL_EIO;
    }
    if (fclose(f) != 0) {
        dl__golden_msg(err, errlen, "%s: cannot write the seal: %s", path, strerror(errno));
        return DL_EIO;
    }
    return 0;
}

int dl__golden_verify_seal(const char *path, int *sealed, char *err, size_t errlen)
{
    *sealed = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        dl__golden_msg(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return DL_EIO;
    }
    char block[DL__GOLDEN_USERBLOCK + 1];
    size_t got = fread(block, 1, DL__GOLDEN_USERBLOCK, f);
    block[got] = '\0';
    if (got < sizeof SEAL_MAGIC - 1 || memcmp(block, SEAL_MAGIC, sizeof SEAL_MAGIC - 1) != 0) {
        fclose(f); /* not sealed: HDF5 decides what it is */
        return 0;
    }
    if (!strncmp(block + sizeof SEAL_MAGIC - 1, INCOMPLETE, sizeof INCOMPLETE - 1)) {
        fclose(f);
        dl__golden_msg(err, errlen, "%s: incomplete file: its writer stopped before sealing it "
                       "(interrupted or killed?)", path);
        return DL_EFORMAT;
    }
    char want[65];
    unsigned long long wlen;
    if (sscanf(block + sizeof SEAL_MAGIC - 1, "sha256 %64[0-9a-f]\nbytes %llu", want, &wlen) != 2 ||
        strlen(want) != 64) {
        fclose(f);
        dl__golden_msg(err, errlen, "%s: damaged file (unreadable seal in the user block)", path);
        return DL_EFORMAT;
    }
    char hex[65];
    uint64_t len;
    int rc = digest_after_block(f, hex, &len);
    fclose(f);
    if (rc) {
        dl__golden_msg(err, errlen, "%s: read error while checking the seal", path);
        return rc;
    }
    if (len != wlen) {
        dl__golden_msg(err, errlen, "%s: damaged file: %" PRIu64 " bytes after the user block, "
                       "the seal says %llu (%s)", path, len, wlen,
                       len < wlen ? "truncated?" : "bytes appended?");
        return DL_EFORMAT;
    }
    if (strcmp(hex, want) != 0) {
        dl__golden_msg(err, errlen, "%s: damaged file: SHA-256 %.16s... differs from the seal's "
                       "%.16s...", path, hex, want);
        return DL_EFORMAT;
    }
    *sealed = 1;
    return 0;
}

int dl__golden_check_seal(const char *path, int strict, int *sealed, char *err, size_t errlen)
{
    int rc = dl__golden_verify_seal(path, sealed, err, errlen);
    if (rc >= 0 || strict || rc != DL_EFORMAT)
        return rc;
    *sealed = -1;
    if (errlen)
        err[0] = '\0';
    return 0;
}
