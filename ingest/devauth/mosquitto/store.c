/*
 * The device login store and its snapshot file (see store.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "md5.h"
#include "store.h"

#define MIN_BUCKETS 1024

/* FNV-1a, 64-bit, folded to 32. Keys come from devicehub (inserts) or
 * are looked up only (logins), so flooding a chain is not a concern. */
uint32_t hash_bytes(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)p[i];
		h *= 0x100000001b3ULL;
	}
	return (uint32_t)(h ^ (h >> 32));
}

static size_t pow2_at_least(size_t n)
{
	size_t p = MIN_BUCKETS;
	while (p < n) p <<= 1;
	return p;
}

static struct dev **buckets(size_t n)
{
	struct dev **b = calloc(n, sizeof(*b));
	if (!b) abort(); /* as the broker does when out of memory at this size */
	return b;
}

static void table_init(struct table *t, int k, size_t expect)
{
	memset(t, 0, sizeof(*t));
	t->k = k;
	t->size = pow2_at_least(expect);
	t->b = buckets(t->size);
}

static void table_free(struct table *t)
{
	free(t->b);
	free(t->old);
	memset(t, 0, sizeof(*t));
}

static const char *key_of(const struct dev *d, int k)
{
	return k == 0 ? d->s : dev_field(d, F_USER);
}

static struct dev *table_find(const struct table *t, uint32_t h, const char *key, size_t n)
{
	int k = t->k;
	int f = k == 0 ? F_ID : F_USER;
	for (struct dev *d = t->b[h & (t->size - 1)]; d; d = d->next[k]) {
		if (d->hash[k] == h && d->len[f] == n && memcmp(key_of(d, k), key, n) == 0) return d;
	}
	if (t->old) {
		size_t i = h & (t->old_size - 1);
		if (i >= t->drain) {
			for (struct dev *d = t->old[i]; d; d = d->next[k]) {
				if (d->hash[k] == h && d->len[f] == n && memcmp(key_of(d, k), key, n) == 0) return d;
			}
		}
	}
	return NULL;
}

/* Moves up to n old buckets into the new array. */
static bool table_drain(struct table *t, size_t n)
{
	int k = t->k;
	if (!t->old) return false;
	for (; n > 0 && t->drain < t->old_size; n--, t->drain++) {
		struct dev *d = t->old[t->drain];
		while (d) {
			struct dev *next = d->next[k];
			size_t i = d->hash[k] & (t->size - 1);
			d->next[k] = t->b[i];
			t->b[i] = d;
			d = next;
		}
		t->old[t->drain] = NULL;
	}
	if (t->drain == t->old_size) {
		free(t->old);
		t->old = NULL;
		t->old_size = t->drain = 0;
		return false;
	}
	return true;
}

static void table_insert(struct table *t, struct dev *d)
{
	int k = t->k;
	if (t->old) {
		table_drain(t, 64);
	} else if (t->count >= t->size) {
		/* Load factor 1: double, and move the old buckets over the next
		 * inserts (64 per insert, done long before the next doubling). */
		t->old = t->b;
		t->old_size = t->size;
		t->drain = 0;
		t->size *= 2;
		t->b = buckets(t->size);
	}
	size_t i = d->hash[k] & (t->size - 1);
	d->next[k] = t->b[i];
	t->b[i] = d;
	t->count++;
}

static void table_remove(struct table *t, struct dev *d)
{
	int k = t->k;
	struct dev **pp = &t->b[d->hash[k] & (t->size - 1)];
	for (; *pp; pp = &(*pp)->next[k]) {
		if (*pp == d) goto found;
	}
	if (t->old) {
		pp = &t->old[d->hash[k] & (t->old_size - 1)];
		for (; *pp; pp = &(*pp)->next[k]) {
			if (*pp == d) goto found;
		}
	}
	return;
found:
	*pp = d->next[k];
	d->next[k] = NULL;
	t->count--;
}

static size_t table_memory(const struct table *t)
{
	return (t->size + t->old_size) * sizeof(struct dev *);
}

void store_init(struct store *s, size_t expect)
{
	memset(s, 0, sizeof(*s));
	table_init(&s->by_id, 0, expect);
	table_init(&s->by_user, 1, expect);
	s->n_inst = 1; /* "" */
}

