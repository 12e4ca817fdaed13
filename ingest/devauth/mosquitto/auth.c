/*
 * CONNECT: a device's login (its username and key, or JetLinks' signed
 * form); every other login is left to the dynamic-security plugin.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "md5.h"
#include "plugin.h"

bool is_service(const struct plugin *p, const char *user)
{
	if (!user) return false;
	for (int i = 0; i < p->n_service; i++) {
		if (strcmp(user, p->service[i]) == 0) return true;
	}
	return false;
}

int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

bool is_reserved(const struct plugin *p, const char *user)
{
	if (!user || p->n_reserved == 0) return false;
	return bsearch(&user, p->reserved, p->n_reserved, sizeof(char *), cmp_str) != NULL;
}

static bool all_digits(const char *s, size_t n)
{
	if (n == 0) return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9') return false;
	}
	return true;
}

/* The device a client is logged in as: its username, or the secureId of
 * the signed form "secureId|ms", is a device's, and its client id that
 * device's id. Only this plugin admits such a client (BASIC_AUTH below
 * never defers for these usernames). */
const struct dev *client_device(const struct plugin *p, const char *user, const char *cid)
{
	if (!user || !cid || is_reserved(p, user)) return NULL;
	size_t n = strlen(user);
	const struct dev *d = store_find_user(&p->st, user, n);
	if (!d) {
		const char *bar = strrchr(user, '|');
		if (!bar || !all_digits(bar + 1, n - (size_t)(bar + 1 - user))) return NULL;
		d = store_find_user(&p->st, user, (size_t)(bar - user));
		if (!d) return NULL;
	}
	return strcmp(cid, d->s) == 0 ? d : NULL;
}

/* ---- CONNECT ---------------------------------------------------------- */

/* Compares the password with the key in time independent of the key. */
static bool key_equal(const struct dev *d, const char *pw)
{
	const char *key = dev_field(d, F_KEY);
	size_t kl = d->len[F_KEY], pl = strlen(pw);
	unsigned diff = kl != pl;
	for (size_t i = 0; i < pl; i++) diff |= (unsigned char)(pw[i] ^ key[i % kl]);
	return diff == 0;
}

/* A signed login: ms canonical (digits, no leading zero: one time has
 * one spelling, so one signature), within signed_skew of now, and newer
 * than the last one admitted for the device (a signature is used once);
 * *t is its time. */
static bool signed_ok(const struct plugin *p, const struct dev *d, const char *ms, const char *pw, long long *t)
{
	size_t n = strlen(ms);
	if (!all_digits(ms, n) || n > 18 || ms[0] == '0') return false;
	*t = strtoll(ms, NULL, 10);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	long long skew = now > *t ? now - *t : *t - now;
	if (skew > (long long)p->signed_skew * 1000) return false;
	/* Not replayed: newer than the device's last signed login, and than
	 * the broker's start (what a device signed before is not known). */
	if (*t <= d->signed_ms || *t <= p->started_ms) return false;
	if (strlen(pw) != 32) return false;

	struct md5 m;
	unsigned char sum[16];
	md5_init(&m);
	md5_update(&m, dev_field(d, F_USER), d->len[F_USER]);
	md5_update(&m, "|", 1);
	md5_update(&m, ms, n);
	md5_update(&m, "|", 1);
	md5_update(&m, dev_field(d, F_KEY), d->len[F_KEY]);
	md5_final(&m, sum);
	static const char hex[] = "0123456789abcdef";
	unsigned diff = 0;
	for (int i = 0; i < 32; i++) {
		unsigned char c = (unsigned char)pw[i];
		if (c >= 'A' && c <= 'F') c = (unsigned char)(c - 'A' + 'a');
		diff |= c ^ (unsigned char)hex[(sum[i / 2] >> (i % 2 ? 0 : 4)) & 0xf];
	}
	return diff == 0;
}

int on_basic_auth(int event, void *event_data, void *userdata)
{
	(void)event;
	struct plugin *p = userdata;
	struct mosquitto_evt_basic_auth *e = event_data;
	const char *user = e->username;
	if (!user || is_service(p, user) || is_reserved(p, user)) return MOSQ_ERR_PLUGIN_DEFER;
	const char *cid = mosquitto_client_id(e->client);
	size_t n = strlen(user);
	struct dev *d = store_find_user(&p->st, user, n);
	if (d) {
		if (cid && strcmp(cid, d->s) == 0 && e->password && key_equal(d, e->password)) {
			return MOSQ_ERR_SUCCESS;
		}
		mosquitto_log_printf(MOSQ_LOG_DEBUG, LOG_PREFIX "refused login of device %s (client id %s)",
				d->s, cid ? cid : "");
		return MOSQ_ERR_AUTH;
	}
	const char *bar = strrchr(user, '|');
	if (!bar) return MOSQ_ERR_PLUGIN_DEFER;
	d = store_find_user(&p->st, user, (size_t)(bar - user));
	if (!d) return MOSQ_ERR_PLUGIN_DEFER;
	long long t;
	if (cid && strcmp(cid, d->s) == 0 && e->password && signed_ok(p, d, bar + 1, e->password, &t)) {
		d->signed_ms = t;
		return MOSQ_ERR_SUCCESS;
	}
	mosquitto_log_printf(MOSQ_LOG_DEBUG, LOG_PREFIX "refused signed login of device %s (client id %s)",
			d->s, cid ? cid : "");
	return MOSQ_ERR_AUTH;
}

