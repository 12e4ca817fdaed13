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
 *    login admitted for that device and than the broker's start (no
 *    replay). Unknown usernames,
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
 *
 * The parts: plugin.h. Their state is one struct plugin, allocated here
 * and passed to every callback as its userdata.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plugin.h"

/* Built with -fvisibility=hidden: only the entry points are exported. */
#define EXPORT __attribute__((visibility("default")))

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

static int parse_service_users(struct plugin *p, const char *v)
{
	char *copy = strdup(v), *save = NULL;
	if (!copy) return MOSQ_ERR_NOMEM;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ' || *tok == '\t') tok++;
		size_t n = strlen(tok);
		while (n > 0 && (tok[n - 1] == ' ' || tok[n - 1] == '\t')) tok[--n] = '\0';
		if (n == 0) continue;
		if (p->n_service == MAX_SERVICE_USERS) {
			mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "more than %d service_users", MAX_SERVICE_USERS);
			free(copy);
			return MOSQ_ERR_INVAL;
		}
		if (!(p->service[p->n_service] = strdup(tok))) {
			free(copy);
			return MOSQ_ERR_NOMEM;
		}
		p->n_service++;
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

/* Frees what p holds and p, after unregistering its callbacks. */
static void plugin_free(struct plugin *p)
{
	if (!p) return;
	if (p->registered) {
		mosquitto_callback_unregister(p->pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(p->pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		mosquitto_callback_unregister(p->pid, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC);
		mosquitto_callback_unregister(p->pid, MOSQ_EVT_TICK, on_tick, NULL);
	}
	store_free(&p->st);
	free_reserved(p);
	for (int i = 0; i < p->n_service; i++) free(p->service[i]);
	free(p->snapshot_file);
	free(p);
}

static int configure(struct plugin *p, struct mosquitto_opt *options, int option_count)
{
	int rc;
	p->snapshot_interval = 300;
	p->signed_skew = 60;
	p->child_pipe = -1;
	for (int i = 0; i < option_count; i++) {
		const char *k = options[i].key, *v = options[i].value ? options[i].value : "";
		rc = MOSQ_ERR_SUCCESS;
		if (strcmp(k, "service_users") == 0) {
			rc = parse_service_users(p, v);
		} else if (strcmp(k, "snapshot_file") == 0) {
			free(p->snapshot_file);
			p->snapshot_file = *v ? strdup(v) : NULL;
		} else if (strcmp(k, "snapshot_interval") == 0) {
			rc = parse_long(k, v, 1, &p->snapshot_interval);
		} else if (strcmp(k, "signed_skew") == 0) {
			rc = parse_long(k, v, 0, &p->signed_skew);
		} else {
			mosquitto_log_printf(MOSQ_LOG_WARNING, LOG_PREFIX "unknown option plugin_opt_%s ignored", k);
		}
		if (rc) return rc;
	}
	if (p->n_service == 0) {
		if (!(p->service[0] = strdup("devicehub"))) return MOSQ_ERR_NOMEM;
		p->n_service = 1;
	}
	return MOSQ_ERR_SUCCESS;
}

static void load(struct plugin *p)
{
	if (!p->snapshot_file) return;
	char err[256];
	double t0 = mono_s();
	snapshot_clean(p->snapshot_file);
	int r = snapshot_load(&p->st, p->snapshot_file, err, sizeof(err));
	p->load_ms = (mono_s() - t0) * 1000;
	if (r > 0) {
		p->loaded_devices = store_count(&p->st);
		mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "%zu devices of %zu installations loaded from %s in %.0f ms",
				p->loaded_devices, p->st.n_inst, p->snapshot_file, p->load_ms);
	} else if (r == 0) {
		mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "no snapshot at %s: starting empty", p->snapshot_file);
	} else {
		snprintf(p->last_error, sizeof(p->last_error), "load: %s", err);
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not loaded, starting empty: %s", err);
	}
	p->next_check = mono_s() + (double)p->snapshot_interval;
}

EXPORT int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
		struct mosquitto_opt *options, int option_count)
{
	int rc;
	struct plugin *p = calloc(1, sizeof(*p));
	if (!p) return MOSQ_ERR_NOMEM;
	p->pid = identifier;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	p->started_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	store_init(&p->st, 0);
	if ((rc = configure(p, options, option_count))) {
		plugin_free(p);
		return rc;
	}
	load(p);
	p->saved_changes = p->st.changes;

	if ((rc = mosquitto_callback_register(identifier, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, p)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, p)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC, p)) ||
			(rc = mosquitto_callback_register(identifier, MOSQ_EVT_TICK, on_tick, NULL, p))) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "registering callbacks: %s", mosquitto_strerror(rc));
		p->registered = true; /* unregistering what was not is harmless */
		plugin_free(p);
		return rc;
	}
	p->registered = true;
	*userdata = p;
	char users[512] = "";
	for (int i = 0; i < p->n_service; i++) {
		size_t n = strlen(users);
		snprintf(users + n, sizeof(users) - n, "%s%s", i ? "," : "", p->service[i]);
	}
	mosquitto_log_printf(MOSQ_LOG_INFO,
			LOG_PREFIX "ready: %zu devices; service logins %s; snapshot %s every %ld s; signed logins within %ld s",
			store_count(&p->st), users, p->snapshot_file ? p->snapshot_file : "(none)", p->snapshot_interval,
			p->signed_skew);
	return MOSQ_ERR_SUCCESS;
}

EXPORT int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	struct plugin *p = userdata;
	(void)options;
	(void)option_count;
	if (!p) return MOSQ_ERR_SUCCESS;
	if (p->snapshot_file) {
		reap_child(p, true);
		if (p->st.changes != p->saved_changes) save_now(p);
	}
	plugin_free(p);
	return MOSQ_ERR_SUCCESS;
}
