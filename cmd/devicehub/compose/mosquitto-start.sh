#!/bin/sh
# Entry point of the compose file's mosquitto service: on the first start,
# the dynamic-security plugin's file with devicehub's service login
# ($MQTT_USERNAME / $MQTT_PASSWORD) holding the plugin's admin rights, made
# as .ci/mosquitto-setup makes it; the config with this login as the device
# plugin's service user and $MQTT_MAX_PACKET; then the broker, which drops
# to user mosquitto and must be able to rewrite the files.
set -eu
dynsec=/mosquitto/data/dynsec.json
if [ ! -s "$dynsec" ]; then
	mosquitto_ctrl dynsec init "$dynsec" "$MQTT_USERNAME" "$MQTT_PASSWORD" >/dev/null
fi
sed -e "s#^plugin_opt_service_users .*#plugin_opt_service_users $MQTT_USERNAME#" \
	-e "s#^max_packet_size .*#max_packet_size ${MQTT_MAX_PACKET:-266240}#" \
	-e "s#^plugin_opt_signed_skew .*#plugin_opt_signed_skew ${MQTT_SIGNED_WINDOW:-60}#" \
	/mosquitto/config/mosquitto.conf >/mosquitto/data/mosquitto.conf
chown -R mosquitto:mosquitto /mosquitto/data
# The logins' password hashes: the broker's user only.
chmod 600 "$dynsec"
exec mosquitto -c /mosquitto/data/mosquitto.conf
