package sim

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Repository plays the Harvester upgrade repository: its Deployment in Namespace becomes
// available after Delay (or its downloader fails with FailMessage, as a wrong checksum
// would), and a local HTTP server serves harvester-release.yaml with Release as content.
// It plays the pods a real node would run from the Deployment's template, which run the
// node program of the capi-inplace image (nodeprogram/repository.go): a template whose
// containers would not work on a node never becomes available (see podProblem).
type Repository struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace is where the repository's Deployment is created.
	Namespace string
	// Release is the content of harvester-release.yaml.
	Release string
	// Delay is how long the download takes, from when the simulator first sees the
	// Deployment (its creationTimestamp has whole seconds only, too coarse for a short
	// Delay). Default 100ms.
	Delay time.Duration
	// FailMessage, when set, makes the downloader fail with it.
	FailMessage string
	// FailExitCode is the downloader's exit code with FailMessage: 1 (the default) is the
	// node program's "failed", 3 its "not done yet, run me again" (nodeprogram.ExitRetry).
	FailExitCode int32
	// Cache, when set, is a started cache of the workload cluster whose Deployment events
	// start the simulator's passes, as they start the Deployment controller. Reads still
	// go to Client.
	Cache ctrlcache.Cache
	// Interval is how often the Deployments are looked at: without Cache, default 20ms;
	// with it, when no event came, default 1s.
	Interval time.Duration
	// PlayPods makes the simulator play the Deployment's pods too, as the scheduler and
	// the kubelets of the nodes NodeSelector picks would (see playPods): each pod on a
	// node, evicted by a drain, replaced by the Deployment, serving only while its node
	// is Ready and its copy of the ISO (or the shared volume it reads) is there. Without
	// it the Deployment is made available with no pods, and the repository serves always.
	PlayPods bool
	// NodeSelector picks the nodes PlayPods places pods on (the spec's own nodes on a
	// shared API server).
	NodeSelector map[string]string
	// RWXAttachHangs: a template that shares a ReadWriteMany volume loses it for good once
	// the volume's share-manager pod is evicted (a drain of its node): the volume stays
	// attaching and every pod reading it stops serving, as longhorn/longhorn#12226 (open,
	// priority/0; "NOT consistently reproducible") and harvester/harvester#9597 report;
	// without it the volume attaches again on another node after ReattachDelay.
	RWXAttachHangs bool
	// ReattachDelay is how long a shared volume takes to attach on another node after its
	// share-manager pod left; default 200ms.
	ReattachDelay time.Duration
	// CopyDelay is how long a pod takes to copy the ISO from a ready peer; default 100ms.
	CopyDelay time.Duration

	loop     passLoop
	server   *httptest.Server
	mu       sync.Mutex
	requests int
	problems map[string]string
	// seen is when each Deployment was first seen.
	seen map[types.UID]time.Time
	// played is what PlayPods keeps of each Deployment it plays, by name.
	played map[string]*playedRepository
	// downloads counts the ISO downloads from the release's URL (not from a peer), created
	// the pods PlayPods created.
	downloads, created int
}

// Problem is why the Deployment name's pods would not serve the release on a real node,
// "" when nothing is wrong with them.
func (r *Repository) Problem(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.problems[name]
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
	kinds := []client.Object{&appsv1.Deployment{}}
	if r.PlayPods {
		kinds = append(kinds, &corev1.Pod{}, &corev1.Node{})
	}
	go r.loop.run(ctx, r.Interval, r.Cache, kinds, r.pass)
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
		if dep.Status.AvailableReplicas > 0 && !r.PlayPods {
			continue
		}
		if first := r.firstSeen(dep.UID); time.Since(first) < delay {
			r.loop.dueAt(first.Add(delay))
			continue
		}
		problem, exitCode := podProblem(dep.Spec.Template.Spec)
		r.mu.Lock()
		if r.problems == nil {
			r.problems = map[string]string{}
		}
		r.problems[dep.Name] = problem
		r.mu.Unlock()
		switch {
		case exitCode != 0:
			r.failDownloader(ctx, dep, problem, exitCode)
			continue
		case problem != "":
			continue // never Ready: nginx has nothing to serve
		case r.FailMessage != "":
			code := r.FailExitCode
			if code == 0 {
				code = 1
			}
			r.failDownloader(ctx, dep, r.FailMessage, code)
			continue
		case r.PlayPods:
			_ = r.playPods(ctx, dep)
			continue
		}
		_ = rollOut(ctx, r.Client, client.ObjectKeyFromObject(dep))
	}
}

// firstSeen is when the simulator first saw the Deployment uid.
func (r *Repository) firstSeen(uid types.UID) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[types.UID]time.Time{}
	}
	t, ok := r.seen[uid]
	if !ok {
		t = time.Now()
		r.seen[uid] = t
	}
	return t
}

// failDownloader creates the leader pod with its downloader terminated in error, as the
// kubelet would report it.
func (r *Repository) failDownloader(ctx context.Context, dep *appsv1.Deployment, message string, exitCode int32) {
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
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: "Error", Message: message}},
	}}
	_ = r.Client.Status().Update(ctx, pod)
}

