/*
 * devicehub's Mosquitto plugin (interface version 5, Mosquitto 2.0.11 and
 * later): device logins in memory, fed by devicehub over a control topic.
 *
 * Loaded before the dynamic-security plugin (per_listener_settings false),
 * it answers first for devices and defers everything else:
 *
 *  - CONNECT: a device logs in with client id = its id, username = its
 *    username (secureId), password = its key; or in JetLinks' signed form,
 *    username "secureId|<epoch ms>", password the hex MD5 of
 *    "secureId|<epoch ms>|key", the time within signed_skew of now, in
 *    canonical digits (no leading zero) and newer than the last signed
 *    login admitted for that device (no replay). Unknown usernames,
 *    service logins and reserved logins (setReserved: dynsec's own
 *    clients) are left to dynsec.
 *  - PUBLISH/SUBSCRIBE/delivery of a device: only below /{product}/{id}/,
 *    publishing only its uplinks, never retained, subscribing to and
 *    receiving only its downlinks (a device that took its own uplinks
 *    could fill the broker's queues with them). Everything else of a
 *    device is refused, not deferred: dynsec never widens a device's rights.
 *  - Logins belong to an installation (one devicehub database): a full
 *    sync removes only its own, and a login another installation holds is
 *    never taken over.
 *  - $CONTROL/devicehub-auth/v1: the control protocol of
 *    ingest/devauth/doc.go, only from a service login.
 *  - A snapshot file, written in a forked child every snapshot_interval
 *    seconds when something changed and at shutdown, loaded at start.
 *
 * Options (plugin_opt_<name> after this plugin's line):
 *   service_users      comma-separated service logins (default devicehub)
 *   snapshot_file      path of the snapshot (default: none)
 *   snapshot_interval  seconds between snapshot checks (default 300)
 *   signed_skew        seconds a signed login's time may be off (default 60)
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#include "md5.h"
#include "store.h"

#define LOG_PREFIX "devicehub-auth: "
#define CONTROL_TOPIC "$CONTROL/devicehub-auth/v1"
#define RESPONSE_TOPIC CONTROL_TOPIC "/response"
#define OUR_TOPICS "$CONTROL/devicehub-auth/"
#define MAX_CONTROL_PAYLOAD (1u << 20)
#define MAX_SERVICE_USERS 16
#define MAX_GENERATION 9007199254740992.0 /* 2^53: exact in a JSON number */
/* Built with -fvisibility=hidden: only the entry points are exported. */
#define EXPORT __attribute__((visibility("default")))

static struct {
	mosquitto_plugin_id_t *pid;
	struct store st;
	char *service[MAX_SERVICE_USERS];
	int n_service;
	char *snapshot_file;
	long snapshot_interval; /* s */
	long signed_skew;       /* s */
	/* Usernames no device may have: dynsec's clients (setReserved),
	 * sorted for bsearch. */
	char **reserved;
	size_t n_reserved;

