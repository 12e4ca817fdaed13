# The compose file's broker: Debian 12's Mosquitto (2.0.11, what the tests
# run) with devicehub's device-login plugin (ingest/devauth/mosquitto) built
# from this repository. Build context: the repository's top level.
FROM debian:12-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev \
	mosquitto-dev libmosquitto-dev libcjson-dev && rm -rf /var/lib/apt/lists/*
COPY ingest/devauth/mosquitto /src
RUN make -C /src OUT=/out

FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends mosquitto mosquitto-clients libcjson1 \
	&& rm -rf /var/lib/apt/lists/* \
	&& ln -s "$(ls /usr/lib/*/mosquitto_dynamic_security.so)" /usr/lib/mosquitto_dynamic_security.so
COPY --from=build /out/devicehub_auth.so /usr/lib/mosquitto/devicehub_auth.so
EXPOSE 1883
