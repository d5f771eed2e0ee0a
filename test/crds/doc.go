//go:build tools

// Package crds holds CustomResourceDefinitions that the test API servers install and
// that their projects ship in no usable form: System Upgrade Controller's Plan and
// Longhorn's v1beta2 kinds. They are generated from those projects' Go types with
// controller-gen (make test-crds) and checked in; none is written by hand.
package crds

import (
	_ "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	_ "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
)