	/* snapshot state */
	uint64_t saved_changes; /* st.changes when the file on disk was taken */
	double next_check;      /* monotonic s */
	pid_t child;            /* background writer, 0 if none */
	int child_pipe;         /* its error message */
	uint64_t child_changes;
	size_t child_devices;
	double child_started;
	double last_fork_ms;
	double last_save_ms;
	time_t last_save_time;
	size_t last_save_devices;
	char last_error[320];
	size_t loaded_devices;
	double load_ms;
} g;

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool is_service(const char *user)
{
	if (!user) return false;
	for (int i = 0; i < g.n_service; i++) {
		if (strcmp(user, g.service[i]) == 0) return true;
	}
	return false;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_reserved(const char *user)
{
	if (!user || g.n_reserved == 0) return false;
	return bsearch(&user, g.reserved, g.n_reserved, sizeof(char *), cmp_str) != NULL;
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
static const struct dev *client_device(const char *user, const char *cid)
{
	if (!user || !cid || is_reserved(user)) return NULL;
	size_t n = strlen(user);
	const struct dev *d = store_find_user(&g.st, user, n);
	if (!d) {
		const char *bar = strrchr(user, '|');
		if (!bar || !all_digits(bar + 1, n - (size_t)(bar + 1 - user))) return NULL;
		d = store_find_user(&g.st, user, (size_t)(bar - user));
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
static bool signed_ok(const struct dev *d, const char *ms, const char *pw, long long *t)
{
	size_t n = strlen(ms);
	if (!all_digits(ms, n) || n > 18 || ms[0] == '0') return false;
	*t = strtoll(ms, NULL, 10);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	long long skew = now > *t ? now - *t : *t - now;
	if (skew > (long long)g.signed_skew * 1000) return false;
	if (*t <= d->signed_ms) return false;
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

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	struct mosquitto_evt_basic_auth *e = event_data;
	const char *user = e->username;
	if (!user || is_service(user) || is_reserved(user)) return MOSQ_ERR_PLUGIN_DEFER;
	const char *cid = mosquitto_client_id(e->client);
	size_t n = strlen(user);
	struct dev *d = store_find_user(&g.st, user, n);
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
	d = store_find_user(&g.st, user, (size_t)(bar - user));
	if (!d) return MOSQ_ERR_PLUGIN_DEFER;
	long long t;
	if (cid && strcmp(cid, d->s) == 0 && e->password && signed_ok(d, bar + 1, e->password, &t)) {
		d->signed_ms = t;
		return MOSQ_ERR_SUCCESS;
	}
	mosquitto_log_printf(MOSQ_LOG_DEBUG, LOG_PREFIX "refused signed login of device %s (client id %s)",
			d->s, cid ? cid : "");
	return MOSQ_ERR_AUTH;
}

/* ---- topic rights (every PUBLISH, SUBSCRIBE and delivery) -------------- */

/* The length of the device's prefix /{product}/{id}/ at the start of
 * topic, or 0 when topic does not start with it. */
static size_t prefix_len(const struct dev *d, const char *topic)
{
	const char *prod = dev_field(d, F_PRODUCT);
	size_t pl = d->len[F_PRODUCT], il = d->len[F_ID];
	if (topic[0] != '/' || strncmp(topic + 1, prod, pl) != 0 || topic[1 + pl] != '/' ||
			strncmp(topic + 2 + pl, d->s, il) != 0 || topic[2 + pl + il] != '/') {
		return 0;
	}
	return 3 + pl + il;
}

/* The uplinks below a device's prefix (README "Devices over MQTT";
 * ingest.ParseTopic): event ids are one non-empty level. */
static bool is_uplink(const char *s)
{
	static const char *const fixed[] = {
		"properties/report", "online", "offline", "properties/read/reply", "function/invoke/reply",
	};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		if (strcmp(s, fixed[i]) == 0) return true;
	}
	return strncmp(s, "event/", 6) == 0 && s[6] != '\0' && strchr(s + 6, '/') == NULL;
}

/* The downlinks below a device's prefix: the only topics a device may
 * subscribe to and receive. The one list of them: a new downlink (device
 * shadow, firmware) is added here. */
static bool is_downlink(const char *s)
{
	static const char *const downlinks[] = {
		"properties/read", "properties/write", "function/invoke", /* ingest/wire, JetLinks */
		"shadow/delta", "shadow/get/reply",                       /* device shadow */
		"firmware/upgrade",                                       /* firmware */
	};
	for (size_t i = 0; i < sizeof(downlinks) / sizeof(downlinks[0]); i++) {
		if (strcmp(s, downlinks[i]) == 0) return true;
	}
	return false;
}

/* A subscription filter below a device's prefix that may match a
 * downlink: a downlink itself, or a filter with wildcards (what it
 * delivers is checked message by message, MOSQ_ACL_READ). */
static bool may_subscribe(const char *s)
{
	return is_downlink(s) || strchr(s, '+') != NULL || strchr(s, '#') != NULL;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	struct mosquitto_evt_acl_check *e = event_data;
	const char *topic = e->topic;
	const char *user = mosquitto_client_username(e->client);
	if (!topic) return MOSQ_ERR_ACL_DENIED;
	if (is_service(user)) {
		if (e->access == MOSQ_ACL_WRITE ? strcmp(topic, CONTROL_TOPIC) == 0
		                                : strcmp(topic, RESPONSE_TOPIC) == 0) {
			return MOSQ_ERR_SUCCESS;
		}
		return MOSQ_ERR_PLUGIN_DEFER;
	}
	const struct dev *d = client_device(user, mosquitto_client_id(e->client));
	if (!d) {
		/* Only service logins use our control topics, whatever dynsec says. */
		return strncmp(topic, OUR_TOPICS, sizeof(OUR_TOPICS) - 1) == 0 ? MOSQ_ERR_ACL_DENIED
		                                                                : MOSQ_ERR_PLUGIN_DEFER;
	}
	size_t n = prefix_len(d, topic);
	if (n == 0) return MOSQ_ERR_ACL_DENIED;
	switch (e->access) {
	case MOSQ_ACL_WRITE:
		/* Retained uplinks are refused: a device's state is not replayed
		 * to whoever subscribes later. */
		return !e->retain && is_uplink(topic + n) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
	case MOSQ_ACL_READ:
		return is_downlink(topic + n) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
	case MOSQ_ACL_SUBSCRIBE:
		return may_subscribe(topic + n) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
	case MOSQ_ACL_UNSUBSCRIBE:
		return MOSQ_ERR_SUCCESS;
	default:
		return MOSQ_ERR_ACL_DENIED;
	}
}

/* ---- control ----------------------------------------------------------- */

static void reply(cJSON *responses, const char *command, const char *error, const char *corr, cJSON *data)
{
	cJSON *r = cJSON_CreateObject();
	if (!r) {
		cJSON_Delete(data);
		return;
	}
	cJSON_AddStringToObject(r, "command", command);
	if (error) cJSON_AddStringToObject(r, "error", error);
	if (corr) cJSON_AddStringToObject(r, "correlationData", corr);
	if (data) cJSON_AddItemToObject(r, "data", data);
	cJSON_AddItemToArray(responses, r);
}

static void kick(const char *id)
{
	mosquitto_kick_client_by_clientid(id, false);
}

/* A string field of a command, validated; NULL with *why set if not. */
static const char *field(cJSON *cmd, const char *name, int kind, size_t *len, char *why, size_t whylen)
{
	cJSON *j = cJSON_GetObjectItemCaseSensitive(cmd, name);
	if (!cJSON_IsString(j) || !j->valuestring) {
		snprintf(why, whylen, "missing or invalid %s", name);
		return NULL;
	}
	*len = strlen(j->valuestring);
	const char *bad = check_field(kind, j->valuestring, *len);
	if (bad) {
		snprintf(why, whylen, "invalid %s: %s", name, bad);
		return NULL;
	}
	return j->valuestring;
}

static bool generation(cJSON *cmd, uint64_t *out)
{
	cJSON *j = cJSON_GetObjectItemCaseSensitive(cmd, "generation");
	if (!cJSON_IsNumber(j)) return false;
	double v = j->valuedouble;
	if (!(v >= 0 && v <= MAX_GENERATION) || v != (double)(uint64_t)v) return false;
	*out = (uint64_t)v;
	return true;
}

/* The installation a command names ("installation", absent: "", an older
 * devicehub's); its index, or -1 with *why set. create adds it. */
static int installation(cJSON *cmd, bool create, char *why, size_t whylen)
{
	cJSON *j = cJSON_GetObjectItemCaseSensitive(cmd, "installation");
	if (!j) return 0;
	if (!cJSON_IsString(j) || !j->valuestring) {
		snprintf(why, whylen, "invalid installation (not a string)");
		return -1;
	}
	size_t n = strlen(j->valuestring);
	const char *bad = check_installation(j->valuestring, n);
	if (bad) {
		snprintf(why, whylen, "invalid installation: %s", bad);
		return -1;
	}
	int i = store_inst(&g.st, j->valuestring, n, create);
	if (i < 0 && create) snprintf(why, whylen, "more than %d installations", MAX_INSTALLATIONS);
	if (i < 0 && !create) i = -2; /* unknown: holds nothing */
	return i;
}

static const char *inst_name(int i)
{
	return g.st.inst[i].name;
}

/* Whether installation me may change d: its own, or one of nobody's
 * (installation "", before installations). */
static bool owns(int me, const struct dev *d)
{
	return d->inst == me || d->inst == 0;
}

/* What a command removed of its installation's logins, for the leader's
 * digest (ingest/devauth): data {"removed":N,"removedDigest":"<16 hex>"}. */
static cJSON *removed_data(size_t n, uint64_t sum)
{
	if (n == 0) return NULL;
	char hex[17];
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)sum);
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "removed", (double)n);
	cJSON_AddStringToObject(data, "removedDigest", hex);
	return data;
}

