// Package shadow owns devices' shadows: the state each device should have
// (desired, set through the API, per property with who set it and when),
// what it reports, their difference (the delta) and a version; and what a
// device is sent about them: its delta when desired changes and when it
// connects, and its whole shadow when it asks.
//
// Where each part lives. Desired and the version are a row per device in
// PostgreSQL (device_shadows, Store); the version grows by one in the very
// statement that changes desired (Store.Apply), so no two states of
// desired share a version, on any instance. Reported is not stored again:
// it is the latest value of each property in ClickHouse (device_property,
// read with tsdb's PropertyHistory), which ingest writes for every report
// anyway. A PostgreSQL row kept by ingest would cost a write per report on
// ingest's hot path (15k reports/s and more) for a value ClickHouse already
// holds, sorted by device and property so that the latest one is a read of
// the last granule; the price is that a report is seen up to ingest's
// flush interval (1 s) late. The delta (desired properties whose reported
// value differs or is missing) is computed on each read, never stored.
//
// Why a device gets every change, once per state it can tell apart:
//   - A change commits (with its new version) before any message about it
//     is sent; then the instance that made it publishes the delta at QoS 1,
//     whether or not its presence view says the device is online: a broker
//     drops what nobody subscribes to, and the view may not have seen a
//     birth yet.
//   - A device subscribes to .../shadow/delta before it publishes its
//     birth (.../online). A device that was not subscribed when a change was
//     published therefore published its birth after that publish, after the
//     change's commit. Ingest takes births on its persistent QoS 1
//     presence session (one instance per birth: a plain subscription, or
//     one member of a share group) and hands each to Born, which reads the shadow, so after
//     the commit: the birth's delta holds the change. Births are read in
//     batches of one query; a device without a shadow costs nothing more.
//   - Ingest acknowledges a birth only once Born has sent its delta (or
//     found none). A birth whose delta was not sent (PostgreSQL, ClickHouse
//     or the broker away: retried with backoff; the instance stopped or
//     killed) stays unacknowledged in ingest's broker session and is
//     delivered again, to the same instance after its restart or to
//     another of its share group: a delta is never lost to a restart, and
//     a device offline through several changes gets one delta at its next
//     connection, on whichever broker of the pool (each broker's births
//     reach ingest's presence session at that broker; a delta is published to every
//     broker of the pool, as the presence view may not know yet that the
//     device moved: the brokers it is not connected to drop it).
//   - Repeats are possible and harmless: a redelivered birth, a change and a
//     birth racing each other, or a devicehub restart send the same delta
//     twice, with the same version; every message carries the version, so a
//     device applies a version once and drops any version at or below the
//     last it applied (two changes racing may arrive out of order: the
//     version, not the arrival order, decides). A device unsure of its state publishes .../shadow/get and
//     gets the whole shadow with its version. A request right after a
//     birth may be answered before the birth's delta is sent: ingest
//     takes births on its presence session and requests on its data
//     sessions (in a share group, possibly on other instances), so the
//     device may get the answer and then the delta of the same version,
//     which it drops (api's TestShadowOfflineDevice takes either order).
//
// It must not import api or ingest (the pipeline calls it through the
// small interface ingest.ShadowHook); it uses meta (device lookups), tsdb
// (reported values), ingest/link (sending) and ingest/wire (topics).
package shadow
