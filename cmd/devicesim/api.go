package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"devicehub/bench/sim"
)

// apiClient calls devicehub's HTTP API with a token.
type apiClient struct {
	base, token string
	http        *http.Client
}

func login(ctx context.Context, base, user, password string) (*apiClient, error) {
	c := &apiClient{base: base, http: &http.Client{Timeout: 10 * time.Second}}
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

// deviceLogins makes product (with thing model) and the devices of ids
// exist and deployed, and returns each device's login: from its creation,
// or from a new key for a device that existed.
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
	out := make(map[string]sim.Credential, len(ids))
	for _, id := range ids {
		var d deviceLogin
		st, err := c.call(ctx, "POST", "/api/device/instance/"+id+"/secret", nil, &d)
		if err != nil {
			return nil, err
		}
		if st == http.StatusNotFound {
			if _, err := c.call(ctx, "POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": product}, &d); err != nil {
				return nil, err
			}
		}
		if _, err := c.call(ctx, "POST", "/api/device/instance/"+id+"/deploy", nil, nil); err != nil {
			return nil, err
		}
		out[id] = sim.Credential{SecureID: d.Configuration.SecureID, SecureKey: d.Configuration.SecureKey}
	}
	return out, nil
}