static void set_device(cJSON *rs, cJSON *cmd, const char *corr)
{
	static const char *const names[F_COUNT] = {"id", "product", "username", "key"};
	const char *f[F_COUNT];
	size_t len[F_COUNT];
	char why[FIELD_MAX + 128];
	for (int i = 0; i < F_COUNT; i++) {
		f[i] = field(cmd, names[i], i, &len[i], why, sizeof(why));
		if (!f[i]) {
			reply(rs, "setDevice", why, corr, NULL);
			return;
		}
	}
	if (is_service(f[F_USER])) {
		reply(rs, "setDevice", "username is a service login", corr, NULL);
		return;
	}
	if (is_reserved(f[F_USER])) {
		snprintf(why, sizeof(why), "username %s is reserved: another login of this broker (dynamic security) has it", f[F_USER]);
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	int me = installation(cmd, true, why, sizeof(why));
	if (me < 0) {
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	struct dev *old = store_find_id(&g.st, f[F_ID], len[F_ID]);
	struct dev *holder = store_find_user(&g.st, f[F_USER], len[F_USER]);
	/* Another installation's logins are never taken over: its devicehub
	 * would lose a device it still has. */
	if (old && !owns(me, old)) {
		snprintf(why, sizeof(why), "device id %s is held by another installation (%s)", f[F_ID], inst_name(old->inst));
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	if (holder && holder != old && !owns(me, holder)) {
		snprintf(why, sizeof(why), "username %s is held by another installation (%s)", f[F_USER], inst_name(holder->inst));
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	size_t removed = 0;
	uint64_t removed_sum = 0;
	if (holder && holder != old) {
		/* devicehub's database keeps usernames unique, so another device
		 * of this installation holding this one has a stale login (its
		 * change to another username, or its undeploy, is on its way in
		 * this sync): it goes now, its session with it. */
		if (holder->inst == me) {
			removed++;
			removed_sum += holder->sum;
		}
		store_remove(&g.st, holder);
		g.st.changes++;
		kick(holder->s);
		free(holder);
	}
	uint64_t gen = g.st.inst[me].generation;
	if (old && old->inst == me) {
		bool same = true;
		for (int i = F_PRODUCT; i < F_COUNT; i++) {
			same = same && old->len[i] == len[i] && memcmp(dev_field(old, i), f[i], len[i]) == 0;
		}
		if (same) {
			if (old->gen != gen) {
				old->gen = gen;
				g.st.changes++;
			}
			reply(rs, "setDevice", NULL, corr, removed_data(removed + 1, removed_sum + old->sum));
			return;
		}
		removed++;
		removed_sum += old->sum;
	}
	struct dev *d = dev_new(f, len, gen, me);
	if (!d) {
		reply(rs, "setDevice", "out of memory", corr, NULL);
		return;
	}
	if (old) {
		store_remove(&g.st, old);
		free(old);
	}
	store_insert(&g.st, d);
	g.st.changes++;
	/* A new login or new rights: the session that has the old ones ends
	 * now, before the answer leaves. */
	if (old) kick(d->s);
	reply(rs, "setDevice", NULL, corr, removed_data(removed, removed_sum));
}

static void delete_device(cJSON *rs, cJSON *cmd, const char *corr)
{
	size_t n;
	char why[FIELD_MAX + 128];
	const char *id = field(cmd, "id", F_ID, &n, why, sizeof(why));
	if (!id) {
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	int me = installation(cmd, false, why, sizeof(why));
	if (me == -1) {
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	struct dev *d = store_find_id(&g.st, id, n);
	if (d && d->inst != 0 && (me < 0 || d->inst != me)) {
		snprintf(why, sizeof(why), "device id %s is held by another installation (%s)", id, inst_name(d->inst));
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	cJSON *data = NULL;
	if (d) {
		if (d->inst == me) data = removed_data(1, d->sum);
		store_remove(&g.st, d);
		g.st.changes++;
		kick(d->s);
		free(d);
	}
	reply(rs, "deleteDevice", NULL, corr, data);
}

static void begin_sync(cJSON *rs, cJSON *cmd, const char *corr)
{
	uint64_t gen;
	char why[FIELD_MAX + 128];
	if (!generation(cmd, &gen)) {
		reply(rs, "beginSync", "missing or invalid generation (an integer from 0 to 2^53)", corr, NULL);
		return;
	}
	int me = installation(cmd, true, why, sizeof(why));
	if (me < 0) {
		reply(rs, "beginSync", why, corr, NULL);
		return;
	}
	struct inst *in = &g.st.inst[me];
	if (in->generation != gen) {
		in->generation = gen;
		g.st.changes++;
	}
	mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "sync %llu of installation \"%s\" begins (%zu devices of its own)",
			(unsigned long long)gen, in->name, in->count);
	reply(rs, "beginSync", NULL, corr, NULL);
}

struct sweep {
	int me;
	uint64_t gen;
};

/* What survives installation me's endSync: other installations' logins,
 * and its own stamped by this sync. Logins of nobody's (installation "")
 * go at the first endSync of any installation that did not take them
 * over: they may be devices that no database deploys any more. */
static bool kept(const struct dev *d, void *arg)
{
	const struct sweep *w = arg;
	if (d->inst == w->me) return d->gen == w->gen;
	return d->inst != 0;
}

static void kick_gone(const struct dev *d, void *arg)
{
	(void)arg;
	kick(d->s);
}

static void end_sync(cJSON *rs, cJSON *cmd, const char *corr)
{
	uint64_t gen;
	char why[FIELD_MAX + 128];
	if (!generation(cmd, &gen)) {
		reply(rs, "endSync", "missing or invalid generation (an integer from 0 to 2^53)", corr, NULL);
		return;
	}
	int me = installation(cmd, false, why, sizeof(why));
	if (me == -1) {
		reply(rs, "endSync", why, corr, NULL);
		return;
	}
	if (me < 0 || gen != g.st.inst[me].generation) {
		snprintf(why, sizeof(why), "generation %llu is not the current one (%llu)",
				(unsigned long long)gen, me < 0 ? 0ULL : (unsigned long long)g.st.inst[me].generation);
		reply(rs, "endSync", why, corr, NULL);
		return;
	}
	struct sweep w = {me, gen};
	size_t removed = store_remove_if(&g.st, kept, &w, kick_gone, NULL);
	if (removed) g.st.changes++;
	mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "sync %llu of installation \"%s\" ends: %zu devices of its own, %zu removed",
			(unsigned long long)gen, g.st.inst[me].name, g.st.inst[me].count, removed);
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "removed", (double)removed);
	reply(rs, "endSync", NULL, corr, data);
}

static void free_reserved(void)
{
	for (size_t i = 0; i < g.n_reserved; i++) free(g.reserved[i]);
	free(g.reserved);
	g.reserved = NULL;
	g.n_reserved = 0;
}

static bool holds_reserved(const struct dev *d, void *arg)
{
	(void)arg;
	return !is_reserved(dev_field(d, F_USER));
}

/* setReserved {"usernames":[...]}: the broker's other logins (dynsec's
 * clients), which no device may have; replaces the set. A device that
 * holds one loses it (data {"removed":N}): its installation's leader sees
 * its digest change, syncs, and is refused. */
static void set_reserved(cJSON *rs, cJSON *cmd, const char *corr)
{
	cJSON *list = cJSON_GetObjectItemCaseSensitive(cmd, "usernames");
	if (!cJSON_IsArray(list)) {
		reply(rs, "setReserved", "missing or invalid usernames (an array of strings)", corr, NULL);
		return;
	}
	int n = cJSON_GetArraySize(list);
	char **v = calloc((size_t)n + 1, sizeof(char *));
	if (!v) {
		reply(rs, "setReserved", "out of memory", corr, NULL);
		return;
	}
	size_t k = 0;
	cJSON *it;
	cJSON_ArrayForEach(it, list) {
		if (!cJSON_IsString(it) || !it->valuestring || !it->valuestring[0] ||
				!(v[k] = strdup(it->valuestring))) {
			for (size_t i = 0; i < k; i++) free(v[i]);
			free(v);
			reply(rs, "setReserved", "usernames holds an empty name or one that is not a string", corr, NULL);
			return;
		}
		k++;
	}
	qsort(v, k, sizeof(char *), cmp_str);
	free_reserved();
	g.reserved = v;
	g.n_reserved = k;
	size_t removed = store_remove_if(&g.st, holds_reserved, NULL, kick_gone, NULL);
	if (removed) {
		g.st.changes++;
		mosquitto_log_printf(MOSQ_LOG_WARNING, LOG_PREFIX "%zu device logins removed: their usernames are reserved", removed);
	}
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "removed", (double)removed);
	reply(rs, "setReserved", NULL, corr, data);
}

static void get_device(cJSON *rs, cJSON *cmd, const char *corr)
{
	size_t n;
	char why[64];
	const char *id = field(cmd, "id", F_ID, &n, why, sizeof(why));
	if (!id) {
		reply(rs, "getDevice", why, corr, NULL);
		return;
	}
	const struct dev *d = store_find_id(&g.st, id, n);
	if (!d) {
		reply(rs, "getDevice", "device not found", corr, NULL);
		return;
	}
	cJSON *data = cJSON_CreateObject();
	cJSON_AddStringToObject(data, "id", d->s);
	cJSON_AddStringToObject(data, "product", dev_field(d, F_PRODUCT));
	cJSON_AddStringToObject(data, "username", dev_field(d, F_USER));
	cJSON_AddStringToObject(data, "installation", inst_name(d->inst));
	cJSON_AddNumberToObject(data, "generation", (double)d->gen);
	reply(rs, "getDevice", NULL, corr, data);
}

static long rss_bytes(void)
{
	long pages = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "re");
	if (!f) return 0;
	if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
	fclose(f);
	return rss * sysconf(_SC_PAGESIZE);
}

static void get_stats(cJSON *rs, const char *corr)
{
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "devices", (double)store_count(&g.st));
	cJSON_AddNumberToObject(data, "generation", (double)g.st.inst[0].generation);
	cJSON_AddNumberToObject(data, "reserved", (double)g.n_reserved);
	/* Per installation: its logins' count and digest (the sum of dev_sum,
	 * 16 hex digits), which its leader compares with what it synced. */
	cJSON *insts = cJSON_AddObjectToObject(data, "installations");
	for (size_t i = 0; i < g.st.n_inst; i++) {
		const struct inst *in = &g.st.inst[i];
		char hex[17];
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)in->digest);
		cJSON *o = cJSON_AddObjectToObject(insts, in->name);
		cJSON_AddNumberToObject(o, "devices", (double)in->count);
		cJSON_AddNumberToObject(o, "generation", (double)in->generation);
		cJSON_AddStringToObject(o, "digest", hex);
	}
	cJSON_AddNumberToObject(data, "memoryBytes", (double)store_memory(&g.st));
	cJSON_AddNumberToObject(data, "brokerRssBytes", (double)rss_bytes());
	cJSON *snap = cJSON_AddObjectToObject(data, "snapshot");
	if (g.snapshot_file) {
		cJSON_AddStringToObject(snap, "file", g.snapshot_file);
		cJSON_AddNumberToObject(snap, "interval", (double)g.snapshot_interval);
		cJSON_AddBoolToObject(snap, "dirty", g.st.changes != g.saved_changes);
		cJSON_AddBoolToObject(snap, "saving", g.child > 0);
		cJSON_AddNumberToObject(snap, "lastSaveTime", (double)g.last_save_time);
		cJSON_AddNumberToObject(snap, "lastSaveDevices", (double)g.last_save_devices);
		cJSON_AddNumberToObject(snap, "lastSaveMs", g.last_save_ms);
		cJSON_AddNumberToObject(snap, "lastForkMs", g.last_fork_ms);
		cJSON_AddNumberToObject(snap, "loadedDevices", (double)g.loaded_devices);
		cJSON_AddNumberToObject(snap, "loadMs", g.load_ms);
		if (g.last_error[0]) cJSON_AddStringToObject(snap, "lastError", g.last_error);
	}
	reply(rs, "getStats", NULL, corr, data);
}