int store_inst(struct store *s, const char *name, size_t n, bool create)
{
	for (size_t i = 0; i < s->n_inst; i++) {
		if (s->inst[i].len == n && memcmp(s->inst[i].name, name, n) == 0) return (int)i;
	}
	if (!create || n > FIELD_MAX) return -1;
	size_t i = s->n_inst;
	if (i == MAX_INSTALLATIONS) {
		/* Full: the place of one that holds no login (a test's, a
		 * database since dropped). */
		for (i = 1; i < s->n_inst && s->inst[i].count > 0; i++) {
		}
		if (i == s->n_inst) return -1;
	} else {
		s->n_inst++;
	}
	struct inst *in = &s->inst[i];
	memset(in, 0, sizeof(*in));
	memcpy(in->name, name, n);
	in->len = n;
	return (int)i;
}

static void free_dev(const struct dev *d, void *arg)
{
	(void)arg;
	free((void *)d);
}

void store_free(struct store *s)
{
	store_each(s, free_dev, NULL);
	table_free(&s->by_id);
	table_free(&s->by_user);
	s->entry_bytes = 0;
}

size_t store_count(const struct store *s) { return s->by_id.count; }

size_t store_memory(const struct store *s)
{
	return s->entry_bytes + table_memory(&s->by_id) + table_memory(&s->by_user);
}

struct dev *store_find_id(const struct store *s, const char *id, size_t n)
{
	return table_find(&s->by_id, hash_bytes(id, n), id, n);
}

struct dev *store_find_user(const struct store *s, const char *user, size_t n)
{
	return table_find(&s->by_user, hash_bytes(user, n), user, n);
}

uint64_t dev_sum(const char *const f[F_COUNT], const size_t len[F_COUNT])
{
	struct md5 m;
	unsigned char sum[16];
	md5_init(&m);
	for (int i = 0; i < F_COUNT; i++) {
		if (i) md5_update(&m, "\n", 1);
		md5_update(&m, f[i], len[i]);
	}
	md5_final(&m, sum);
	uint64_t v = 0;
	for (int i = 0; i < 8; i++) v = v << 8 | sum[i];
	return v;
}

struct dev *dev_new(const char *const f[F_COUNT], const size_t len[F_COUNT], uint64_t gen, int inst)
{
	size_t total = sizeof(struct dev);
	for (int i = 0; i < F_COUNT; i++) total += len[i] + 1;
	struct dev *d = malloc(total);
	if (!d) return NULL;
	d->next[0] = d->next[1] = NULL;
	d->gen = gen;
	d->sum = dev_sum(f, len);
	d->signed_ms = 0;
	d->inst = (uint16_t)inst;
	char *p = d->s;
	for (int i = 0; i < F_COUNT; i++) {
		d->len[i] = (uint16_t)len[i];
		memcpy(p, f[i], len[i]);
		p[len[i]] = '\0';
		p += len[i] + 1;
	}
	d->hash[0] = hash_bytes(d->s, len[F_ID]);
	d->hash[1] = hash_bytes(dev_field(d, F_USER), len[F_USER]);
	return d;
}

size_t dev_size(const struct dev *d)
{
	return malloc_usable_size((void *)d);
}

void store_insert(struct store *s, struct dev *d)
{
	table_insert(&s->by_id, d);
	table_insert(&s->by_user, d);
	s->entry_bytes += dev_size(d);
	s->inst[d->inst].count++;
	s->inst[d->inst].digest += d->sum;
}

static void uncount(struct store *s, const struct dev *d)
{
	s->entry_bytes -= dev_size(d);
	s->inst[d->inst].count--;
	s->inst[d->inst].digest -= d->sum;
}

void store_remove(struct store *s, struct dev *d)
{
	table_remove(&s->by_id, d);
	table_remove(&s->by_user, d);
	uncount(s, d);
}

bool store_rehash_step(struct store *s, size_t n)
{
	bool a = table_drain(&s->by_id, n);
	bool b = table_drain(&s->by_user, n);
	return a || b;
}

void store_each(const struct store *s, void (*fn)(const struct dev *, void *), void *arg)
{
	const struct table *t = &s->by_id;
	for (size_t i = 0; i < t->size; i++) {
		for (struct dev *d = t->b[i], *next; d; d = next) {
			next = d->next[0];
			fn(d, arg);
		}
	}
	for (size_t i = t->drain; t->old && i < t->old_size; i++) {
		for (struct dev *d = t->old[i], *next; d; d = next) {
			next = d->next[0];
			fn(d, arg);
		}
	}
}

