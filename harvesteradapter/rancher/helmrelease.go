package rancher

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Rancher's system charts, which Rancher itself installs with Helm at the versions its
// build pins (rancher pkg/settings: rancher-webhook-version, fleet-version) and which a
// Harvester upgrade waits for after Rancher's (harvester-release-steps.md fact 16.11;
// the release metadata's rancherDependencies names their versions).
const (
	FleetNamespace        = "cattle-fleet-system"
	FleetChart            = "fleet"
	FleetCRDChart         = "fleet-crd"
	RancherWebhookChart   = "rancher-webhook"
	FleetControllerDeploy = "fleet-controller"
	// STVAggregationSecret is the empty Secret the release creates so that Rancher's
	// system-agent-upgrader plan is ready (fact 16.13).
	STVAggregationSecret = "stv-aggregation"
)

// HelmRelease is what the upgrade reads of one revision of a Helm release: what `helm
// history` shows. Helm 3 stores each revision in a Secret of type helm.sh/release.v1
// named sh.helm.release.v1.<name>.v<revision>, labelled owner=helm, name, status and
// version, whose data "release" is the release as JSON, gzipped, base64-encoded (helm
// pkg/storage/driver/secrets.go newSecretsObject, util.go encodeRelease).
type HelmRelease struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Version   int    `json:"version"`
	Info      struct {
		Status       string `json:"status"`
		LastDeployed string `json:"last_deployed,omitempty"`
		// Description is the revision's description (helm upgrade --description).
		Description string `json:"description,omitempty"`
	} `json:"info"`
	Chart struct {
		Metadata struct {
			Name       string `json:"name"`
			Version    string `json:"version"`
			AppVersion string `json:"appVersion,omitempty"`
		} `json:"metadata"`
	} `json:"chart"`
	// Config is the values the user set (what `helm get values` shows).
	Config map[string]any `json:"config,omitempty"`
}

// ChartRef is the chart column of `helm history`: <chart name>-<chart version>.
func (r *HelmRelease) ChartRef() string {
	return r.Chart.Metadata.Name + "-" + r.Chart.Metadata.Version
}

// HelmReleaseType is the type of the Secrets Helm 3 stores releases in.
const HelmReleaseType = "helm.sh/release.v1"

// DecodeHelmRelease reads a release Secret's data "release".
func DecodeHelmRelease(data []byte) (*HelmRelease, error) {
	raw, err := base64.StdEncoding.DecodeString(string(data))
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	// Helm gzips the JSON; it reads an unzipped one too (util.go decodeRelease).
	if bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
		r, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("not gzip: %w", err)
		}
		defer func() { _ = r.Close() }()
		if raw, err = io.ReadAll(io.LimitReader(r, 64<<20)); err != nil {
			return nil, fmt.Errorf("not gzip: %w", err)
		}
	}
	rel := &HelmRelease{}
	if err := json.Unmarshal(raw, rel); err != nil {
		return nil, fmt.Errorf("not a release: %w", err)
	}
	return rel, nil
}

// NewestHelmRelease is the newest revision of the Helm release name in namespace (what
// `helm history` lists last), or nil when Helm stores none.
func NewestHelmRelease(ctx context.Context, c client.Reader, namespace, name string) (*HelmRelease, error) {
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{"owner": "helm", "name": name}); err != nil {
		return nil, fmt.Errorf("list the Helm release %s/%s: %w", namespace, name, err)
	}
	var newest *corev1.Secret
	rev := -1
	for i := range list.Items {
		s := &list.Items[i]
		if s.Type != HelmReleaseType {
			continue
		}
		v, err := strconv.Atoi(s.Labels["version"])
		if err != nil {
			continue
		}
		if v > rev {
			newest, rev = s, v
		}
	}
	if newest == nil {
		return nil, nil
	}
	rel, err := DecodeHelmRelease(newest.Data["release"])
	if err != nil {
		return nil, fmt.Errorf("read the Helm release %s/%s revision %d (Secret %s): %w", namespace, name, rev, newest.Name, err)
	}
	if rel.Info.Status == "" {
		rel.Info.Status = newest.Labels["status"]
	}
	return rel, nil
}