static void handle_command(cJSON *rs, cJSON *cmd, bool allowed)
{
	if (!cJSON_IsObject(cmd)) {
		reply(rs, "Unknown command", "command is not an object", NULL, NULL);
		return;
	}
	cJSON *jc = cJSON_GetObjectItemCaseSensitive(cmd, "command");
	cJSON *jcorr = cJSON_GetObjectItemCaseSensitive(cmd, "correlationData");
	if (!cJSON_IsString(jc) || !jc->valuestring) {
		reply(rs, "Unknown command", "missing or invalid command", NULL, NULL);
		return;
	}
	const char *name = jc->valuestring;
	const char *corr = NULL;
	if (jcorr) {
		if (!cJSON_IsString(jcorr) || !jcorr->valuestring) {
			reply(rs, name, "invalid correlationData (not a string)", NULL, NULL);
			return;
		}
		corr = jcorr->valuestring;
	}
	if (!allowed) {
		reply(rs, name, "not authorised", corr, NULL);
	} else if (strcmp(name, "setDevice") == 0) {
		set_device(rs, cmd, corr);
	} else if (strcmp(name, "deleteDevice") == 0) {
		delete_device(rs, cmd, corr);
	} else if (strcmp(name, "beginSync") == 0) {
		begin_sync(rs, cmd, corr);
	} else if (strcmp(name, "endSync") == 0) {
		end_sync(rs, cmd, corr);
	} else if (strcmp(name, "getDevice") == 0) {
		get_device(rs, cmd, corr);
	} else if (strcmp(name, "getStats") == 0) {
		get_stats(rs, corr);
	} else if (strcmp(name, "setReserved") == 0) {
		set_reserved(rs, cmd, corr);
	} else {
		reply(rs, name, "Unknown command", corr, NULL);
	}
}

