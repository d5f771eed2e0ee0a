package main

import (
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/capi-inplace/capi-inplace/controllers/healthgate"
)

// gateOptions are the flags that fence what health gates can make the manager do on
// workload clusters (docs/upgradetask.md, "Who may define a gate").
type gateOptions struct {
	jobNamespace       string
	annotationJobGates bool
	celDeniedKinds     string
	celMaxObjects      int
}

func (o *gateOptions) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.jobNamespace, "gate-job-namespace", healthgate.DefaultJobNamespace, "the one namespace of each workload cluster where Job gates run; capi-inplace creates it when missing, labels it pod-security.kubernetes.io/enforce=restricted and creates the ServiceAccount "+healthgate.JobServiceAccount+" in it, bound to nothing. A gate that names another namespace is red")
	fs.BoolVar(&o.annotationJobGates, "allow-annotation-job-gates", false, "run Job gates of the Cluster's inplace.cluster.x-k8s.io/gates annotation; without it they are red, and only an UpgradeTask's spec.gates can run a Job")
	fs.StringVar(&o.celDeniedKinds, "gate-cel-denied-kinds", healthgate.DefaultCELDeniedKinds, "comma-separated kinds CEL gates may not read, in every version: Kind or v1/Kind for the core group, group/Kind or group/version/Kind for others; empty denies none")
	fs.IntVar(&o.celMaxObjects, "gate-cel-max-objects", healthgate.DefaultCELMaxObjects, "the most objects a CEL gate reads; a gate that selects more is red and asks for a narrower namespace or selector")
}

// policy checks the flags and returns the gates' policy.
func (o *gateOptions) policy() (*healthgate.Policy, error) {
	if errs := validation.IsDNS1123Label(o.jobNamespace); len(errs) > 0 {
		return nil, fmt.Errorf("--gate-job-namespace %q is not a namespace name: %v", o.jobNamespace, errs)
	}
	denied, err := healthgate.ParseKinds(o.celDeniedKinds)
	if err != nil {
		return nil, fmt.Errorf("--gate-cel-denied-kinds: %w", err)
	}
	if o.celMaxObjects < 1 {
		return nil, fmt.Errorf("--gate-cel-max-objects must be at least 1, got %d", o.celMaxObjects)
	}
	return &healthgate.Policy{JobNamespace: o.jobNamespace, AnnotationJobGates: o.annotationJobGates, CELDeniedKinds: denied, CELMaxObjects: o.celMaxObjects}, nil
}
