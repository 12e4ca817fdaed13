/*
 * devicehub's device logins in memory: one entry per device, indexed by
 * device id and by username in two chained hash tables that grow by
 * moving a few buckets per change (no pause to rehash a million
 * entries), and their snapshot file.
 */
#ifndef DEVICEHUB_STORE_H
#define DEVICEHUB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest id, product, username or key, in bytes. */
#define FIELD_MAX 256

enum { F_ID, F_PRODUCT, F_USER, F_KEY, F_COUNT };

/* The most installations (devicehub databases) one broker serves at
 * once; one that holds no login gives its place to a new one. */
#define MAX_INSTALLATIONS 1024

/* One device login, in a single allocation: the strings follow the
 * header, each NUL-terminated, in the order of the F_ constants. */
struct dev {
	struct dev *next[2]; /* chain in the id table [0], the username table [1] */
	uint64_t gen;        /* generation of the last setDevice */
	uint64_t sum;        /* dev_sum of its fields: its share of its installation's digest */
	long long signed_ms; /* the newest signed login's time admitted (ms), 0 if none */
	uint32_t hash[2];    /* of id, of username */
	uint16_t len[F_COUNT];
	uint16_t inst;       /* its installation, an index into store.inst */
	char s[];
};

static inline const char *dev_field(const struct dev *d, int f)
{
	const char *p = d->s;
	for (int i = 0; i < f; i++) p += d->len[i] + 1;
	return p;
}

/* A hash table whose entries chain through next[k]. While it grows, old
 * holds the previous bucket array, drained a few buckets per insert. */
struct table {
	struct dev **b;
	size_t size;   /* power of two */
	struct dev **old;
	size_t old_size;
	size_t drain;  /* old buckets below this are empty */
	size_t count;
	int k;
};

/* An installation: one devicehub database whose logins the store holds.
 * Index 0 is the installation "", the logins of a devicehub that names
 * none (before installations, or an older devicehub): anybody's. */
struct inst {
	char name[FIELD_MAX + 1];
	size_t len;
	uint64_t generation; /* what its setDevice stamps (its beginSync) */
	size_t count;        /* its logins */
	uint64_t digest;     /* sum of their dev_sum, modulo 2^64 */
};

struct store {
	struct table by_id, by_user;
	struct inst inst[MAX_INSTALLATIONS];
	size_t n_inst; /* at least 1 */
	uint64_t changes;    /* bumped by every change: the snapshot is dirty
	                        while it differs from what was saved */
	size_t entry_bytes;  /* allocated for entries */
};

void store_init(struct store *s, size_t expect);
void store_free(struct store *s);
size_t store_count(const struct store *s);
size_t store_memory(const struct store *s);

uint32_t hash_bytes(const char *p, size_t n);
struct dev *store_find_id(const struct store *s, const char *id, size_t n);
struct dev *store_find_user(const struct store *s, const char *user, size_t n);

/* store_inst returns the index of installation name (n bytes), adding it
 * when create is true and there is room; -1 if none. */
int store_inst(struct store *s, const char *name, size_t n, bool create);

/* dev_sum is the first 8 bytes (big-endian) of the MD5 of
 * "id\nproduct\nusername\nkey": what ingest/devauth computes too. */
uint64_t dev_sum(const char *const f[F_COUNT], const size_t len[F_COUNT]);

/* dev_new copies the four fields (lengths already validated). */
struct dev *dev_new(const char *const f[F_COUNT], const size_t len[F_COUNT], uint64_t gen, int inst);
size_t dev_size(const struct dev *d);
/* store_insert adds d, whose id and username must not be held yet;
 * store_remove unlinks d (the caller frees it). Neither bumps changes;
 * both keep d's installation's count and digest. */
void store_insert(struct store *s, struct dev *d);
void store_remove(struct store *s, struct dev *d);
/* Moves up to n buckets of a growing table; false once nothing is left. */
bool store_rehash_step(struct store *s, size_t n);

/* Calls fn for every entry, in no order; fn may not change the store. */
void store_each(const struct store *s, void (*fn)(const struct dev *, void *), void *arg);
/* Removes (and passes to gone, then frees) every entry fn rejects;
 * returns how many. */
size_t store_remove_if(struct store *s, bool (*keep)(const struct dev *, void *), void *arg,
		void (*gone)(const struct dev *, void *), void *gone_arg);

/* check_field returns NULL if s (n bytes) may be the field, else why not;
 * check_installation likewise for an installation id ("" is one). */
const char *check_field(int field, const char *s, size_t n);
const char *check_installation(const char *s, size_t n);

/* Snapshot file. save writes path.tmp.<pid>, fsyncs, renames it over path:
 * 0, or -1 with err set. load replaces an empty store's content: 1
 * loaded, 0 no file, -1 corrupt or unreadable (err set, store empty). */
int snapshot_save(const struct store *s, const char *path, char *err, size_t errlen);
int snapshot_load(struct store *s, const char *path, char *err, size_t errlen);
/* Removes temporary files a killed writer left beside path. */
void snapshot_clean(const char *path);

#endif
