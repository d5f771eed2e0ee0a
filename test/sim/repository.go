package sim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Repository plays the Harvester upgrade repository: its Deployment in Namespace becomes
// available after Delay (or its downloader fails with FailMessage, as a wrong checksum
// would), and a local HTTP server serves harvester-release.yaml with Release as content.
type Repository struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is where the repository's Deployment is created.
	Namespace string
	// Release is the content of harvester-release.yaml.
	Release string
	// Delay is how long the download takes. Default 100ms.
	Delay time.Duration
	// FailMessage, when set, makes the downloader fail with it.
	FailMessage string

	server   *httptest.Server
	mu       sync.Mutex
	requests int
}

// URL is the base URL of the local server that serves the release.
func (r *Repository) URL() string {
	return r.server.URL
}

// MetadataRequests is how many times the release metadata was read.
func (r *Repository) MetadataRequests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Start serves the release and plays the Deployment until ctx ends.
func (r *Repository) Start(ctx context.Context) {
	r.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/harvester-release.yaml" {
			http.NotFound(w, req)
			return
		}
		r.mu.Lock()
		r.requests++
		r.mu.Unlock()
		_, _ = w.Write([]byte(r.Release))
	}))
	go func() {
		<-ctx.Done()
		r.server.Close()
	}()
	go func() {
		for {
			r.pass(ctx)
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func (r *Repository) pass(ctx context.Context) {
	deps := &appsv1.DeploymentList{}
	if err := r.Client.List(ctx, deps, client.InNamespace(r.Namespace)); err != nil {
		return
	}
	delay := r.Delay
	if delay == 0 {
		delay = 100 * time.Millisecond
	}
	for i := range deps.Items {
		dep := &deps.Items[i]
		if dep.Status.AvailableReplicas > 0 || time.Since(dep.CreationTimestamp.Time) < delay {
			continue
		}
		if r.FailMessage != "" {
			r.failDownloader(ctx, dep)
			continue
		}
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &appsv1.Deployment{}
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(dep), cur); err != nil {
				return err
			}
			replicas := int32(1)
			if cur.Spec.Replicas != nil {
				replicas = *cur.Spec.Replicas
			}
			cur.Status.Replicas, cur.Status.ReadyReplicas, cur.Status.AvailableReplicas, cur.Status.UpdatedReplicas = replicas, replicas, replicas, replicas
			cur.Status.ObservedGeneration = cur.Generation
			return r.Client.Status().Update(ctx, cur)
		})
	}
}

// failDownloader creates the leader pod with its downloader terminated in error, as the
// kubelet would report it.
func (r *Repository) failDownloader(ctx context.Context, dep *appsv1.Deployment) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: dep.Name + "-leader", Namespace: dep.Namespace, Labels: dep.Spec.Selector.MatchLabels},
		Spec:       *dep.Spec.Template.Spec.DeepCopy(),
	}
	if err := r.Client.Create(ctx, pod); err != nil {
		return // already there
	}
	pod.Status.Phase = corev1.PodPending
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{
		Name: "download", Image: pod.Spec.InitContainers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: r.FailMessage}},
	}}
	_ = r.Client.Status().Update(ctx, pod)
}
