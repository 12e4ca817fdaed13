// Package fwdevice is a simulated device's firmware updater: the device's
// side of the firmware protocol (/work/wt/notes/FIRMWARE.md, README
// "Firmware updates"), for tests, cmd/devicesim and the firmware bench.
//
// It owns one device's job: it subscribes to the device's
// /{p}/{d}/firmware/upgrade, downloads the upgrade's URL over HTTP with
// the device's own login as Basic auth (secureId / secureKey), resumes a
// cut download with `Range: bytes=N-` (checking the 206's Content-Range
// starts at N; a 200 instead restarts from 0), checks the size and the
// SHA-256, reports on /{p}/{d}/firmware/progress DOWNLOADING (progress 0,
// then every Step percent, 10 by default: not every chunk), DOWNLOADED,
// VERIFIED, UPDATING, reboots, reports its new version on
// /{p}/{d}/firmware/version after its birth, and then UPDATED. A size or
// hash mismatch, an HTTP refusal (401, 403, 404, 416, ...), a download
// broken or answered 5xx more than MaxResumes times (a 5xx is asked again
// after RetryWait, doubling) or one longer than Timeout ends the job
// FAILED with the reason. An upgrade for the version the device is
// installing restarts that job (FIRMWARE.md), keeping the bytes it holds
// of the same image (same SHA-256); an upgrade for another version
// replaces the job; one for the version it runs is answered with its
// version and UPDATED. The optional signature is not checked. The device
// hashes as it downloads and keeps the image only with KeepImage, so that
// thousands of simulated devices do not hold a megabyte each.
//
// API:
//
//	u, err := fwdevice.New(fwdevice.Options{ProductID: p, DeviceID: d, Version: "1.0.0",
//		SecureID: id, SecureKey: key, Reboot: reconnect, Faults: fwdevice.Faults{CutAt: 0.5}})
//	u.Connected(conn) // after every connect, after the birth: subscribe + version report
//	u.Version()       // the version it runs
//	u.Close()         // cancel the running job
//
// A connection is the small interface Conn (Publish at QoS 1, Subscribe
// with a handler); Paho adapts a paho client, and bench/mqttc's TopicConn
// its lightweight one (its Handle is the Dial's OnMessage). Reboot is the
// caller's: drop the connection, connect again, publish the birth and call
// Connected, which reports the version; without Reboot the device reports
// its version on the connection it has. Faults (each optional): FailAt a
// state with a reason, StallAt a state (reports it, then nothing), CutAt a
// fraction of the first download (the HTTP connection is closed there,
// once, and the download resumes with a range request), RebootOld (once:
// UPDATING, then back on the old version, then a false UPDATED that
// devicehub must not believe), WrongHash (verification fails); Times
// limits FailAt, StallAt and WrongHash to the first jobs so that a retry
// succeeds.
//
// It imports the MQTT client it adapts (paho) and nothing
// of devicehub's server: it speaks only the protocol's topics, JSON and
// HTTP. It delivers nothing that must survive a restart: a device's state
// is its running version, reported after every connect, and devicehub
// decides from that report alone whether the device is updated, so a lost
// or repeated progress report (QoS 1 may repeat) changes no outcome. The
// tests break that on purpose: RebootOld claims UPDATED on the old
// version.
package fwdevice