/* cJSON cuts a string at an escaped NUL (\u0000) without a word: refuse
 * the message instead of acting on a shortened field. */
static bool has_escaped_nul(const char *p, size_t n)
{
	for (size_t i = 0; i + 1 < n; i++) {
		if (p[i] != '\\') continue;
		if (p[i + 1] == 'u' && i + 5 < n && memcmp(p + i + 2, "0000", 4) == 0) return true;
		i++; /* skip the escaped character */
	}
	return false;
}

static void send_response(const char *cid, cJSON *tree)
{
	char *s = cJSON_PrintUnformatted(tree);
	cJSON_Delete(tree);
	if (!s) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "out of memory for a control response");
		return;
	}
	int rc = mosquitto_broker_publish_copy(cid, RESPONSE_TOPIC, (int)strlen(s), s, 1, false, NULL);
	if (rc != MOSQ_ERR_SUCCESS) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "control response not sent: %s", mosquitto_strerror(rc));
	}
	free(s);
}

static int on_control(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	struct mosquitto_evt_control *e = event_data;
	const char *cid = mosquitto_client_id(e->client);
	const char *user = mosquitto_client_username(e->client);
	cJSON *tree = cJSON_CreateObject();
	cJSON *rs = cJSON_AddArrayToObject(tree, "responses");
	if (!tree || !rs) {
		cJSON_Delete(tree);
		return MOSQ_ERR_NOMEM;
	}
	bool allowed = is_service(user);
	if (!allowed) {
		mosquitto_log_printf(MOSQ_LOG_WARNING, LOG_PREFIX "control message from %s (%s), not a service login: refused",
				cid ? cid : "", user ? user : "anonymous");
	}
	if (e->payloadlen > MAX_CONTROL_PAYLOAD) {
		reply(rs, "Unknown command", "payload over 1 MiB", NULL, NULL);
	} else if (has_escaped_nul(e->payload, e->payloadlen)) {
		reply(rs, "Unknown command", "payload holds a NUL character (\\u0000)", NULL, NULL);
	} else {
		cJSON *in = cJSON_ParseWithLength(e->payload, e->payloadlen);
		cJSON *cmds = cJSON_GetObjectItemCaseSensitive(in, "commands");
		if (!in) {
			reply(rs, "Unknown command", "Payload not valid JSON", NULL, NULL);
		} else if (!cJSON_IsArray(cmds)) {
			reply(rs, "Unknown command", "Invalid/missing commands", NULL, NULL);
		} else {
			cJSON *cmd;
			cJSON_ArrayForEach(cmd, cmds) handle_command(rs, cmd, allowed);
		}
		cJSON_Delete(in);
	}
	send_response(cid, tree);
	return MOSQ_ERR_SUCCESS;
}

