package devauth

import (
	"context"
	"fmt"

	"devicehub/ingest/dynsec"
	"devicehub/meta"
)

// Moving over from the dynamic-security plugin. An older devicehub kept a
// client per deployed device there (textname dynsec.DeviceText, a role of
// its own). The broker asks devicehub's plugin first, and it answers for
// every username it holds, so a legacy client of a device that is still
// deployed under the same username is never consulted: it stays, and no
// connected device is disturbed (deleting a dynamic-security client
// disconnects its username's sessions and rewrites that plugin's whole
// file). A legacy client whose username devicehub's plugin does not hold
// (the device was undeployed, deleted or given another secureId) would
// still admit the device, so it is removed: at the first full sync for
// those already stale, and by retireLegacy as soon as a device's login
// changes.

// migrate lists the legacy device clients, removes the stale ones and
// remembers the rest (f.legacy).
func (f *feed) migrate(ctx context.Context, ds *dynsec.Client) error {
	s := f.s
	lctx, cancel := context.WithTimeout(ctx, 3*s.opt.Timeout)
	clients, err := ds.ListClients(lctx)
	cancel()
	if err != nil {
		return err
	}
	s.mu.Lock()
	text := dynsec.DeviceText(s.inst)
	s.mu.Unlock()
	legacy := map[string]string{} // device id -> username
	for _, c := range clients {
		if c.TextName == text && c.ClientID != "" {
			legacy[c.ClientID] = c.Username
		}
	}
	f.mu.Lock()
	f.legacy = legacy
	f.mu.Unlock()
	if len(legacy) == 0 {
		return nil
	}
	ids := make([]string, 0, len(legacy))
	for id := range legacy {
		ids = append(ids, id)
	}
	logins, err := s.src.DeviceLogins(ctx, ids)
	if err != nil {
		return err
	}
	now := make(map[string]meta.DeviceLogin, len(logins))
	for _, d := range logins {
		now[d.ID] = d
	}
	s.log.Info("devauth: the dynamic-security plugin holds device clients of an older devicehub", "clients", len(legacy))
	return f.retireLegacy(ctx, ds, ids, now)
}

// retireLegacy removes the legacy clients of the devices of ids that
// devicehub's plugin no longer holds under the legacy username (now: what
// meta says of them; absent means deleted).
func (f *feed) retireLegacy(ctx context.Context, ds *dynsec.Client, ids []string, now map[string]meta.DeviceLogin) error {
	s := f.s
	f.mu.Lock()
	var stale []string
	for _, id := range ids {
		u, ok := f.legacy[id]
		if !ok {
			continue
		}
		if d, ok := now[id]; ok && d.Deployed && d.SecureID == u {
			continue
		}
		stale = append(stale, id)
	}
	f.mu.Unlock()
	s.mu.Lock()
	inst := s.inst
	s.mu.Unlock()
	for _, id := range stale {
		f.mu.Lock()
		u := f.legacy[id]
		f.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
		rs, err := ds.Do(cctx, dynsec.Command{"command": "deleteClient", "username": u},
			dynsec.Command{"command": "deleteRole", "rolename": dynsec.RoleName(inst, id)})
		cancel()
		if err != nil {
			return err
		}
		if err := rs[0].Err(); err != nil {
			return fmt.Errorf("device %s: %w", id, err)
		}
		f.mu.Lock()
		delete(f.legacy, id)
		f.mu.Unlock()
		s.log.Info("devauth: removed a device's dynamic-security client", "device", id)
	}
	return nil
}
