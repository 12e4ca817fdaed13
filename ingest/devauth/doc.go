// Package devauth keeps the device logins of devicehub's own Mosquitto
// plugin (ingest/devauth/mosquitto, C) equal to meta's deployed devices,
// and tells writers when the broker holds their change.
//
// The plugin holds every device login in memory: a change costs the broker
// microseconds whatever the fleet size, unlike the dynamic-security plugin,
// which rewrites its whole file per change. It checks CONNECT (client id =
// device id, username = secureId, password = secureKey, or JetLinks' signed
// form) and every PUBLISH and SUBSCRIBE of a device against its own topics,
// computed from product and id; non-device logins (devicehub's service
// login, operators) it leaves to the dynamic-security plugin.
//
// Control protocol (the dynamic-security plugin's, on its own topic):
// devicehub's service login publishes {"commands":[...]} to
// $CONTROL/devicehub-auth/v1 and reads {"responses":[...]} on
// $CONTROL/devicehub-auth/v1/response, one response per command, in
// order, each echoing "command" and "correlationData" and carrying
// "error" when the command failed and "data" when it returns any:
//
//	{"command":"setDevice","id":D,"product":P,"username":U,"key":K}
//	{"command":"deleteDevice","id":D}
//	{"command":"beginSync","generation":G}
//	{"command":"endSync","generation":G}   data {"removed":N}
//	{"command":"getDevice","id":D}         data {"id","product","username"}
//	{"command":"getStats"}                 data {"devices","generation",...}
//
// setDevice and deleteDevice cut the device's live session at once when
// its login or rights change. A full sync is beginSync, every login as
// setDevice, endSync: endSync removes what the sync did not set.
//
// With a broker pool (Options.BrokerURL, a comma-separated list) the
// leader feeds every broker's plugin on its own connections (a feed per
// broker: its own pending changes, full syncs and generation), and a
// change is confirmed to its writers once every plugin holds it (tally).
//
// It imports meta's types and link's broker list only; it must not import
// api.
package devauth