static size_t remove_chain(struct store *s, struct dev **pp, bool (*keep)(const struct dev *, void *),
		void *arg, void (*gone)(const struct dev *, void *), void *gone_arg)
{
	size_t n = 0;
	while (*pp) {
		struct dev *d = *pp;
		if (keep(d, arg)) {
			pp = &d->next[0];
			continue;
		}
		*pp = d->next[0];
		s->by_id.count--;
		table_remove(&s->by_user, d);
		uncount(s, d);
		if (gone) gone(d, gone_arg);
		free(d);
		n++;
	}
	return n;
}

size_t store_remove_if(struct store *s, bool (*keep)(const struct dev *, void *), void *arg,
		void (*gone)(const struct dev *, void *), void *gone_arg)
{
	struct table *t = &s->by_id;
	size_t n = 0;
	for (size_t i = 0; i < t->size; i++) n += remove_chain(s, &t->b[i], keep, arg, gone, gone_arg);
	for (size_t i = t->drain; t->old && i < t->old_size; i++) {
		n += remove_chain(s, &t->old[i], keep, arg, gone, gone_arg);
	}
	return n;
}

const char *check_field(int field, const char *s, size_t n)
{
	if (n == 0) return "empty";
	if (n > FIELD_MAX) return "longer than 256 bytes";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f) return "holds a control character";
		if ((field == F_ID || field == F_PRODUCT) && (c == '/' || c == '+' || c == '#')) {
			return "holds '/', '+' or '#'";
		}
	}
	return NULL;
}

const char *check_installation(const char *s, size_t n)
{
	return n == 0 ? NULL : check_field(F_ID, s, n);
}

/* ---- snapshot ---------------------------------------------------------
 *
 * A text file, mode 0600 (it holds keys), written as <path>.tmp.<pid>
 * and renamed over <path>:
 *
 *	devicehub-auth snapshot 2
 *	installations <K>
 *	<generation>\t<installation id>                      K lines, index 0 first ("")
 *	count <N>
 *	<generation>\t<index>\t<id>\t<product>\t<username>\t<key>     N lines
 *	end
 *
 * No field holds a control character (check_field), so tabs and newlines
 * delimit. A missing end line or another count is a truncated file.
 * Version 1 (before installations) had "generation <G>" instead of the
 * installations, and no index: it loads as installation "".
 */

#define SNAPSHOT_MAGIC "devicehub-auth snapshot 2"
#define SNAPSHOT_MAGIC_1 "devicehub-auth snapshot 1"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

struct writer {
	int fd;
	char *buf;
	size_t n, cap;
	int err; /* errno of the first failure */
};

static void w_flush(struct writer *w)
{
	size_t off = 0;
	while (off < w->n && !w->err) {
		ssize_t r = write(w->fd, w->buf + off, w->n - off);
		if (r < 0) {
			if (errno == EINTR) continue;
			w->err = errno;
			break;
		}
		off += (size_t)r;
	}
	w->n = 0;
}

static void w_put(struct writer *w, const char *p, size_t n)
{
	if (w->cap - w->n < n) w_flush(w);
	memcpy(w->buf + w->n, p, n); /* n <= a line's bound < cap */
	w->n += n;
}

static void w_u64(struct writer *w, uint64_t v)
{
	char tmp[24];
	int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v);
	w_put(w, tmp, (size_t)n);
}

static void write_dev(const struct dev *d, void *arg)
{
	struct writer *w = arg;
	w_u64(w, d->gen);
	w_put(w, "\t", 1);
	w_u64(w, d->inst);
	const char *p = d->s;
	for (int i = 0; i < F_COUNT; i++) {
		w_put(w, "\t", 1);
		w_put(w, p, d->len[i]);
		p += d->len[i] + 1;
	}
	w_put(w, "\n", 1);
}

static int fsync_dir(const char *path)
{
	char *copy = strdup(path);
	if (!copy) return -1;
	int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(copy);
	if (fd < 0) return -1;
	int rc = fsync(fd);
	close(fd);
	return rc;
}

