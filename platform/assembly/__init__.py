"""The assembly floor: how `cloister serve` puts the engines, the gateway, the admin
service and the syncs between them together. It imports the services; they never
import it, and the base floor (`server/`: settings, request ids, telemetry, logging,
docs) imports neither."""
