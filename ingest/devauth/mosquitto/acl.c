/*
 * Topic rights of a device (every PUBLISH, SUBSCRIBE and delivery): its
 * uplinks to publish, its downlinks to receive, below its own prefix.
 */
#define _GNU_SOURCE
#include <string.h>

#include "plugin.h"

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
 * wire.ParseTopic in ingest/wire/topic.go): event ids are one non-empty level. */
static bool is_uplink(const char *s)
{
	static const char *const fixed[] = {
		"properties/report", "online", "offline", "properties/read/reply", "function/invoke/reply",
		"properties/write/reply", /* a write's answer (ingest/link) */
		"shadow/get",             /* a device asks for its whole shadow (ingest/shadow) */
		"firmware/progress", "firmware/version", /* firmware updates (ingest/firmware) */
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

int on_acl_check(int event, void *event_data, void *userdata)
{
	(void)event;
	const struct plugin *p = userdata;
	struct mosquitto_evt_acl_check *e = event_data;
	const char *topic = e->topic;
	const char *user = mosquitto_client_username(e->client);
	if (!topic) return MOSQ_ERR_ACL_DENIED;
	if (is_service(p, user)) {
		if (e->access == MOSQ_ACL_WRITE ? strcmp(topic, CONTROL_TOPIC) == 0
		                                : strcmp(topic, RESPONSE_TOPIC) == 0) {
			return MOSQ_ERR_SUCCESS;
		}
		return MOSQ_ERR_PLUGIN_DEFER;
	}
	const struct dev *d = client_device(p, user, mosquitto_client_id(e->client));
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

