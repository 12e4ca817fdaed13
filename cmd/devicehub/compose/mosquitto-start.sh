#!/bin/sh
# Entry point of the compose file's mosquitto service: on the first start,
# the dynamic-security plugin's file with devicehub's service login
# ($MQTT_USERNAME / $MQTT_PASSWORD) holding the plugin's admin rights, made
# as .ci/mosquitto-setup makes it; then the broker, which drops to user
# mosquitto and must be able to rewrite the file.
set -eu
dynsec=/mosquitto/data/dynsec.json
if [ ! -s "$dynsec" ]; then
	mosquitto_ctrl dynsec init "$dynsec" "$MQTT_USERNAME" "$MQTT_PASSWORD" >/dev/null
fi
chown -R mosquitto:mosquitto /mosquitto/data
exec mosquitto -c /mosquitto/config/mosquitto.conf
