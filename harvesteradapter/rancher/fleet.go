package rancher

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"
)

// Fleet's local agent and its controller's configuration (rancher/fleet
// internal/cmd/controller/agentmanagement: the agent is the Deployment fleet-agent in the
// local cluster's agent namespace; fleet-controller reads its configuration from the
// ConfigMap fleet-controller, key config, in its own namespace, internal/config).
const (
	FleetLocalAgentNamespace = "cattle-fleet-local-system"
	FleetAgentDeploy         = "fleet-agent"
	FleetControllerConfigMap = "fleet-controller"
	FleetControllerConfigKey = "config"
	// FleetLocalCluster is Fleet's Cluster of the local cluster, in FleetLocal.
	FleetLocalCluster = "local"
)

// FleetAPIServer is what fleet-controller's configuration gives the agents it deploys to
// reach the cluster: the two fields the release saves before Rancher's upgrade and puts
// back after it (harvester-release-steps.md fact 16.5 and 16.16; harvester issue #6851).
type FleetAPIServer struct {
	URL string `json:"apiServerURL,omitempty"`
	CA  string `json:"apiServerCA,omitempty"`
}

// FleetConfig is fleet-controller's configuration as the ConfigMap holds it (YAML or
// JSON), every field kept.
type FleetConfig map[string]any

// ParseFleetConfig reads the ConfigMap's config value; an empty value is an empty
// configuration.
func ParseFleetConfig(raw string) (FleetConfig, error) {
	cfg := FleetConfig{}
	if raw == "" {
		return cfg, nil
	}
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
		return nil, fmt.Errorf("fleet-controller's configuration is neither YAML nor JSON: %w", err)
	}
	return cfg, nil
}

// APIServer is the configuration's apiServerURL and apiServerCA.
func (c FleetConfig) APIServer() FleetAPIServer {
	url, _ := c["apiServerURL"].(string)
	ca, _ := c["apiServerCA"].(string)
	return FleetAPIServer{URL: url, CA: ca}
}

// Has says whether the configuration has field (set, whatever its value).
func (c FleetConfig) Has(field string) bool {
	_, ok := c[field]
	return ok
}

// WithAPIServer is the configuration with the non-empty fields of s put in, rendered as
// YAML, as the release's script writes it back.
func (c FleetConfig) WithAPIServer(s FleetAPIServer) (string, error) {
	out := FleetConfig{}
	for k, v := range c {
		out[k] = v
	}
	if s.URL != "" {
		out["apiServerURL"] = s.URL
	}
	if s.CA != "" {
		out["apiServerCA"] = s.CA
	}
	raw, err := yaml.Marshal(out)
	if err != nil {
		return "", err
	}
	return string(raw), nil
}

// JSON is s as the progress ConfigMap records it.
func (s FleetAPIServer) JSON() (json.RawMessage, error) {
	return json.Marshal(s)
}
