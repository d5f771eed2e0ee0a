//go:build tools

// Package tools pins the etcd that the test control plane runs (the root package of
// go.etcd.io/etcd/server/v3 is the etcd binary). A module of its own keeps etcd's
// dependency graph apart from the project's.
package tools

import _ "go.etcd.io/etcd/server/v3"
