package nodeprogram

import (
	"context"
	"errors"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// runClusterUpgrade is `node cluster-upgrade`: the cluster-level Harvester upgrade
// (harvesteradapter/clusterupgrade), run in a Job on the workload cluster with the Job's
// service account. Every input is a flag; see clusterupgrade.BindFlags.
func runClusterUpgrade(ctx context.Context, env *Env, args []string) error {
	var in clusterupgrade.Input
	var p clusterupgrade.Progress
	fs := newFlagSet(env, "cluster-upgrade")
	clusterupgrade.BindFlags(fs, &in, &p)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := errors.Join(in.Validate(), p.Validate()); err != nil {
		return usagef("%v", err)
	}
	newClient := env.Client
	if newClient == nil {
		newClient = inClusterClient
	}
	c, err := newClient()
	if err != nil {
		return retryf("reach the API server: %w", err)
	}
	p.Log = env.Stdout
	if err := clusterupgrade.Run(ctx, c, in, p); err != nil {
		return err
	}
	return nil
}

// ClusterScheme knows the kinds `node cluster-upgrade` reads and writes: the built-in
// ones, CustomResourceDefinitions (Longhorn's storage migration), Rancher's
// (harvesteradapter/rancher) and Harvester's Setting (harvesteradapter/harvesterapi).
func ClusterScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := rancher.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := harvesterapi.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// inClusterClient is a client of the API server of the cluster the pod runs in, as its
// service account.
func inClusterClient() (client.Client, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration: %w", err)
	}
	s, err := ClusterScheme()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}