// podProblem says why a repository pod built from spec would not serve the release on a
// real node, and the exit code its downloader would end with (0 when it would not end in
// error). What it checks is what the node program needs there (nodeprogram/repository.go,
// docs/harvester.md "What runs where"):
//   - the downloader init container runs `node repository download` from a capi-inplace
//     image the registry serves, with --iso-url and --sha512 (exit 2 otherwise), as root
//     when it writes to a PVC: without fsGroup the kubelet leaves a volume's directory
//     owned by root (Kubernetes' "Configure a Security Context for a Pod"), and the
//     image's user 65532 cannot write the lock and the ISO there (exit 1);
//   - a container runs `node repository mount --hold` privileged and as root (a loop
//     device and mount(2)), onto a volume it shares with Bidirectional propagation, which
//     nginx mounts with HostToContainer propagation to see the mount; otherwise nginx has
//     nothing to serve and the readiness probe never passes.
//
// A template that serves a Harvester VirtualMachineImage (release.image) has no
// downloader: its volume is the image's PVC, read-only, whose disk.img is the complete
// ISO (harvester-node-upgrade.md, facts 15 and 48), and its mounter mounts that file
// with --ready-flag=false, since no download writes a ready flag there.
func podProblem(spec corev1.PodSpec) (string, int32) {
	var download *corev1.Container
	for i := range spec.InitContainers {
		if nodeSubcommand(spec.InitContainers[i].Image, spec.InitContainers[i].Args) == "repository download" {
			download = &spec.InitContainers[i]
		}
	}
	if download == nil {
		if problem, isImage := imagePodProblem(spec); isImage {
			return problem, 0
		}
		return "no init container runs `capi-inplace node repository download`", 0
	}
	if !DefaultImageExists(download.Image) {
		return fmt.Sprintf("container %s: ImagePullBackOff: image %s not found", download.Name, download.Image), 0
	}
	if flagValue(download.Args, "--iso-url") == "" || flagValue(download.Args, "--sha512") == "" {
		return fmt.Sprintf("capi-inplace node repository download: --iso-url and --sha512 are required (args %v)", download.Args), 2
	}
	if !runsAsRoot(download) && downloadsToClaim(spec, download) {
		return "capi-inplace node repository download: failed: open the leader lock /repository/leader.lock: permission denied (the container does not run as root)", 1
	}
	return mountProblem(spec), 0
}

// downloadsToClaim says whether the downloader writes the ISO to a PVC, whose directory
// the kubelet leaves owned by root without fsGroup; an emptyDir is world-writable
// (Kubernetes' "Volumes": emptyDir is created with mode 0777).
func downloadsToClaim(spec corev1.PodSpec, download *corev1.Container) bool {
	dir := flagValue(download.Args, "--dir")
	for _, m := range download.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name {
				return v.PersistentVolumeClaim != nil
			}
		}
	}
	return false
}

// imagePodProblem is podProblem of a template without a downloader that mounts a
// read-only PVC, which serves a VirtualMachineImage; isImage is false for any other.
func imagePodProblem(spec corev1.PodSpec) (problem string, isImage bool) {
	var claim *corev1.Volume
	for i := range spec.Volumes {
		if pvc := spec.Volumes[i].PersistentVolumeClaim; pvc != nil && pvc.ReadOnly {
			claim = &spec.Volumes[i]
		}
	}
	if claim == nil {
		return "", false
	}
	for _, c := range spec.Containers {
		if nodeSubcommand(c.Image, c.Args) != "repository mount" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == claim.Name && flagValue(c.Args, "--image") != path.Join(m.MountPath, "disk.img") {
				return fmt.Sprintf("capi-inplace node repository mount: failed: %s is not there; the image's volume %s holds disk.img", flagValue(c.Args, "--image"), claim.PersistentVolumeClaim.ClaimName), true
			}
		}
		if flagValue(c.Args, "--ready-flag") != "false" {
			return fmt.Sprintf("capi-inplace node repository mount: not done yet: %s has no ready flag yet (no download writes one on an image's volume)", flagValue(c.Args, "--image")), true
		}
	}
	return mountProblem(spec), true
}

// mountProblem is podProblem's check of the mounter and nginx.
func mountProblem(spec corev1.PodSpec) string {
	propagation := map[string]corev1.MountPropagationMode{}
	var mounter *corev1.Container
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if nodeSubcommand(c.Image, c.Args) == "repository mount" {
			mounter = c
		}
		for _, m := range c.VolumeMounts {
			if m.MountPropagation != nil {
				propagation[c.Name+"/"+m.Name] = *m.MountPropagation
			}
		}
	}
	if mounter == nil || !slices.Contains(mounter.Args, "--hold") {
		return "no container runs `capi-inplace node repository mount --hold`"
	}
	if !runsAsRoot(mounter) || mounter.SecurityContext.Privileged == nil || !*mounter.SecurityContext.Privileged {
		return fmt.Sprintf("container %s: open /dev/loop-control: the container must be privileged and run as root", mounter.Name)
	}
	target := flagValue(mounter.Args, "--target")
	for _, m := range mounter.VolumeMounts {
		if m.MountPath != target || propagation[mounter.Name+"/"+m.Name] != corev1.MountPropagationBidirectional {
			continue
		}
		for _, c := range spec.Containers {
			if c.Name != mounter.Name && propagation[c.Name+"/"+m.Name] == corev1.MountPropagationHostToContainer {
				return ""
			}
		}
	}
	return fmt.Sprintf("container %s mounts the ISO on %s, which no other container sees through Bidirectional and HostToContainer propagation", mounter.Name, target)
}

// runsAsRoot tells whether a container of the capi-inplace image (USER 65532) runs as root.
func runsAsRoot(c *corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil && *c.SecurityContext.RunAsUser == 0
}
