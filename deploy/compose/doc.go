// Package compose holds no code: it is the home of docker-compose.yml (a
// three-node idem region and an idemrouter on one Docker host), its
// topology.yaml, and smoke.sh, which builds the image and proves the compose
// file works: readiness, reserve / complete / replay through the router,
// writes after the leader of a shard is killed, a restart from the volume,
// and a clean drain.
//
// The test in this package runs smoke.sh only when IDEM_DOCKER_TESTS=1 (it
// needs a Docker Engine and docker compose or docker-compose), so the
// default go test ./... needs no Docker:
//
//	IDEM_DOCKER_TESTS=1 go test -v -timeout 10m ./deploy/compose
//
// It publishes the containers' ports on free 127.0.0.1 ports and runs as its
// own compose project, removed afterwards with its volumes.
package compose
