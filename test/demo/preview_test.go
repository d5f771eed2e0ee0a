package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// TestShowPreview checks --preview's step on a fake client, without the demo's API servers
// (a whole run takes minutes): the preview is printed with the plugin's printer when it is
// computed (the test plays the UpgradePreview controller),
// and a preview nobody computes ends the wait with a message instead of a hang.
func TestShowPreview(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := inplacev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	newClient := func() client.Client {
		return fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&inplacev1.UpgradePreview{}).Build()
	}

	t.Run("computed", func(t *testing.T) {
		c := newClient()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go playController(ctx, c)
		var out bytes.Buffer
		showPreview(ctx, c, newView(&out, false), "demo", "harvester", "v1.35.6+rke2r1", 10*time.Second)
		for _, want := range []string{"kubectl inplace preview -n demo harvester v1.35.6+rke2r1", "UpgradePreview demo/harvester-v1.35.6-rke2r1", "ORDER  MACHINE", "demo-cp-1"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the output does not say %q:\n%s", want, out.String())
			}
		}
	})

	t.Run("not computed", func(t *testing.T) {
		began := time.Now()
		var out bytes.Buffer
		showPreview(t.Context(), newClient(), newView(&out, false), "demo", "harvester", "v1.35.6+rke2r1", 300*time.Millisecond)
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("the wait took %s, want about 300ms", took)
		}
		for _, want := range []string{"was not computed within 300ms", "is the capi-inplace manager running", "--preview-wait (now 300ms)", "the upgrade runs without one"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the output does not say %q:\n%s", want, out.String())
			}
		}
	})
}

// playController computes every preview whose refresh annotation is new, as the
// UpgradePreview controller would, with a fixed one-machine status.
func playController(ctx context.Context, c client.Client) {
	for ctx.Err() == nil {
		list := &inplacev1.UpgradePreviewList{}
		if err := c.List(ctx, list); err == nil {
			for i := range list.Items {
				p := &list.Items[i]
				if token := p.Annotations[inplacev1.RefreshAnnotation]; token != p.Status.ObservedRefresh {
					now := metav1.Now()
					p.Status = inplacev1.UpgradePreviewStatus{Phase: inplacev1.PreviewPhaseReady, ObservedRefresh: token, ComputedTime: &now, InPlace: 1,
						Machines: []inplacev1.PreviewMachine{{Name: "harvester-cp-1", NodeName: "demo-cp-1", Outcome: inplacev1.MachineOutcomeInPlace, Order: 1}}}
					_ = c.Status().Update(ctx, p)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}