int snapshot_save(const struct store *s, const char *path, char *err, size_t errlen)
{
	/* The writer's own temporary name: a broker restarted after SIGKILL
	 * may save while the killed one's writer still runs. */
	size_t tlen = strlen(path) + 32;
	char *tmp = malloc(tlen);
	if (!tmp) {
		set_err(err, errlen, "out of memory");
		return -1;
	}
	snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
	struct writer w = {.cap = 1 << 20};
	w.buf = malloc(w.cap);
	w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (!w.buf || w.fd < 0) {
		set_err(err, errlen, "%s: %s", tmp, w.buf ? strerror(errno) : "out of memory");
		goto fail;
	}
	if (fchmod(w.fd, 0600) < 0) w.err = errno; /* an old tmp file keeps its mode */
	char head[128];
	int n = snprintf(head, sizeof(head), SNAPSHOT_MAGIC "\ninstallations %zu\n", s->n_inst);
	w_put(&w, head, (size_t)n);
	for (size_t i = 0; i < s->n_inst; i++) {
		w_u64(&w, s->inst[i].generation);
		w_put(&w, "\t", 1);
		w_put(&w, s->inst[i].name, s->inst[i].len);
		w_put(&w, "\n", 1);
	}
	n = snprintf(head, sizeof(head), "count %zu\n", store_count(s));
	w_put(&w, head, (size_t)n);
	store_each(s, write_dev, &w);
	w_put(&w, "end\n", 4);
	w_flush(&w);
	if (!w.err && fsync(w.fd) < 0) w.err = errno;
	if (close(w.fd) < 0 && !w.err) w.err = errno;
	w.fd = -1;
	if (w.err) {
		set_err(err, errlen, "writing %s: %s", tmp, strerror(w.err));
		goto fail;
	}
	if (rename(tmp, path) < 0) {
		set_err(err, errlen, "renaming %s: %s", tmp, strerror(errno));
		goto fail;
	}
	if (fsync_dir(path) < 0) {
		set_err(err, errlen, "syncing the directory of %s: %s", path, strerror(errno));
		free(tmp);
		free(w.buf);
		return -1;
	}
	free(tmp);
	free(w.buf);
	return 0;
fail:
	if (w.fd >= 0) close(w.fd);
	unlink(tmp);
	free(tmp);
	free(w.buf);
	return -1;
}

/* A line reader over the snapshot file: a megabyte at a time, so that
 * loading does not hold the whole file besides the entries it makes. */
struct reader {
	int fd;
	char *buf;
	size_t cap, start, end;
	bool eof;
	const char *err; /* why the last NULL, if not the end of the file */
};

/* r_line returns the next line without its newline (NUL-terminated, valid
 * until the next call), or NULL at the end of the file, on a last line
 * without newline, a line over the buffer or a read error (err set). */
static char *r_line(struct reader *r, size_t *n)
{
	for (;;) {
		char *nl = memchr(r->buf + r->start, '\n', r->end - r->start);
		if (nl) {
			char *line = r->buf + r->start;
			*n = (size_t)(nl - line);
			*nl = '\0';
			r->start += *n + 1;
			return line;
		}
		if (r->eof) {
			if (r->end > r->start) r->err = "a last line without newline";
			return NULL;
		}
		if (r->start > 0) {
			memmove(r->buf, r->buf + r->start, r->end - r->start);
			r->end -= r->start;
			r->start = 0;
		}
		if (r->end == r->cap) {
			r->err = "a line too long";
			return NULL;
		}
		ssize_t got = read(r->fd, r->buf + r->end, r->cap - r->end);
		if (got < 0) {
			if (errno == EINTR) continue;
			r->err = strerror(errno);
			return NULL;
		}
		if (got == 0) r->eof = true;
		r->end += (size_t)got;
	}
}

static bool parse_u64(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	if (n == 0 || n > 19) return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9') return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return true;
}

static bool header_u64(struct reader *r, const char *name, uint64_t *out)
{
	size_t n, k = strlen(name);
	char *line = r_line(r, &n);
	return line && n > k + 1 && memcmp(line, name, k) == 0 && line[k] == ' ' &&
	       parse_u64(line + k + 1, n - k - 1, out);
}

