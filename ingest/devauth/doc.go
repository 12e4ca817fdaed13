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
//	{"command":"setDevice","id":D,"product":P,"username":U,"key":K,"installation":I}
//	                                       data {"removed":N,"removedDigest":X} when it replaced any
//	{"command":"deleteDevice","id":D,"installation":I}   data likewise
//	{"command":"beginSync","generation":G,"installation":I}
//	{"command":"endSync","generation":G,"installation":I}   data {"removed":N}
//	{"command":"getDevice","id":D}         data {"id","product","username","installation","generation"}
//	{"command":"getStats"}                 data {"devices","generation","reserved",
//	                                             "installations":{I:{"devices","generation","digest"}},...}
//	{"command":"setReserved","usernames":[U,...]}   data {"removed":N}
//
// setDevice and deleteDevice cut the device's live session at once when
// its login or rights change. A full sync is beginSync, every login as
// setDevice, endSync: endSync removes what the sync did not set.
//
// Installations. Several devicehubs (each its own database, its
// installation id, meta's InstallationID) may feed one broker: every login
// belongs to the installation that set it. A full sync's endSync removes
// only that installation's logins (and those of installation "", below);
// a setDevice whose id or username another installation holds, and a
// deleteDevice of another installation's device, are refused ("... is
// held by another installation (I)"), never taken over: the syncer logs
// it, counts it (devicehub_devauth_refused_logins_total{reason=
// "other_installation"}), and that device stays refused until one of the
// two databases gives it up. Backward-readable: a command without
// "installation" is installation "" (an older devicehub's, as are the
// logins of a snapshot written before installations): any installation
// may take those over, and any installation's endSync removes those it
// did not (they may be devices no database deploys any more). So an older
// devicehub beside a newer one on one broker loses its logins at the
// newer one's full syncs: upgrade every devicehub of a broker.
//
// The check. Each login's share of its installation's digest is the first
// 8 bytes, big-endian, of the MD5 of "id\nproduct\nusername\nkey"; the
// digest is their sum modulo 2^64 (16 hex digits), so the order logins
// came in does not matter and the plugin keeps it as it changes. setDevice
// and deleteDevice answer what they replaced or removed of the
// installation (removedDigest the sum of those logins' shares), so the
// leader knows what the plugin should hold after every change without
// keeping each login. Every Options.CheckInterval it compares getStats'
// count and digest of its installation with that, and syncs every login
// again at once when they differ (logged, counted in
// devicehub_devauth_resyncs_total{reason="mismatch"}). When the plugin's
// control connection comes back (a broker restarted from its snapshot)
// the same comparison, with no login of installation "" allowed, decides
// between applying only the changes made meanwhile and a full sync
// (reason "reconnected"): feed.kept. A full sync itself first compares
// the plugin with every deployed login read from PostgreSQL (count,
// digest, no login of installation ""), and sends nothing when they are
// equal: a devicehub that restarts finds its brokers holding every
// login (feed.holds).
//
// Reserved usernames. setReserved replaces the set of usernames no device
// may have: the leader sends the dynamic-security plugin's clients (but
// the device clients an older devicehub made, migrate.go) at every full
// sync, and at a check when that plugin's client count changed (and every
// 10th check regardless). setDevice refuses them; a device that holds one loses
// it; a login with one is left to the dynamic-security plugin, so an
// operator's password keeps working whatever secureId a device is given.
//
// With a broker pool (Options.BrokerURL, a comma-separated list) the
// leader feeds every broker's plugin on its own connections (a feed per
// broker: its own pending changes, full syncs and generation), and a
// change is confirmed to its writers once every plugin holds it (tally).
//
// It imports meta's types, link's broker list and leader's lock loop
// (its turns as the syncing instance) only; it must not import api.
package devauth
