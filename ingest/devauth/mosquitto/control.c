/*
 * The control topic: devicehub's commands (ingest/devauth/doc.go), only
 * from a service login.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin.h"

#define MAX_CONTROL_PAYLOAD (1u << 20)
#define MAX_GENERATION 9007199254740992.0 /* 2^53: exact in a JSON number */

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
static int installation(struct plugin *p, cJSON *cmd, bool create, char *why, size_t whylen)
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
	int i = store_inst(&p->st, j->valuestring, n, create);
	if (i < 0 && create) snprintf(why, whylen, "more than %d installations", MAX_INSTALLATIONS);
	if (i < 0 && !create) i = -2; /* unknown: holds nothing */
	return i;
}

static const char *inst_name(const struct plugin *p, int i)
{
	return p->st.inst[i].name;
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

static void set_device(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
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
	if (is_service(p, f[F_USER])) {
		reply(rs, "setDevice", "username is a service login", corr, NULL);
		return;
	}
	if (is_reserved(p, f[F_USER])) {
		snprintf(why, sizeof(why), "username %s is reserved: another login of this broker (dynamic security) has it", f[F_USER]);
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	int me = installation(p, cmd, true, why, sizeof(why));
	if (me < 0) {
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	struct dev *old = store_find_id(&p->st, f[F_ID], len[F_ID]);
	struct dev *holder = store_find_user(&p->st, f[F_USER], len[F_USER]);
	/* Another installation's logins are never taken over: its devicehub
	 * would lose a device it still has. */
	if (old && !owns(me, old)) {
		snprintf(why, sizeof(why), "device id %s is held by another installation (%s)", f[F_ID], inst_name(p, old->inst));
		reply(rs, "setDevice", why, corr, NULL);
		return;
	}
	if (holder && holder != old && !owns(me, holder)) {
		snprintf(why, sizeof(why), "username %s is held by another installation (%s)", f[F_USER], inst_name(p, holder->inst));
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
		store_remove(&p->st, holder);
		p->st.changes++;
		kick(holder->s);
		free(holder);
	}
	uint64_t gen = p->st.inst[me].generation;
	if (old && old->inst == me) {
		bool same = true;
		for (int i = F_PRODUCT; i < F_COUNT; i++) {
			same = same && old->len[i] == len[i] && memcmp(dev_field(old, i), f[i], len[i]) == 0;
		}
		if (same) {
			if (old->gen != gen) {
				old->gen = gen;
				p->st.changes++;
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
		store_remove(&p->st, old);
		free(old);
	}
	store_insert(&p->st, d);
	p->st.changes++;
	/* A new login or new rights: the session that has the old ones ends
	 * now, before the answer leaves. */
	if (old) kick(d->s);
	reply(rs, "setDevice", NULL, corr, removed_data(removed, removed_sum));
}

static void delete_device(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
{
	size_t n;
	char why[FIELD_MAX + 128];
	const char *id = field(cmd, "id", F_ID, &n, why, sizeof(why));
	if (!id) {
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	int me = installation(p, cmd, false, why, sizeof(why));
	if (me == -1) {
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	struct dev *d = store_find_id(&p->st, id, n);
	if (d && d->inst != 0 && (me < 0 || d->inst != me)) {
		snprintf(why, sizeof(why), "device id %s is held by another installation (%s)", id, inst_name(p, d->inst));
		reply(rs, "deleteDevice", why, corr, NULL);
		return;
	}
	cJSON *data = NULL;
	if (d) {
		if (d->inst == me) data = removed_data(1, d->sum);
		store_remove(&p->st, d);
		p->st.changes++;
		kick(d->s);
		free(d);
	}
	reply(rs, "deleteDevice", NULL, corr, data);
}

static void begin_sync(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
{
	uint64_t gen;
	char why[FIELD_MAX + 128];
	if (!generation(cmd, &gen)) {
		reply(rs, "beginSync", "missing or invalid generation (an integer from 0 to 2^53)", corr, NULL);
		return;
	}
	int me = installation(p, cmd, true, why, sizeof(why));
	if (me < 0) {
		reply(rs, "beginSync", why, corr, NULL);
		return;
	}
	struct inst *in = &p->st.inst[me];
	if (in->generation != gen) {
		in->generation = gen;
		p->st.changes++;
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

static void end_sync(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
{
	uint64_t gen;
	char why[FIELD_MAX + 128];
	if (!generation(cmd, &gen)) {
		reply(rs, "endSync", "missing or invalid generation (an integer from 0 to 2^53)", corr, NULL);
		return;
	}
	int me = installation(p, cmd, false, why, sizeof(why));
	if (me == -1) {
		reply(rs, "endSync", why, corr, NULL);
		return;
	}
	if (me < 0 || gen != p->st.inst[me].generation) {
		snprintf(why, sizeof(why), "generation %llu is not the current one (%llu)",
				(unsigned long long)gen, me < 0 ? 0ULL : (unsigned long long)p->st.inst[me].generation);
		reply(rs, "endSync", why, corr, NULL);
		return;
	}
	struct sweep w = {me, gen};
	size_t removed = store_remove_if(&p->st, kept, &w, kick_gone, NULL);
	if (removed) p->st.changes++;
	mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "sync %llu of installation \"%s\" ends: %zu devices of its own, %zu removed",
			(unsigned long long)gen, p->st.inst[me].name, p->st.inst[me].count, removed);
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "removed", (double)removed);
	reply(rs, "endSync", NULL, corr, data);
}

void free_reserved(struct plugin *p)
{
	for (size_t i = 0; i < p->n_reserved; i++) free(p->reserved[i]);
	free(p->reserved);
	p->reserved = NULL;
	p->n_reserved = 0;
}

static bool holds_reserved(const struct dev *d, void *arg)
{
	return !is_reserved(arg, dev_field(d, F_USER));
}

/* setReserved {"usernames":[...]}: the broker's other logins (dynsec's
 * clients), which no device may have; replaces the set. A device that
 * holds one loses it (data {"removed":N}): its installation's leader sees
 * its digest change, syncs, and is refused. */
static void set_reserved(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
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
	free_reserved(p);
	p->reserved = v;
	p->n_reserved = k;
	size_t removed = store_remove_if(&p->st, holds_reserved, p, kick_gone, NULL);
	if (removed) {
		p->st.changes++;
		mosquitto_log_printf(MOSQ_LOG_WARNING, LOG_PREFIX "%zu device logins removed: their usernames are reserved", removed);
	}
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "removed", (double)removed);
	reply(rs, "setReserved", NULL, corr, data);
}

static void get_device(struct plugin *p, cJSON *rs, cJSON *cmd, const char *corr)
{
	size_t n;
	char why[64];
	const char *id = field(cmd, "id", F_ID, &n, why, sizeof(why));
	if (!id) {
		reply(rs, "getDevice", why, corr, NULL);
		return;
	}
	const struct dev *d = store_find_id(&p->st, id, n);
	if (!d) {
		reply(rs, "getDevice", "device not found", corr, NULL);
		return;
	}
	cJSON *data = cJSON_CreateObject();
	cJSON_AddStringToObject(data, "id", d->s);
	cJSON_AddStringToObject(data, "product", dev_field(d, F_PRODUCT));
	cJSON_AddStringToObject(data, "username", dev_field(d, F_USER));
	cJSON_AddStringToObject(data, "installation", inst_name(p, d->inst));
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

static void get_stats(struct plugin *p, cJSON *rs, const char *corr)
{
	cJSON *data = cJSON_CreateObject();
	cJSON_AddNumberToObject(data, "devices", (double)store_count(&p->st));
	cJSON_AddNumberToObject(data, "generation", (double)p->st.inst[0].generation);
	cJSON_AddNumberToObject(data, "reserved", (double)p->n_reserved);
	/* Per installation: its logins' count and digest (the sum of dev_sum,
	 * 16 hex digits), which its leader compares with what it synced. */
	cJSON *insts = cJSON_AddObjectToObject(data, "installations");
	for (size_t i = 0; i < p->st.n_inst; i++) {
		const struct inst *in = &p->st.inst[i];
		char hex[17];
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)in->digest);
		cJSON *o = cJSON_AddObjectToObject(insts, in->name);
		cJSON_AddNumberToObject(o, "devices", (double)in->count);
		cJSON_AddNumberToObject(o, "generation", (double)in->generation);
		cJSON_AddStringToObject(o, "digest", hex);
	}
	cJSON_AddNumberToObject(data, "memoryBytes", (double)store_memory(&p->st));
	cJSON_AddNumberToObject(data, "brokerRssBytes", (double)rss_bytes());
	cJSON *snap = cJSON_AddObjectToObject(data, "snapshot");
	if (p->snapshot_file) {
		cJSON_AddStringToObject(snap, "file", p->snapshot_file);
		cJSON_AddNumberToObject(snap, "interval", (double)p->snapshot_interval);
		cJSON_AddBoolToObject(snap, "dirty", p->st.changes != p->saved_changes);
		cJSON_AddBoolToObject(snap, "saving", p->child > 0);
		cJSON_AddNumberToObject(snap, "lastSaveTime", (double)p->last_save_time);
		cJSON_AddNumberToObject(snap, "lastSaveDevices", (double)p->last_save_devices);
		cJSON_AddNumberToObject(snap, "lastSaveMs", p->last_save_ms);
		cJSON_AddNumberToObject(snap, "lastForkMs", p->last_fork_ms);
		cJSON_AddNumberToObject(snap, "loadedDevices", (double)p->loaded_devices);
		cJSON_AddNumberToObject(snap, "loadMs", p->load_ms);
		if (p->last_error[0]) cJSON_AddStringToObject(snap, "lastError", p->last_error);
	}
	reply(rs, "getStats", NULL, corr, data);
}

static void handle_command(struct plugin *p, cJSON *rs, cJSON *cmd, bool allowed)
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
		set_device(p, rs, cmd, corr);
	} else if (strcmp(name, "deleteDevice") == 0) {
		delete_device(p, rs, cmd, corr);
	} else if (strcmp(name, "beginSync") == 0) {
		begin_sync(p, rs, cmd, corr);
	} else if (strcmp(name, "endSync") == 0) {
		end_sync(p, rs, cmd, corr);
	} else if (strcmp(name, "getDevice") == 0) {
		get_device(p, rs, cmd, corr);
	} else if (strcmp(name, "getStats") == 0) {
		get_stats(p, rs, corr);
	} else if (strcmp(name, "setReserved") == 0) {
		set_reserved(p, rs, cmd, corr);
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

int on_control(int event, void *event_data, void *userdata)
{
	(void)event;
	struct plugin *p = userdata;
	struct mosquitto_evt_control *e = event_data;
	const char *cid = mosquitto_client_id(e->client);
	const char *user = mosquitto_client_username(e->client);
	cJSON *tree = cJSON_CreateObject();
	cJSON *rs = cJSON_AddArrayToObject(tree, "responses");
	if (!tree || !rs) {
		cJSON_Delete(tree);
		return MOSQ_ERR_NOMEM;
	}
	bool allowed = is_service(p, user);
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
			cJSON_ArrayForEach(cmd, cmds) handle_command(p, rs, cmd, allowed);
		}
		cJSON_Delete(in);
	}
	send_response(cid, tree);
	return MOSQ_ERR_SUCCESS;
}