void snapshot_clean(const char *path)
{
	size_t n = strlen(path) + 8;
	char *pattern = malloc(n);
	glob_t g;
	if (!pattern) return;
	snprintf(pattern, n, "%s.tmp.*", path);
	if (glob(pattern, GLOB_NOSORT, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
		globfree(&g);
	}
	free(pattern);
}

int snapshot_load(struct store *s, const char *path, char *err, size_t errlen)
{
	struct reader r = {.cap = 1 << 20};
	r.fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r.fd < 0) {
		if (errno == ENOENT) return 0;
		set_err(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(r.fd, &st) < 0) {
		set_err(err, errlen, "%s: %s", path, strerror(errno));
		close(r.fd);
		return -1;
	}
	r.buf = malloc(r.cap);
	if (!r.buf) {
		set_err(err, errlen, "%s: out of memory", path);
		close(r.fd);
		return -1;
	}

	char *line;
	size_t n, lineno = 3;
	uint64_t gen = 0, count, n_inst = 1;
	struct inst *insts = calloc(MAX_INSTALLATIONS, sizeof(struct inst));
	if (!insts) {
		set_err(err, errlen, "%s: out of memory", path);
		close(r.fd);
		free(r.buf);
		return -1;
	}
	line = r_line(&r, &n);
	bool v1 = line && strcmp(line, SNAPSHOT_MAGIC_1) == 0;
	if (!line || (!v1 && strcmp(line, SNAPSHOT_MAGIC) != 0)) {
		set_err(err, errlen, "%s: not a devicehub-auth snapshot (version 1 or 2)", path);
		goto corrupt;
	}
	if (v1) {
		if (!header_u64(&r, "generation", &gen)) {
			set_err(err, errlen, "%s: bad header", path);
			goto corrupt;
		}
		insts[0].generation = gen;
	} else {
		if (!header_u64(&r, "installations", &n_inst) || n_inst < 1 || n_inst > MAX_INSTALLATIONS) {
			set_err(err, errlen, "%s: bad header", path);
			goto corrupt;
		}
		for (uint64_t i = 0; i < n_inst; i++) {
			lineno++;
			line = r_line(&r, &n);
			char *tab = line ? memchr(line, '\t', n) : NULL;
			if (!tab || !parse_u64(line, (size_t)(tab - line), &insts[i].generation)) goto bad_line;
			size_t nl = n - (size_t)(tab + 1 - line);
			if (check_installation(tab + 1, nl) || (i == 0) != (nl == 0)) goto bad_line;
			memcpy(insts[i].name, tab + 1, nl);
			insts[i].len = nl;
		}
	}
	if (!header_u64(&r, "count", &count)) {
		set_err(err, errlen, "%s: bad header", path);
		goto corrupt;
	}
	if (count > (uint64_t)st.st_size / 10) { /* an entry line is at least "0\ta\tb\tc\td\n" */
		set_err(err, errlen, "%s: count %llu does not fit in %lld bytes", path,
				(unsigned long long)count, (long long)st.st_size);
		goto corrupt;
	}
	store_free(s);
	store_init(s, (size_t)count);
	memcpy(s->inst, insts, MAX_INSTALLATIONS * sizeof(struct inst));
	s->n_inst = (size_t)n_inst;
	for (uint64_t i = 0; i < count; i++) {
		const char *f[F_COUNT];
		size_t len[F_COUNT];
		uint64_t dgen, dinst = 0;
		lineno++;
		line = r_line(&r, &n);
		if (!line) {
			set_err(err, errlen, "%s: %llu of %llu entries, then %s", path, (unsigned long long)i,
					(unsigned long long)count, r.err ? r.err : "the end (truncated)");
			goto corrupt;
		}
		char *tab = memchr(line, '\t', n);
		if (!tab || !parse_u64(line, (size_t)(tab - line), &dgen)) goto bad_line;
		char *q = tab + 1, *lend = line + n;
		if (!v1) {
			tab = memchr(q, '\t', (size_t)(lend - q));
			if (!tab || !parse_u64(q, (size_t)(tab - q), &dinst) || dinst >= n_inst) goto bad_line;
			q = tab + 1;
		}
		for (int k = 0; k < F_COUNT; k++) {
			char *t = k < F_COUNT - 1 ? memchr(q, '\t', (size_t)(lend - q)) : lend;
			if (!t) goto bad_line;
			f[k] = q;
			len[k] = (size_t)(t - q);
			if (check_field(k, q, len[k])) goto bad_line;
			q = t + 1;
		}
		if (store_find_id(s, f[F_ID], len[F_ID]) || store_find_user(s, f[F_USER], len[F_USER])) {
			set_err(err, errlen, "%s: line %zu: id or username twice", path, lineno);
			goto corrupt;
		}
		struct dev *d = dev_new(f, len, dgen, (int)dinst);
		if (!d) {
			set_err(err, errlen, "%s: out of memory", path);
			goto corrupt;
		}
		store_insert(s, d);
	}
	line = r_line(&r, &n);
	if (!line || strcmp(line, "end") != 0 || r_line(&r, &n) || r.err) {
		set_err(err, errlen, "%s: no end line after %llu entries", path, (unsigned long long)count);
		goto corrupt;
	}
	close(r.fd);
	free(r.buf);
	free(insts);
	return 1;
bad_line:
	set_err(err, errlen, "%s: line %zu is not an entry", path, lineno);
corrupt:
	close(r.fd);
	free(r.buf);
	free(insts);
	store_free(s);
	store_init(s, 0);
	return -1;
}
