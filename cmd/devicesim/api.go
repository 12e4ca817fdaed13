package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"devicehub/bench/sim"
)

// apiClient calls devicehub's HTTP API with a token.
type apiClient struct {
	base, token string
	http        *http.Client
}

func login(ctx context.Context, base, user, password string) (*apiClient, error) {
	// A bulk create of 10,000 devices waits for the broker to hold them.
	c := &apiClient{base: base, http: &http.Client{Timeout: time.Minute}}
	var res struct {
		Token string `json:"token"`
	}
	if _, err := c.call(ctx, "POST", "/api/authorize/login", map[string]string{"username": user, "password": password}, &res); err != nil {
		return nil, fmt.Errorf("login to %s: %w", base, err)
	}
	c.token = res.Token
	return c, nil
}

// call sends a JSON request; it returns the HTTP status, and an error for
// any status but 200 and 404.
func (c *apiClient) call(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return resp.StatusCode, nil
	default:
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		var env struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			return resp.StatusCode, err
		}
		return resp.StatusCode, json.Unmarshal(env.Result, out)
	}
	return resp.StatusCode, nil
}

type deviceLogin struct {
	Configuration struct {
		SecureID  string `json:"secureId"`
		SecureKey string `json:"secureKey"`
	} `json:"configuration"`
}

// bulkMax is the most devices one bulk call takes.
const bulkMax = 10_000

// deviceLogins makes product (with thing model) and the devices of ids
// exist and deployed, and returns each device's login. The devices that
// are missing are created and deployed by the bulk API, 10,000 a call,
// their logins in its answer; those that exist get a new key (only a new
// key is ever shown: one call each) and are deployed in bulk.
func (c *apiClient) deviceLogins(ctx context.Context, product, model string, ids []string) (map[string]sim.Credential, error) {
	st, err := c.call(ctx, "GET", "/api/device-product/"+product, nil, nil)
	if err != nil {
		return nil, err
	}
	if st == http.StatusNotFound {
		if _, err := c.call(ctx, "POST", "/api/device/product", map[string]any{"id": product, "name": product,
			"classifiedId": "simulated", "modelFrom": "custom", "accessId": "mqtt", "deviceType": "device",
			"metadata": model}, nil); err != nil {
			return nil, err
		}
	}
	if _, err := c.call(ctx, "POST", "/api/device-product/"+product+"/deploy", nil, nil); err != nil {
		return nil, err
	}
	existing, err := c.existingDevices(ctx, ids)
	if err != nil {
		return nil, err
	}
	var missing, present []string
	for _, id := range ids {
		if existing[id] {
			present = append(present, id)
		} else {
			missing = append(missing, id)
		}
	}
	out := make(map[string]sim.Credential, len(ids))
	for chunk := range slices.Chunk(missing, bulkMax) {
		devs := make([]map[string]string, len(chunk))
		for i, id := range chunk {
			devs[i] = map[string]string{"id": id, "name": id, "productId": product}
		}
		var res struct {
			Devices []struct {
				ID        string `json:"id"`
				SecureID  string `json:"secureId"`
				SecureKey string `json:"secureKey"`
			} `json:"devices"`
		}
		if _, err := c.call(ctx, "POST", "/api/device/instance/batch/_create?deploy=true", devs, &res); err != nil {
			return nil, err
		}
		for _, d := range res.Devices {
			out[d.ID] = sim.Credential{SecureID: d.SecureID, SecureKey: d.SecureKey}
		}
	}
	for _, id := range present {
		var d deviceLogin
		if _, err := c.call(ctx, "POST", "/api/device/instance/"+url.PathEscape(id)+"/secret", nil, &d); err != nil {
			return nil, err
		}
		out[id] = sim.Credential{SecureID: d.Configuration.SecureID, SecureKey: d.Configuration.SecureKey}
	}
	for chunk := range slices.Chunk(present, bulkMax) {
		if _, err := c.call(ctx, "POST", "/api/device/instance/batch/_deploy", chunk, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// existingDevices returns which of ids exist, a page of 1,000 per query.
func (c *apiClient) existingDevices(ctx context.Context, ids []string) (map[string]bool, error) {
	found := make(map[string]bool, len(ids))
	for chunk := range slices.Chunk(ids, 1000) {
		var page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if _, err := c.call(ctx, "POST", "/api/device-instance/_query/", map[string]any{"pageSize": len(chunk),
			"terms": []map[string]any{{"column": "id", "termType": "in", "value": chunk}}}, &page); err != nil {
			return nil, err
		}
		for _, d := range page.Data {
			found[d.ID] = true
		}
	}
	return found, nil
}
