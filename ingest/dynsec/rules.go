package dynsec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	"devicehub/meta"
)

// ServiceRole holds the rights of devicehub's own clients.
const (
	ServiceRole        = "devicehub-service"
	deviceRolePriority = 0
)

// scope names what one deployment (one PostgreSQL database, its
// installation id) writes into the plugin: its device clients' textname
// and its device roles' prefix carry the id. Clients and roles outside it
// (the admin login, gateways, an operator's own, another deployment's
// devices on a shared broker) are never changed.
type scope struct{ text, rolePrefix string }

func newScope(installation string) scope {
	return scope{text: DeviceText(installation), rolePrefix: "devicehub-device:" + installation + ":"}
}

// DeviceText is the textname of the device clients of an installation.
func DeviceText(installation string) string { return "devicehub device " + installation }

// RoleName is the plugin role holding a device's topic rights.
func RoleName(installation, deviceID string) string {
	return newScope(installation).role(deviceID)
}

func (sc scope) role(deviceID string) string { return sc.rolePrefix + deviceID }

// ACL is one rule of a role, as the plugin writes it.
type ACL struct {
	Type     string `json:"acltype"`
	Topic    string `json:"topic"`
	Priority int    `json:"priority"`
	Allow    bool   `json:"allow"`
}

// uplinks are the topics, below /{product}/{device}/, a device may publish
// on (DESIGN.md "Device state and messages").
var uplinks = []string{"properties/report", "event/#", "online", "offline",
	"properties/read/reply", "function/invoke/reply"}

// DeviceACLs are a device's rights: publish its own uplinks, subscribe
// below its own prefix (where only its downlinks are published). Device
// and product ids cannot hold MQTT wildcards (meta checks them).
func DeviceACLs(productID, deviceID string) []ACL {
	prefix := "/" + productID + "/" + deviceID + "/"
	acls := make([]ACL, 0, len(uplinks)+1)
	for _, t := range uplinks {
		acls = append(acls, ACL{Type: "publishClientSend", Topic: prefix + t, Allow: true})
	}
	return append(acls, ACL{Type: "subscribePattern", Topic: prefix + "#", Allow: true})
}

// ServiceACLs are what devicehub's own clients need beyond the plugin
// admin role that `mosquitto_ctrl dynsec init` gives its login (subscribe
// and receive everything, $SYS, the control topic): publish downlinks, and
// the ingest sessions' backlog markers (ingest/backlog.go), on a device
// level no device id can have.
func ServiceACLs() []ACL {
	return []ACL{
		{Type: "publishClientSend", Topic: "/+/+/properties/read", Allow: true},
		{Type: "publishClientSend", Topic: "/+/+/function/invoke", Allow: true},
		{Type: "publishClientSend", Topic: "/+/$devicehub/online", Allow: true},
		{Type: "subscribePattern", Topic: "#", Allow: true},
	}
}

// sameACLs reports whether a and b hold the same rules in any order.
func sameACLs(a, b []ACL) bool {
	if len(a) != len(b) {
		return false
	}
	key := func(x ACL) string { return fmt.Sprintf("%s\x00%s\x00%t\x00%d", x.Type, x.Topic, x.Allow, x.Priority) }
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		ka[i], kb[i] = key(a[i]), key(b[i])
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// Fingerprint tells, without holding the key, whether the plugin holds a
// device's current login: the client's textdescription. It is a truncated
// hash of what the plugin's own password hash already covers, so it
// reveals nothing the plugin's file does not.
func Fingerprint(d meta.DeviceLogin) string {
	h := sha256.Sum256([]byte(d.ID + "\x00" + d.SecureID + "\x00" + d.SecureKey))
	return hex.EncodeToString(h[:8])
}

// brokerDevice is what the plugin holds for one device, as far as this
// package wrote it.
type brokerDevice struct {
	username, fingerprint, productID string
}

func want(d meta.DeviceLogin) brokerDevice {
	return brokerDevice{username: d.SecureID, fingerprint: Fingerprint(d), productID: d.ProductID}
}

// createDevice are the commands that give a device its login and rights.
func (sc scope) createDevice(d meta.DeviceLogin) []Command {
	return []Command{
		{"command": "createRole", "rolename": sc.role(d.ID), "textname": sc.text,
			"acls": DeviceACLs(d.ProductID, d.ID)},
		{"command": "createClient", "username": d.SecureID, "password": d.SecureKey, "clientid": d.ID,
			"textname": sc.text, "textdescription": Fingerprint(d),
			"roles": []map[string]any{{"rolename": sc.role(d.ID), "priority": deviceRolePriority}}},
	}
}

// deleteDevice are the commands that remove a device's login (the plugin
// disconnects its sessions) and rights.
func (sc scope) deleteDevice(id, username string) []Command {
	return []Command{
		{"command": "deleteClient", "username": username},
		{"command": "deleteRole", "rolename": sc.role(id)},
	}
}

// updateDevice are the commands that move a device from what the plugin
// has to what it should have; nil when nothing differs.
func (sc scope) updateDevice(have brokerDevice, d meta.DeviceLogin) []Command {
	w := want(d)
	if have == w {
		return nil
	}
	var cmds []Command
	if have.productID != w.productID {
		cmds = append(cmds, Command{"command": "modifyRole", "rolename": sc.role(d.ID),
			"acls": DeviceACLs(d.ProductID, d.ID)})
	}
	switch {
	case have.username != w.username: // a new secureId: another plugin client
		cmds = append(cmds, Command{"command": "deleteClient", "username": have.username}, sc.createDevice(d)[1])
	case have.fingerprint != w.fingerprint: // a new key; the plugin disconnects the old sessions
		cmds = append(cmds, Command{"command": "modifyClient", "username": d.SecureID, "password": d.SecureKey,
			"clientid": d.ID, "textdescription": w.fingerprint})
	}
	return cmds
}

// GatewayRole may publish on every device's topics and subscribe to them:
// for a load generator or a test that plays many devices on one
// connection. No device and no devicehub client has it; AddGateway gives
// it to a login of its own.
const GatewayRole = "devicehub-gateway"

// AddGateway creates a plugin login with GatewayRole (and the role, if
// missing). Remove it with RemoveLogin.
func AddGateway(ctx context.Context, cl *Client, username, password string) error {
	rs, err := cl.Do(ctx,
		Command{"command": "createRole", "rolename": GatewayRole, "acls": []ACL{
			{Type: "publishClientSend", Topic: "/#", Allow: true},
			{Type: "subscribePattern", Topic: "/#", Allow: true},
		}},
		Command{"command": "createClient", "username": username, "password": password,
			"roles": []map[string]any{{"rolename": GatewayRole}}})
	if err != nil {
		return err
	}
	return rs[1].Err() // the role may exist already
}

// RemoveLogin deletes a plugin login; the broker drops its sessions.
func RemoveLogin(ctx context.Context, cl *Client, username string) error {
	rs, err := cl.Do(ctx, Command{"command": "deleteClient", "username": username})
	if err != nil {
		return err
	}
	return rs[0].Err()
}