/* ---- snapshot ---------------------------------------------------------- */

static void save_now(void)
{
	char err[256];
	double t0 = mono_s();
	uint64_t changes = g.st.changes;
	if (snapshot_save(&g.st, g.snapshot_file, err, sizeof(err)) < 0) {
		snprintf(g.last_error, sizeof(g.last_error), "%s", err);
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not saved: %s", err);
		return;
	}
	g.saved_changes = changes;
	g.last_save_ms = (mono_s() - t0) * 1000;
	g.last_save_time = time(NULL);
	g.last_save_devices = store_count(&g.st);
	g.last_error[0] = '\0';
	mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "snapshot saved: %zu devices in %.0f ms",
			g.last_save_devices, g.last_save_ms);
}

/* Forks a child that writes the store as it is now (copy-on-write pages)
 * and exits; the broker goes on at once. The Redis BGSAVE way. */
static void start_background_save(void)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot: pipe: %s", strerror(errno));
		return;
	}
	double t0 = mono_s();
	pid_t pid = fork();
	if (pid < 0) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		/* The child holds none of the broker's sockets (a restarted
		 * broker must be able to listen while it writes) and reports a
		 * failure on fd 2. */
		char err[256];
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		dup2(fds[1], 2);
		if (close_range(3, ~0U, 0) < 0) {
			for (int fd = 3; fd < 65536; fd++) close(fd);
		}
		if (snapshot_save(&g.st, g.snapshot_file, err, sizeof(err)) < 0) {
			ssize_t w = write(2, err, strlen(err));
			(void)w;
			_exit(1);
		}
		_exit(0);
	}
	close(fds[1]);
	g.child = pid;
	g.child_pipe = fds[0];
	g.child_changes = g.st.changes;
	g.child_devices = store_count(&g.st);
	g.child_started = mono_s();
	g.last_fork_ms = (g.child_started - t0) * 1000;
}

