package nodeupdater

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The fake client stands for a workload cluster's client: only its identity is looked at.
func TestReadSnapshot(t *testing.T) {
	if ReadSnapshotFrom(context.Background()) != nil {
		t.Fatal("a context without WithReadSnapshot carries a snapshot")
	}
	ctx := WithReadSnapshot(context.Background())
	snap := ReadSnapshotFrom(ctx)
	if snap == nil {
		t.Fatal("WithReadSnapshot's context carries no snapshot")
	}
	made := 0
	newClient := func() client.Client { made++; return fake.NewClientBuilder().Build() }
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	first := snap.WorkloadClient(a, newClient)
	if again := snap.WorkloadClient(a, newClient); again != first {
		t.Error("a second call for the same cluster made another client")
	}
	if other := snap.WorkloadClient(b, newClient); other == first {
		t.Error("another cluster got the first cluster's client")
	}
	if made != 2 {
		t.Errorf("%d clients made for 2 clusters, want 2", made)
	}
	if ReadSnapshotFrom(WithReadSnapshot(context.Background())).WorkloadClient(a, newClient) == first {
		t.Error("a new snapshot answered with an earlier snapshot's client")
	}
}
