package dynsec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"devicehub/ingest/wire"
)

// ServiceRole holds the rights of devicehub's own clients.
const ServiceRole = "devicehub-service"

// DeviceText is the textname of the device clients an older devicehub
// wrote into this plugin for an installation (ingest/devauth removes
// them: device logins are in devicehub's own plugin now).
func DeviceText(installation string) string { return "devicehub device " + installation }

// RoleName is the role an older devicehub gave a device's client.
func RoleName(installation, deviceID string) string {
	return "devicehub-device:" + installation + ":" + deviceID
}

// ACL is one rule of a role, as the plugin writes it.
type ACL struct {
	Type     string `json:"acltype"`
	Topic    string `json:"topic"`
	Priority int    `json:"priority"`
	Allow    bool   `json:"allow"`
}

// ServiceACLs are what devicehub's own clients need beyond the plugin
// admin role that `mosquitto_ctrl dynsec init` gives its login (subscribe
// and receive everything, $SYS, the control topic): publish downlinks, and
// the ingest sessions' backlog markers (ingest/backlog.go, to the online
// and the report level), on a device level no device id can have. The device-login plugin's control topic is
// granted by that plugin itself (ingest/devauth).
func ServiceACLs() []ACL {
	return []ACL{
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelRead), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelInvoke), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelWrite), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelShadowDelta), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelShadowGetReply), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", "+", wire.LevelFirmwareUpgrade), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", wire.MarkerDevice, wire.LevelOnline), Allow: true},
		{Type: "publishClientSend", Topic: wire.DeviceTopic("+", wire.MarkerDevice, wire.LevelReport), Allow: true},
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

// PluginClient is a client of the plugin's verbose listing.
type PluginClient struct {
	Username        string `json:"username"`
	ClientID        string `json:"clientid"`
	TextName        string `json:"textname"`
	TextDescription string `json:"textdescription"`
	Roles           []struct {
		Name string `json:"rolename"`
	} `json:"roles"`
}

func (c *PluginClient) hasRole(name string) bool {
	for _, r := range c.Roles {
		if r.Name == name {
			return true
		}
	}
	return false
}

type pluginRole struct {
	Name string `json:"rolename"`
	ACLs []ACL  `json:"acls"`
}

// listPage is how many clients one listing asks for.
const listPage = 1000

// ListClients pages through the plugin's clients, verbose.
func (cl *Client) ListClients(ctx context.Context) ([]PluginClient, error) {
	var out []PluginClient
	for offset := 0; ; offset += listPage {
		rs, err := cl.Do(ctx, Command{"command": "listClients", "verbose": true, "count": listPage, "offset": offset})
		if err != nil {
			return nil, err
		}
		if err := rs[0].Err(); err != nil {
			return nil, err
		}
		var body struct {
			TotalCount int            `json:"totalCount"`
			Clients    []PluginClient `json:"clients"`
		}
		if err := json.Unmarshal(rs[0].Data, &body); err != nil {
			return nil, fmt.Errorf("dynsec listClients: %w", err)
		}
		out = append(out, body.Clients...)
		if len(body.Clients) < listPage || offset+len(body.Clients) >= body.TotalCount {
			return out, nil
		}
	}
}

// CountClients is how many clients the plugin holds: one short listing.
func (cl *Client) CountClients(ctx context.Context) (int, error) {
	rs, err := cl.Do(ctx, Command{"command": "listClients", "verbose": false, "count": 1, "offset": 0})
	if err != nil {
		return 0, err
	}
	if err := rs[0].Err(); err != nil {
		return 0, err
	}
	var body struct {
		TotalCount int `json:"totalCount"`
	}
	if err := json.Unmarshal(rs[0].Data, &body); err != nil {
		return 0, fmt.Errorf("dynsec listClients: %w", err)
	}
	return body.TotalCount, nil
}

// serviceCommands give the service login its rights, from what the plugin
// has: whether ServiceRole exists (with acls) and the login holds it. A
// change of either makes the plugin drop the login's connections, which
// reconnect: it happens once per broker, on devicehub's first start.
func serviceCommands(username string, exists bool, acls []ACL, held bool) []Command {
	var cmds []Command
	if !exists {
		cmds = append(cmds, Command{"command": "createRole", "rolename": ServiceRole, "textname": "devicehub", "acls": ServiceACLs()})
	} else if !sameACLs(acls, ServiceACLs()) {
		cmds = append(cmds, Command{"command": "modifyRole", "rolename": ServiceRole, "acls": ServiceACLs()})
	}
	if !held {
		cmds = append(cmds, Command{"command": "addClientRole", "username": username, "rolename": ServiceRole, "priority": 1})
	}
	return cmds
}

// EnsureService gives the service login username (the one cl is
// connected with) its rights, as a devicehub leader does on start, and
// as tools and tests that use a broker before any devicehub has run do.
func EnsureService(ctx context.Context, cl *Client, username string) error {
	rs, err := cl.Do(ctx, Command{"command": "getRole", "rolename": ServiceRole},
		Command{"command": "getClient", "username": username})
	if err != nil {
		return err
	}
	var role struct {
		Role pluginRole `json:"role"`
	}
	var client struct {
		Client PluginClient `json:"client"`
	}
	exists := rs[0].Err() == nil && json.Unmarshal(rs[0].Data, &role) == nil
	if err := rs[1].Err(); err != nil {
		return err
	}
	if err := json.Unmarshal(rs[1].Data, &client); err != nil {
		return fmt.Errorf("dynsec getClient: %w", err)
	}
	cmds := serviceCommands(username, exists, role.Role.ACLs, client.Client.hasRole(ServiceRole))
	for _, c := range cmds {
		rs, err := cl.Do(ctx, c)
		if errors.Is(err, ErrConnectionLost) && c["command"] == "addClientRole" {
			// The plugin drops the login's connections, this one
			// included, once it has granted the role: before it answers.
			return nil
		}
		if err != nil {
			return err
		}
		if err := rs[0].Err(); err != nil {
			return err
		}
	}
	return nil
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
