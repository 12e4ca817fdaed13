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
// each handler calls one store method, where the SQL is. Beside each
// route under /api is what it needs (permissions.go): s.need(permission),
// or s.signedIn() for a live token only; the routes before the token
// check need nothing (permissions_test.go lists them as public, and walks
// every route with each built-in role).
func (s *Server) routes() {
	app := s.app
	app.Hooks().OnRoute(s.access.onRoute) // records each route's declaration
	app.Get("/healthz", s.healthz)        // liveness (health.go)
	app.Get("/readyz", s.readyz)          // readiness
	gatherer := s.deps.Gatherer
	if gatherer == nil {
		gatherer = prometheus.DefaultGatherer
	}
	// Only to allowed addresses or with the metrics token (server.go metricsAccess).
	app.Get("/metrics", s.metricsAccess, adaptor.HTTPHandler(promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})))
	// /openapi.json describes every route of this function (api/openapi's
	// tests hold it to them); /docs renders it.
	openapi.Register(app)

	app.Post("/api/authorize/login", s.audited, s.login) // every attempt is audited (audit.go)
	// Live updates (live.go): before the /api group, as the token may be a query parameter.
	app.Get("/api/live", s.requireTokenOrQuery, s.need(permDeviceRead), s.live)

	// A device downloads a firmware package with its own credentials
	// (HTTP Basic) and a link made for it (firmware.go): no token.
	app.Get("/firmware/download/:token", s.downloadFirmware)

	// Every write under /api is audited once answered (audit.go).
	api := app.Group("/api", s.requireToken, s.audited)
	api.Post("/authorize/logout", s.signedIn(), s.logout)
	api.Get("/authorize/me", s.signedIn(), s.me)   // the user, its roles and permissions
	api.Get("/settings", s.signedIn(), s.settings) // the platform's time zone (settings.go)

	// Products.
	api.Post("/device-product/_query", s.need(permProductRead), s.queryProducts)               // 1
	api.Post("/device-product/_count", s.need(permProductRead), s.countProducts)               // 6
	api.Get("/device-product/:id", s.need(permProductRead), s.getProduct)                      // 2
	api.Post("/device/product", s.need(permProductWrite), s.write(s.createProduct))            // 3
	api.Patch("/device-product", s.need(permProductWrite), s.write(s.patchProduct))            // 4
	api.Delete("/device-product/:id", s.need(permProductWrite), s.write(s.deleteProduct))      // 5
	api.Post("/device-product/:id/deploy", s.need(permProductWrite), s.write(s.deployProduct)) // lifecycle
	api.Post("/device-product/:id/undeploy", s.need(permProductWrite), s.write(s.undeployProduct))

	// Devices. A device's secureKey is shown where it is made (creation,
	// rotation) only to a caller with device:secret (devices.go).
	api.Post("/device-instance/_query", s.need(permDeviceRead), s.queryDevices)                     // 7
	api.Get("/device/instance/:id/detail", s.need(permDeviceRead), s.getDevice)                     // 8
	api.Put("/device/instance/:id/metadata", s.need(permDeviceWrite), s.write(s.setDeviceMetadata)) // 9
	api.Delete("/device/instance/:id/metadata", s.need(permDeviceWrite), s.write(s.resetDeviceMetadata))
	api.Post("/device/instance", s.need(permDeviceWrite), s.write(s.createDevice)) // lifecycle
	api.Get("/device/instance/:id", s.need(permDeviceRead), s.getDevice)
	api.Put("/device/instance/:id", s.need(permDeviceWrite), s.write(s.updateDevice))
	api.Delete("/device/instance/:id", s.need(permDeviceWrite), s.write(s.deleteDevice))
	api.Post("/device/instance/:id/deploy", s.need(permDeviceWrite), s.write(s.deployDevice))
	api.Post("/device/instance/:id/undeploy", s.need(permDeviceWrite), s.write(s.undeployDevice))
	api.Post("/device/instance/:id/secret", s.need(permDeviceSecret), s.write(s.rotateDeviceSecret))
	// Bulk provisioning (devices_bulk.go): many devices in one transaction.
	api.Post("/device/instance/batch/_create", s.need(permDeviceWrite), s.write(s.createDevices))
	api.Post("/device/instance/batch/_deploy", s.need(permDeviceWrite), s.write(s.deployDevices))
	api.Post("/device/instance/batch/_undeploy", s.need(permDeviceWrite), s.write(s.undeployDevices))
	api.Post("/device/instance/batch/_delete", s.need(permDeviceWrite), s.write(s.deleteDevices))
	api.Post("/device/instance/:productId/import", s.need(permDeviceWrite), s.write(s.importDevices))

	// Roles, with the permissions each grants and its products (roles.go).
	api.Post("/role/_query", s.need(permUserAdmin), s.queryRoles) // 13
	// Not with an API key (keys.go loginOnly), as no user administration.
	api.Post("/role", s.need(permUserAdmin), loginOnly("manage roles"), s.createRole)
	api.Put("/role/:id", s.need(permUserAdmin), loginOnly("manage roles"), s.updateRole)
	api.Delete("/role/:id", s.need(permUserAdmin), loginOnly("manage roles"), s.deleteRole)

	// Users (users.go). /user/passwd before /user/:id, which would take it.
	api.Post("/user/_query", s.need(permUserAdmin), s.queryUsers)
	api.Post("/user", s.need(permUserAdmin), s.createUser)
	api.Put("/user/passwd", s.signedIn(), s.changeOwnPassword)
	api.Put("/user/:id", s.need(permUserAdmin), s.updateUser)
	api.Delete("/user/:id", s.need(permUserAdmin), s.deleteUser)
	api.Put("/user/:id/password", s.need(permUserAdmin), s.resetPassword)

	// API keys for programs (keys.go): one's own; an administrator's, anyone's.
	api.Post("/user/key", s.signedIn(), s.createKey)
	api.Post("/user/key/_query", s.signedIn(), s.queryKeys)
	api.Delete("/user/key/:id", s.signedIn(), s.deleteKey)

	// The audit trail of writes and logins (audit.go), newest first.
	api.Post("/audit/_query", s.need(permUserAdmin), s.queryAudit)

	// Device commands.
	api.Get("/device/standard/:deviceId/property/:property", s.need(permDeviceCommand), s.readProperty)     // 10
	api.Post("/device/instance/:deviceId/properties/_read", s.need(permDeviceCommand), s.readProperties)    // 11
	api.Post("/device/invoked/:deviceId/function/:functionId", s.need(permDeviceCommand), s.invokeFunction) // 12
	// Property writes (property_write.go): WRITE_PROPERTY, answered like reads.
	api.Put("/device/instance/:deviceId/property", s.need(permDeviceCommand), s.writeProperties)
	// Desired state (shadow.go): read with device:read, set with device:write.
	api.Get("/device/instance/:id/shadow", s.need(permDeviceRead), s.getShadow)
	api.Put("/device/instance/:id/shadow", s.need(permDeviceWrite), s.putShadow)
	api.Post("/device/instance/batch/_shadow", s.need(permDeviceWrite), s.bulkShadow)
	api.Get("/device-product/:id/shadow", s.need(permProductRead), s.getShadowSettings)
	api.Put("/device-product/:id/shadow", s.need(permProductWrite), s.putShadowSettings)

	// Dashboard.
	api.Post("/dashboard/_multi", s.need(permDashboardRead), s.dashboardMulti) // 14
	// One query of endpoint 14 as a CSV or JSON-lines file, streamed (api/dashboard/export.go).
	api.Post("/dashboard/_export", s.need(permDashboardRead), s.dashboardExport)

	// Firmware updates (firmware.go): read with device:read, written with
	// firmware:write, product-scoped like the rest.
	api.Post("/firmware/package", s.need(permFirmwareWrite), s.uploadFirmware)
	api.Get("/firmware/package", s.need(permDeviceRead), s.listFirmware)
	api.Get("/firmware/package/:id", s.need(permDeviceRead), s.getFirmware)
	api.Delete("/firmware/package/:id", s.need(permFirmwareWrite), s.deleteFirmware)
	api.Post("/firmware/rollout", s.need(permFirmwareWrite), s.createRollout)
	api.Get("/firmware/rollout", s.need(permDeviceRead), s.listRollouts)
	api.Get("/firmware/rollout/:id", s.need(permDeviceRead), s.getRollout)
	api.Get("/firmware/rollout/:id/counts", s.need(permDeviceRead), s.rolloutCounts)
	api.Get("/firmware/rollout/:id/devices", s.need(permDeviceRead), s.rolloutDevices)
	api.Get("/firmware/rollout/:id/failed", s.need(permDeviceRead), s.rolloutFailed)
	api.Post("/firmware/rollout/:id/_pause", s.need(permFirmwareWrite), s.rolloutAction(FirmwareService.Pause))
	api.Post("/firmware/rollout/:id/_resume", s.need(permFirmwareWrite), s.rolloutAction(FirmwareService.Resume))
	api.Post("/firmware/rollout/:id/_cancel", s.need(permFirmwareWrite), s.rolloutAction(FirmwareService.Cancel))
	api.Get("/device/instance/:id/firmware", s.need(permDeviceRead), s.deviceFirmware)

	// Alarm rules and records (alarms.go), product-scoped like the rest.
	api.Post("/alarm/config/_query", s.need(permAlarmRead), s.queryAlarmRules)
	api.Get("/alarm/config/_export/:productId", s.need(permAlarmRead), s.exportAlarmRules)
	api.Post("/alarm/config/_import/:productId", s.need(permRuleWrite), s.importAlarmRules)
	api.Get("/alarm/config/:id", s.need(permAlarmRead), s.getAlarmRule)
	api.Post("/alarm/config", s.need(permRuleWrite), s.createAlarmRule)
	api.Put("/alarm/config/:id", s.need(permRuleWrite), s.updateAlarmRule)
	api.Delete("/alarm/config/:id", s.need(permRuleWrite), s.deleteAlarmRule)
	api.Post("/alarm/config/:id/_enable", s.need(permRuleWrite), s.enableAlarmRule)
	api.Post("/alarm/config/:id/_disable", s.need(permRuleWrite), s.disableAlarmRule)
	api.Post("/alarm/record/_query", s.need(permAlarmRead), s.queryAlarmRecords)
	api.Get("/alarm/record/_active", s.need(permAlarmRead), s.activeAlarms)
	api.Get("/alarm/record/:id", s.need(permAlarmRead), s.getAlarmRecord)
	api.Post("/alarm/record/:id/_ack", s.need(permAlarmWrite), s.ackAlarm)
	api.Post("/alarm/record/:id/_clear", s.need(permAlarmWrite), s.clearAlarm)
	// Notifications (notify.go): channels, subscriptions, dead letters.
	api.Post("/notify/channel/_query", s.need(permNotifyAdmin), s.queryChannels)
	api.Post("/notify/channel", s.need(permNotifyAdmin), s.write(s.createChannel))
	api.Put("/notify/channel/:id", s.need(permNotifyAdmin), s.write(s.updateChannel))
	api.Delete("/notify/channel/:id", s.need(permNotifyAdmin), s.write(s.deleteChannel))
	api.Post("/notify/channel/:id/_test", s.need(permNotifyAdmin), s.write(s.testChannel))
	api.Post("/notify/subscription/_query", s.need(permNotifyAdmin), s.querySubscriptions)
	api.Post("/notify/subscription", s.need(permNotifyAdmin), s.write(s.createSubscription))
	api.Put("/notify/subscription/:id", s.need(permNotifyAdmin), s.write(s.updateSubscription))
	api.Delete("/notify/subscription/:id", s.need(permNotifyAdmin), s.write(s.deleteSubscription))
	api.Post("/notify/dead/_query", s.need(permNotifyAdmin), s.queryDead)
	api.Post("/notify/dead/:id/_replay", s.need(permNotifyAdmin), s.write(s.replayDead))
	// Forwarding rules (forward.go): telemetry to webhooks and brokers.
	api.Post("/notify/forward/_query", s.need(permNotifyAdmin), s.queryForwards)
	api.Post("/notify/forward", s.need(permNotifyAdmin), s.createForward)
	api.Get("/notify/forward/:id", s.need(permNotifyAdmin), s.getForward)
	api.Put("/notify/forward/:id", s.need(permNotifyAdmin), s.updateForward)
	api.Delete("/notify/forward/:id", s.need(permNotifyAdmin), s.deleteForward)
	api.Post("/notify/forward/:id/_enable", s.need(permNotifyAdmin), s.enableForward)
	api.Post("/notify/forward/:id/_disable", s.need(permNotifyAdmin), s.disableForward)

	// The web console: / and /assets/* (api/console); nothing under /api.
	console.Register(app)

	// Anything else, under /api or not, is not_found in the envelope.
	app.Use(func(c *fiber.Ctx) error { return fiber.ErrNotFound })
	if s.access.pending != "" {
		panic("api: access " + s.access.pending + " declared with no route after it")
	}
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