/* Reaps the child (blocking or not); true if it is gone. */
static bool reap_child(bool block)
{
	int status;
	pid_t r;
	if (g.child <= 0) return true;
	do {
		r = waitpid(g.child, &status, block ? 0 : WNOHANG);
	} while (r < 0 && errno == EINTR);
	if (r == 0) return false;
	char err[256] = "";
	ssize_t n = read(g.child_pipe, err, sizeof(err) - 1);
	err[n > 0 ? n : 0] = '\0';
	close(g.child_pipe);
	g.child_pipe = -1;
	if (r == g.child && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		g.saved_changes = g.child_changes;
		g.last_save_ms = (mono_s() - g.child_started) * 1000;
		g.last_save_time = time(NULL);
		g.last_save_devices = g.child_devices;
		g.last_error[0] = '\0';
		mosquitto_log_printf(MOSQ_LOG_INFO,
				LOG_PREFIX "snapshot saved in the background: %zu devices in %.0f ms (fork %.1f ms)",
				g.child_devices, g.last_save_ms, g.last_fork_ms);
	} else {
		if (!err[0]) snprintf(err, sizeof(err), "writer ended with status %d", status);
		snprintf(g.last_error, sizeof(g.last_error), "%s", err);
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not saved: %s", err);
	}
	g.child = 0;
	return true;
}

static int on_tick(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)event_data;
	(void)userdata;
	/* A growing table moves a share of its buckets while the broker idles. */
	store_rehash_step(&g.st, 4096);
	if (!g.snapshot_file) return MOSQ_ERR_SUCCESS;
	if (g.child > 0 && !reap_child(false)) return MOSQ_ERR_SUCCESS;
	double now = mono_s();
	if (now < g.next_check) return MOSQ_ERR_SUCCESS;
	g.next_check = now + (double)g.snapshot_interval;
	if (g.st.changes != g.saved_changes) start_background_save();
	return MOSQ_ERR_SUCCESS;
}

/* ---- plugin entry points ----------------------------------------------- */

