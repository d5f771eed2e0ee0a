//go:build tools

// Package tools pins Helm's command, which the tests run as the helm binary that Rancher's
// system-agent-installer-rancher image ships (see the Makefile's helm target).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
