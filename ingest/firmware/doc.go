// Package firmware owns firmware updates: packages (a product's firmware
// files, their size and SHA-256 computed on upload, stored in a
// directory, Files), rollouts (which devices, at what pace, when to stop
// on failures, per-device timeout and retries, paused, canceled), each
// device's job in a rollout (QUEUED, INITIATED, DOWNLOADING, DOWNLOADED,
// VERIFIED, UPDATING, UPDATED, FAILED, TIMED_OUT, CANCELED), the version
// each device reports, the engine that drives the jobs, and the signed,
// per-device download links (Signer). The protocol is README "Firmware
// updates"; the tables are schema/postgres 00025-00027.
//
// It must not import api or ingest (ingest calls it through the small
// interface ingest.FirmwareHook; api through its own FirmwareService). It
// uses meta (the database, the advisory lock, the device query
// compiler), ingest/leader (the engine's turns as the one owner),
// ingest/link (sending the upgrade) and ingest/wire (topics and the
// decoded reports).
//
// The target version is each device's desired firmware, as a shadow's
// desired state is its desired properties (ingest/shadow), and the same
// ideas carry it: what is desired is committed in PostgreSQL before
// anything is sent; what the device reports is stored as it arrives
// (device_firmware, as a shadow's reported values are what ClickHouse
// holds); the difference is worked on whenever either changes, and again
// when the device connects. It is not kept in device_shadows: a version
// is not a property of the thing model a device writes to itself on a
// delta; reaching it is a job of several steps (a download, a check, a
// reboot) that takes minutes, is paced across a fleet and may fail, so a
// job with its own states replaces the shadow's one-message delta.
//
// Why no device is started twice and none is lost, across restarts and
// instances:
//   - One engine at a time. Every instance runs Run, which waits for the
//     PostgreSQL advisory lock (meta.Store.Lock, as ingest/alarm's runner
//     and ingest/devauth's leader); the holder claims a new epoch
//     (firmware_owner, Claim). A start is made in a transaction that reads
//     the epoch FOR SHARE and refuses when it is not its own (ErrNotOwner),
//     so an owner that lost its lock without knowing (its session cut)
//     starts nothing once the next owner claimed: the pace of a rollout is
//     kept by one owner, never two side by side. Expiry and the end of a
//     rollout carry the same check.
//   - A start is a state change of one row, QUEUED to INITIATED, in a
//     statement whose condition is state = 'QUEUED', re-checked on the
//     locked row: two starts of one device, whatever made them, cannot
//     both change it; each change is one upgrade sent.
//   - Committed before sent. The upgrade goes out after the start's
//     commit, with the deadline the commit set (now + the rollout's
//     timeout). An owner that dies (or whose publish fails) between the
//     two leaves a job INITIATED whose upgrade was never sent: its
//     deadline is in PostgreSQL, so the next owner times it out and starts
//     it again (QUEUED, then INITIATED with attempts + 1) while retries are
//     left; a device is never left waiting for an upgrade that no instance
//     remembers. A sent upgrade that a device misses is the same case.
//     The device treats a second upgrade for the version it is already
//     installing as a restart of that job (the protocol), so a retry is
//     harmless when the first did arrive.
//   - Reports are stored before they are acknowledged. Ingest hands
//     progress and version reports to Service.Progress and Version and
//     acknowledges them on the broker only when the store committed them.
//     A worker stores what is queued in batches that hold one report per
//     device (a device's second report first commits the batch before
//     it), its progress reports in one statement and its version reports
//     in one transaction (ProgressBatch, VersionBatch); every report of a
//     batch is acknowledged once both committed, and batches commit one
//     after another, so a device's reports are applied in the order it
//     sent them (TestProgressBatched, TestVersionBatched). A report is
//     not lost: it is retried with backoff while PostgreSQL is away, and a
//     stopped instance leaves it unacknowledged, so the broker delivers it
//     again to the next session (this instance's or another's). It is not
//     doubled in effect: a batch whose progress committed and whose
//     versions did not (an instance stopped between) is delivered again
//     whole, and a report applied twice, with no report of its device
//     between (one per device a batch), changes nothing more: a progress
//     sets the state it names; a version sets the device's version and
//     UPDATED or, once, moves a begun job back to QUEUED (the second finds
//     it QUEUED, which a version other than the target leaves alone).
//   - A device counts UPDATED only when it reports the target version on
//     firmware/version; its own UPDATED on progress leaves the job
//     UPDATING (reported UPDATED). A device that reports another version
//     after it began the job (it booted its old image, or lost power) is
//     QUEUED again, counted as an attempt; one offline stays QUEUED, as the
//     pace starts only devices that meta says are online, and is started
//     once its birth made it online.
//
// A download link (Signer) binds its device, its package and an expiry,
// and carries a digest of the device's secureId and secureKey as the
// start read them (HMAC with the token key, 128 bits): a download whose
// HTTP Basic auth matches it is the device's, checked without reading
// PostgreSQL; the package's file is read once per package and 2 s
// (PackageFile). Credentials that do not match are looked up (bounded,
// Options.Lookups): another device's are refused (403), wrong ones 401,
// and the device's current ones accepted, so a link keeps working for a
// device whose key was rotated after it was signed. The key it was
// signed with keeps working with that link, and a deleted device's
// links for their package, until the link expires (URLLifetime, 1 h by
// default, or the rollout's timeout): accepted, as the link gives only
// that device's package, and a rotation that must cut a leaked key off
// at once is a matter for the broker's login (meta), where the key
// gives far more. A link of the format before the digest is read
// without one and checked by a lookup: links in flight while instances
// are upgraded keep working until they expire.
//
// An upload is streamed to disk, never held in memory (Files.Stage): its
// body goes to a temporary file of its own in the package directory
// (os.CreateTemp, so uploads at once never share a name; the same file
// system, so its rename is atomic), its size and SHA-256 computed on the
// way, and it stops reading past the largest size. The file is renamed
// to its package's name inside the transaction that inserts the row,
// after the insert and before the commit (Store.CreatePackage): a
// refused insert (a duplicate version, an unknown product) places no
// file and removes the temporary one; a failed commit removes the placed
// one. So no row is committed without its file, which downloads would
// answer with an error for as long as the row lives, and no file is
// left by a refusal. The one window left is a crash between the rename
// and the commit: it leaves a file no row names, never served and
// harmless but for its space, the lesser of the two (a temporary file
// left by a crash mid-upload is the same case).
//
// TestStartsOnceAcrossOwners breaks the first two points on purpose (two
// owners, then the same epoch twice, starting one rollout side by side);
// TestStartLostBeforeSend breaks the third (an owner stops between commit
// and send).
package firmware
