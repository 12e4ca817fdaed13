/*
 * devicehub's Mosquitto plugin: the state every part shares, passed to
 * each callback as its userdata, and what each part offers the others.
 *
 *   devicehub_auth.c  entry points and options
 *   auth.c            CONNECT: device logins, signed logins
 *   acl.c             topic rights of devices
 *   control.c         the control topic (ingest/devauth/doc.go)
 *   save.c            the snapshot file, written in the background
 *   store.c           the logins in memory, the snapshot's format
 */
#ifndef DEVICEHUB_PLUGIN_H
#define DEVICEHUB_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#include "store.h"

#define LOG_PREFIX "devicehub-auth: "
#define CONTROL_TOPIC "$CONTROL/devicehub-auth/v1"
#define RESPONSE_TOPIC CONTROL_TOPIC "/response"
#define OUR_TOPICS "$CONTROL/devicehub-auth/"
#define MAX_SERVICE_USERS 16

struct plugin {
	mosquitto_plugin_id_t *pid;
	bool registered; /* its callbacks */
	struct store st;
	char *service[MAX_SERVICE_USERS];
	int n_service;
	char *snapshot_file;
	long snapshot_interval; /* s */
	long signed_skew;       /* s */
	long long started_ms;   /* epoch ms at init: no signed login made before counts */
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
};

/* auth.c */
bool is_service(const struct plugin *p, const char *user);
bool is_reserved(const struct plugin *p, const char *user);
int cmp_str(const void *a, const void *b);
const struct dev *client_device(const struct plugin *p, const char *user, const char *cid);
int on_basic_auth(int event, void *event_data, void *userdata);

/* acl.c */
int on_acl_check(int event, void *event_data, void *userdata);

/* control.c */
int on_control(int event, void *event_data, void *userdata);
void free_reserved(struct plugin *p);

/* save.c */
double mono_s(void);
void save_now(struct plugin *p);
bool reap_child(struct plugin *p, bool block);
int on_tick(int event, void *event_data, void *userdata);

#endif
