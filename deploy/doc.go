// Package deploy holds no code: deploy/ is the home of the container image
// (docker/), the docker compose setup and its smoke test (compose/), the
// Kubernetes manifests (kubernetes/), and the Prometheus and Grafana files
// (prometheus/, grafana/); README.md says how to use each and what has been
// verified.
//
// Its tests keep those files consistent with the code, without Docker or a
// cluster: every idem_* metric a dashboard panel or an alert queries exists
// in the code; the compose and Kubernetes topologies parse with
// topology.Parse and name exactly the services and StatefulSet pods that run
// them; and, where promtool is installed, the Prometheus configuration
// loads and the alert rules' unit tests pass.
package deploy