static int parse_long(const char *name, const char *v, long min, long *out)
{
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno || end == v || *end || n < min) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "plugin_opt_%s %s: want an integer >= %ld", name, v, min);
		return MOSQ_ERR_INVAL;
	}
	*out = n;
	return MOSQ_ERR_SUCCESS;
}

static int parse_service_users(const char *v)
{
	char *copy = strdup(v), *save = NULL;
	if (!copy) return MOSQ_ERR_NOMEM;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ' || *tok == '\t') tok++;
		size_t n = strlen(tok);
		while (n > 0 && (tok[n - 1] == ' ' || tok[n - 1] == '\t')) tok[--n] = '\0';
		if (n == 0) continue;
		if (g.n_service == MAX_SERVICE_USERS) {
			mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "more than %d service_users", MAX_SERVICE_USERS);
			free(copy);
			return MOSQ_ERR_INVAL;
		}
		if (!(g.service[g.n_service] = strdup(tok))) {
			free(copy);
			return MOSQ_ERR_NOMEM;
		}
		g.n_service++;
	}
	free(copy);
	return MOSQ_ERR_SUCCESS;
}

EXPORT int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for (int i = 0; i < supported_version_count; i++) {
		if (supported_versions[i] == 5) return 5;
	}
	return -1;
}

EXPORT int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
		struct mosquitto_opt *options, int option_count)
{
	int rc;
	(void)userdata;
	memset(&g, 0, sizeof(g));
	g.pid = identifier;
	g.snapshot_interval = 300;
	g.signed_skew = 60;
	g.child_pipe = -1;
	for (int i = 0; i < option_count; i++) {
		const char *k = options[i].key, *v = options[i].value ? options[i].value : "";
		rc = MOSQ_ERR_SUCCESS;
		if (strcmp(k, "service_users") == 0) {
			rc = parse_service_users(v);
		} else if (strcmp(k, "snapshot_file") == 0) {
			free(g.snapshot_file);
			g.snapshot_file = *v ? strdup(v) : NULL;
		} else if (strcmp(k, "snapshot_interval") == 0) {
			rc = parse_long(k, v, 1, &g.snapshot_interval);
		} else if (strcmp(k, "signed_skew") == 0) {
			rc = parse_long(k, v, 0, &g.signed_skew);
		} else {
			mosquitto_log_printf(MOSQ_LOG_WARNING, LOG_PREFIX "unknown option plugin_opt_%s ignored", k);
		}
		if (rc) return rc;
	}
	if (g.n_service == 0) {
		if (!(g.service[0] = strdup("devicehub"))) return MOSQ_ERR_NOMEM;
		g.n_service = 1;
	}

	store_init(&g.st, 0);
	if (g.snapshot_file) {
		char err[256];
		double t0 = mono_s();
		snapshot_clean(g.snapshot_file);
		int r = snapshot_load(&g.st, g.snapshot_file, err, sizeof(err));
		g.load_ms = (mono_s() - t0) * 1000;
		if (r > 0) {
			g.loaded_devices = store_count(&g.st);
			mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "%zu devices of %zu installations loaded from %s in %.0f ms",
					g.loaded_devices, g.st.n_inst, g.snapshot_file, g.load_ms);
		} else if (r == 0) {
			mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "no snapshot at %s: starting empty", g.snapshot_file);
		} else {
			snprintf(g.last_error, sizeof(g.last_error), "load: %s", err);
			mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not loaded, starting empty: %s", err);
		}
		g.next_check = mono_s() + (double)g.snapshot_interval;
	}
	g.saved_changes = g.st.changes;

	if ((rc = mosquitto_callback_register(identifier, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC, NULL)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_TICK, on_tick, NULL, NULL))) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "registering callbacks: %s", mosquitto_strerror(rc));
		return rc;
	}
	char users[512] = "";
	for (int i = 0; i < g.n_service; i++) {
		size_t n = strlen(users);
		snprintf(users + n, sizeof(users) - n, "%s%s", i ? "," : "", g.service[i]);
	}
	mosquitto_log_printf(MOSQ_LOG_INFO,
			LOG_PREFIX "ready: %zu devices; service logins %s; snapshot %s every %ld s; signed logins within %ld s",
			store_count(&g.st), users, g.snapshot_file ? g.snapshot_file : "(none)", g.snapshot_interval,
			g.signed_skew);
	return MOSQ_ERR_SUCCESS;
}

EXPORT int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	(void)userdata;
	(void)options;
	(void)option_count;
	if (g.pid) {
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_TICK, on_tick, NULL);
	}
	if (g.snapshot_file) {
		reap_child(true);
		if (g.st.changes != g.saved_changes) save_now();
	}
	store_free(&g.st);
	free_reserved();
	for (int i = 0; i < g.n_service; i++) free(g.service[i]);
	free(g.snapshot_file);
	memset(&g, 0, sizeof(g));
	return MOSQ_ERR_SUCCESS;
}
