package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/link"
	"devicehub/meta"
	"devicehub/schema"
)

// Commander sends commands to connected devices (link.Commands). Each
// call ends within its command timeout whatever ctx says, which matters
// here: fasthttp does not cancel a request's context when the client
// goes away.
type Commander interface {
	ReadProperties(ctx context.Context, t link.Target, properties []string, timeout time.Duration) (map[string]any, error)
	InvokeFunction(ctx context.Context, t link.Target, functionID string, inputs []link.Input) (string, error)
}

const (
	minCommandTimeout = 100 * time.Millisecond
	maxCommandTimeout = 60 * time.Second
	maxReadProperties = 256
)

// commandTarget resolves the device and its product for the downlink;
// without a device link it returns the device with link.ErrOffline.
func (s *Server) commandTarget(c *fiber.Ctx) (meta.DeviceRef, link.Target, error) {
	dev, err := s.deviceRef(c.UserContext(), c.Params("deviceId")) // within the caller's products
	if err != nil {
		return meta.DeviceRef{}, link.Target{}, err
	}
	if s.deps.Commands == nil { // a server without a device link reaches no device
		return dev, link.Target{}, link.ErrOffline
	}
	return dev, link.Target{
		DeviceID: dev.ID, DeviceName: dev.Name, ProductID: dev.ProductID,
		ProductName: dev.ProductName, CreatorID: dev.CreatorID,
	}, nil
}

// commandTimeout reads the optional ?timeout= (ms); 0 means the default.
func commandTimeout(c *fiber.Ctx) (time.Duration, error) {
	raw := c.Query("timeout")
	if raw == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(raw, 10, 64)
	d := time.Duration(ms) * time.Millisecond
	if err != nil || d < minCommandTimeout || d > maxCommandTimeout {
		return 0, schema.Invalid("timeout", "must be milliseconds from %d to %d", minCommandTimeout.Milliseconds(), maxCommandTimeout.Milliseconds())
	}
	return d, nil
}

// readProperty is endpoint 10: GET /api/device/standard/{deviceId}/property/{property}.
func (s *Server) readProperty(c *fiber.Ctx) error {
	property := c.Params("property")
	if property == "" || len(property) > 64 {
		return schema.Invalid("property", "must be a property id of 1 to 64 characters")
	}
	values, err := s.read(c, []string{property}, func(int) string { return "property" })
	if err != nil {
		return err
	}
	out := map[string]any{}
	if v, ok := values[property]; ok {
		out[property] = v
	}
	return ok(c, out)
}

// readProperties is endpoint 11: POST /api/device/instance/{deviceId}/properties/_read.
func (s *Server) readProperties(c *fiber.Ctx) error {
	var props []string
	if len(c.Body()) > 0 {
		if err := decodeJSON(c, &props); err != nil {
			return err
		}
	}
	if len(props) > maxReadProperties {
		return schema.Invalid("body", "at most %d properties", maxReadProperties)
	}
	for i, p := range props {
		if p == "" || len(p) > 64 {
			return schema.Invalid(fmt.Sprintf("[%d]", i), "must be a property id of 1 to 64 characters")
		}
	}
	values, err := s.read(c, props, func(i int) string { return fmt.Sprintf("[%d]", i) })
	if err != nil {
		return err
	}
	return ok(c, values)
}

// modelDefines refuses (400 naming it) a property that the device's
// thing model in force does not define: a read of it could only come
// back empty, which reads as "no value" rather than "no such property".
// field(i) names props[i] in the error.
func modelDefines(metadata string, props []string, field func(i int) string) error {
	m := schema.EmptyThingModel()
	if metadata != "" {
		var err error
		if m, err = schema.ParseThingModelString(metadata); err != nil {
			return fmt.Errorf("device thing model: %w", err)
		}
	}
	for i, p := range props {
		if _, ok := m.Property(p); !ok {
			return schema.Invalid(field(i), "%q is not a property of the device's thing model", p)
		}
	}
	return nil
}

// read reads props of the path's device; field(i) names props[i] in errors.
func (s *Server) read(c *fiber.Ctx, props []string, field func(i int) string) (map[string]any, error) {
	timeout, err := commandTimeout(c)
	if err != nil {
		return nil, err
	}
	dev, target, err := s.commandTarget(c)
	if err != nil && !errors.Is(err, link.ErrOffline) {
		return nil, err
	}
	// The property before the device's state: a read of a property the
	// model lacks is refused whether the device is connected or not.
	if dev.ID != "" {
		if err := modelDefines(dev.Metadata, props, field); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	return s.deps.Commands.ReadProperties(c.UserContext(), target, props, timeout)
}

// deviceCtrl is the body of endpoint 12.
type deviceCtrl struct {
	Location  *string `json:"Location"`
	ProductID *string `json:"ProductID"`
	OperCode  *struct {
		Switch      *string          `json:"Switch"`
		Temperature *json.RawMessage `json:"Temperature"`
	} `json:"OperCode"`
}

// invokeFunction is endpoint 12: POST /api/device/invoked/{deviceId}/function/{functionId}.
// It answers 200 request_handling as soon as the command is sent.
func (s *Server) invokeFunction(c *fiber.Ctx) error {
	if fn := c.Params("functionId"); fn != "DeviceCtrl" {
		return schema.Invalid("functionId", "must be DeviceCtrl (got %q)", safeText(fn))
	}
	var body deviceCtrl
	if err := decodeJSON(c, &body); err != nil {
		return err
	}
	temp, err := body.validate()
	if err != nil {
		return err
	}
	dev, target, err := s.commandTarget(c)
	if err != nil {
		return err
	}
	if !dev.Regulator {
		return schema.Invalid("deviceId", "device %q is not a controller (its product is not a regulator)", dev.ID)
	}
	id, err := s.deps.Commands.InvokeFunction(c.UserContext(), target, "DeviceCtrl", []link.Input{
		{Name: "Location", Value: *body.Location},
		{Name: "ProductID", Value: *body.ProductID},
		{Name: "OperCode", Value: map[string]any{"Switch": *body.OperCode.Switch, "Temperature": temp}},
	})
	if err != nil {
		return err
	}
	return reply(c, fiber.StatusOK, codeRequestHandling, "command sent to the device; processing", id)
}

func (b *deviceCtrl) validate() (int64, error) {
	if b.Location == nil || *b.Location == "" || len(*b.Location) > 256 {
		return 0, schema.Invalid("Location", "is required (at most 256 characters)")
	}
	if b.ProductID == nil || *b.ProductID == "" || len(*b.ProductID) > 64 {
		return 0, schema.Invalid("ProductID", "is required (at most 64 characters)")
	}
	if b.OperCode == nil {
		return 0, schema.Invalid("OperCode", "is required")
	}
	if b.OperCode.Switch == nil || (*b.OperCode.Switch != "0" && *b.OperCode.Switch != "1") {
		return 0, schema.Invalid("OperCode.Switch", `must be "0" (off) or "1" (on)`)
	}
	if b.OperCode.Temperature == nil {
		return 0, schema.Invalid("OperCode.Temperature", "is required")
	}
	var t int64
	if err := json.Unmarshal(*b.OperCode.Temperature, &t); err != nil {
		return 0, schema.Invalid("OperCode.Temperature", "must be an integer")
	}
	if t < -100 || t > 200 {
		return 0, schema.Invalid("OperCode.Temperature", "must be from -100 to 200")
	}
	return t, nil
}
