package api

import (
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"devicehub/api/console"
	"devicehub/api/openapi"
)

// routes registers every endpoint. Spec endpoint numbers are in comments;
// each handler calls one store method, where the SQL is.
func (s *Server) routes() {
	app := s.app
	app.Get("/healthz", s.healthz) // liveness (health.go)
	app.Get("/readyz", s.readyz)   // readiness
	gatherer := s.deps.Gatherer
	if gatherer == nil {
		gatherer = prometheus.DefaultGatherer
	}
	app.Get("/metrics", adaptor.HTTPHandler(promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})))
	// /openapi.json describes every route of this function (api/openapi's
	// tests hold it to them); /docs renders it.
	openapi.Register(app)

	app.Post("/api/authorize/login", s.login)
	// Live updates (live.go): before the /api group, as the token may be a query parameter.
	app.Get("/api/live", s.requireTokenOrQuery, s.live)

	api := app.Group("/api", s.requireToken)
	api.Post("/authorize/logout", s.logout)
	api.Get("/authorize/me", s.me)

	// Products.
	api.Post("/device-product/_query", s.queryProducts)              // 1
	api.Post("/device-product/_count", s.countProducts)              // 6
	api.Get("/device-product/:id", s.getProduct)                     // 2
	api.Post("/device/product", s.write(s.createProduct))            // 3
	api.Patch("/device-product", s.write(s.patchProduct))            // 4
	api.Delete("/device-product/:id", s.write(s.deleteProduct))      // 5
	api.Post("/device-product/:id/deploy", s.write(s.deployProduct)) // lifecycle
	api.Post("/device-product/:id/undeploy", s.write(s.undeployProduct))

	// Devices.
	api.Post("/device-instance/_query", s.queryDevices)                    // 7
	api.Get("/device/instance/:id/detail", s.getDevice)                    // 8
	api.Put("/device/instance/:id/metadata", s.write(s.setDeviceMetadata)) // 9
	api.Delete("/device/instance/:id/metadata", s.write(s.resetDeviceMetadata))
	api.Post("/device/instance", s.write(s.createDevice)) // lifecycle
	api.Get("/device/instance/:id", s.getDevice)
	api.Put("/device/instance/:id", s.write(s.updateDevice))
	api.Delete("/device/instance/:id", s.write(s.deleteDevice))
	api.Post("/device/instance/:id/deploy", s.write(s.deployDevice))
	api.Post("/device/instance/:id/undeploy", s.write(s.undeployDevice))
	api.Post("/device/instance/:id/secret", s.write(s.rotateDeviceSecret))
	// Bulk provisioning (devices_bulk.go): many devices in one transaction.
	api.Post("/device/instance/batch/_create", s.write(s.createDevices))
	api.Post("/device/instance/batch/_deploy", s.write(s.deployDevices))
	api.Post("/device/instance/batch/_undeploy", s.write(s.undeployDevices))
	api.Post("/device/instance/batch/_delete", s.write(s.deleteDevices))
	api.Post("/device/instance/:productId/import", s.write(s.importDevices))

	// Roles.
	api.Post("/role/_query", s.queryRoles) // 13

	// Device commands.
	api.Get("/device/standard/:deviceId/property/:property", s.readProperty)     // 10
	api.Post("/device/instance/:deviceId/properties/_read", s.readProperties)    // 11
	api.Post("/device/invoked/:deviceId/function/:functionId", s.invokeFunction) // 12

	// Dashboard.
	api.Post("/dashboard/_multi", s.dashboardMulti) // 14
	// One query of endpoint 14 as a CSV or JSON-lines file, streamed (export.go).
	api.Post("/dashboard/_export", s.dashboardExport)

	// The web console: / and /assets/* (api/console); nothing under /api.
	console.Register(app)

	// Anything else, under /api or not, is not_found in the envelope.
	app.Use(func(c *fiber.Ctx) error { return fiber.ErrNotFound })
}

// write wraps a handler that changes products or devices: cached device
// references and product thing models are forgotten after it, whatever
// its outcome.
func (s *Server) write(h fiber.Handler) fiber.Handler {
	return func(c *fiber.Ctx) error {
		defer s.refs.clear()
		defer s.models.clear()
		return h(c)
	}
}
