package v1alpha1_test

import (
	"testing"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// FuzzParseUpdaterReference: any input is either refused with an error or gives a
// reference that String() writes back to the same reference. `go test` runs the seeds;
// `make fuzz` explores.
func FuzzParseUpdaterReference(f *testing.F) {
	for _, seed := range []string{
		"HarvesterUpgrader/default", "JobUpdater/kubeadm-nodes", "HarvesterUpgrader.harvester.inplace.cluster.x-k8s.io/default",
		"", "/", "a/b/c", "Kind/", "/name", " Kind/name ", "K.g/n", "Kind./name", "9x/y", "Kind/Name_1", "Ⓚind/name",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ref, err := inplacev1.ParseUpdaterReference(in)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error for %q", in)
			}
			return
		}
		if ref.Kind == "" || ref.Name == "" {
			t.Fatalf("accepted %q without kind or name: %+v", in, ref)
		}
		back, err := inplacev1.ParseUpdaterReference(ref.String())
		if err != nil || back != ref {
			t.Fatalf("%q parsed to %+v, whose String() %q parses to %+v, %v", in, ref, ref.String(), back, err)
		}
	})
}
