package sim

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ShareManagerNamespace is where Longhorn runs the share-manager pod of a ReadWriteMany
// volume (longhorn-manager v1.10.0 controller/share_manager_controller.go: the pod is
// created in the ShareManager's namespace, longhorn-system, named share-manager-<volume>,
// labelled longhorn.io/component=share-manager and longhorn.io/share-manager=<volume>, with
// a controller owner reference to its ShareManager, so that kubectl drain evicts it). The
// simulator has no PersistentVolume: it names the volume by its claim.
const ShareManagerNamespace = "longhorn-system"

// playedRepository is what PlayPods keeps of one repository Deployment.
type playedRepository struct {
	// readyAt is when each pod's copy of the ISO is there (copied from a peer, or
	// downloaded), by pod name.
	readyAt map[string]time.Time
	// serving is the pods that served at the last pass.
	serving map[string]bool
	// copying is the pods whose copy from a peer is under way.
	copying map[string]bool
	// shareNode is the node of the shared volume's share-manager pod, where Longhorn
	// attaches the volume's engine; "" before the first pod.
	shareNode string
	// attachedAt is when the shared volume is attached again after its share-manager
	// left; zero while it is attached, far in the future when it hangs.
	attachedAt time.Time
	// stuck: the volume hangs attaching (RWXAttachHangs); left is the node its
	// share-manager was evicted from.
	stuck bool
	left  string
}

// Downloads is how many times a played pod downloaded the ISO from the release's URL,
// rather than copying it from a peer.
func (r *Repository) Downloads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.downloads
}

// PodsCreated is how many repository pods the simulator created: the replicas, and each
// pod that replaced one evicted or deleted.
func (r *Repository) PodsCreated() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.created
}

// Serves says whether the repository at repositoryURL answers, and why not: the
// Deployment's Service (http://<name>.<namespace>.svc) has a serving pod behind it. The
// simulator's own URL stands for every Deployment it plays (a test points the nodes at
// it); a URL of no Deployment it plays is served (an external repository). Without
// PlayPods it always serves.
func (r *Repository) Serves(repositoryURL string) (bool, string) {
	if !r.PlayPods {
		return true, ""
	}
	name := ""
	if u, err := url.Parse(repositoryURL); err == nil && r.server != nil && !strings.HasPrefix(repositoryURL, r.server.URL) {
		name, _, _ = strings.Cut(u.Hostname(), ".")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for depName, p := range r.played {
		if name != "" && depName != name {
			continue
		}
		if len(p.serving) == 0 {
			why := "no endpoints available for service " + depName
			if p.stuck {
				why += fmt.Sprintf(" (the pods' shared volume is stuck attaching since its share-manager was evicted from node %s)", p.left)
			}
			return false, why
		}
	}
	return true, ""
}

// playPods plays a repository Deployment's pods, as the scheduler, the kubelets and, for a
// shared volume, Longhorn would:
//   - the Deployment keeps spec.replicas pods (a pod evicted or deleted is replaced); a
//     new pod goes to the Ready node of NodeSelector with the fewest of the Deployment's
//     pods (the template's preferred pod anti-affinity), cordoned or not, since the
//     template tolerates every taint (kube-scheduler's NodeUnschedulable plugin admits a
//     pod that tolerates node.kubernetes.io/unschedulable);
//   - a pod of a template that keeps the ISO in its own volume has it after CopyDelay
//     when a peer serves as it starts (`repository download --peer-url`), else after
//     Delay, downloading it from the release's URL (the first pod downloads at once: the
//     Deployment's first Delay was its download);
//   - a pod of a template that shares a PVC reads the volume through Longhorn's
//     share-manager, whose pod runs on the node of the first pod; when a drain evicts
//     it, the volume attaches on another node after ReattachDelay, or never
//     (RWXAttachHangs), and no pod serves meanwhile;
//   - a pod serves while its node is Ready and it has the ISO; the Deployment's status
//     counts the serving pods as ready and available.
func (r *Repository) playPods(ctx context.Context, dep *appsv1.Deployment) error {
	now := time.Now()
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabels(r.NodeSelector)); err != nil {
		return err
	}
	ready := map[string]bool{}
	for i := range nodes.Items {
		ready[nodes.Items[i].Name] = NodeReady(&nodes.Items[i])
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(dep.Namespace), client.MatchingLabels(dep.Spec.Selector.MatchLabels)); err != nil {
		return err
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })

	r.mu.Lock()
	if r.played == nil {
		r.played = map[string]*playedRepository{}
	}
	p := r.played[dep.Name]
	if p == nil {
		p = &playedRepository{readyAt: map[string]time.Time{}, copying: map[string]bool{}}
		r.played[dep.Name] = p
	}
	r.mu.Unlock()

	for int32(len(live)) < ptr.Deref(dep.Spec.Replicas, 1) {
		node := r.placeRepositoryPod(nodes.Items, ready, live)
		if node == "" {
			break // Pending: no Ready node
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: dep.Name + "-", Namespace: dep.Namespace, Labels: dep.Spec.Template.Labels,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: dep.Name + "-sim", UID: dep.UID, Controller: ptr.To(true)}},
			},
			Spec: *dep.Spec.Template.Spec.DeepCopy(),
		}
		pod.Spec.NodeName = node
		if err := r.Client.Create(ctx, pod); err != nil {
			return err
		}
		r.mu.Lock()
		r.created++
		r.mu.Unlock()
		live = append(live, *pod)
	}

	shared := sharedClaim(dep.Spec.Template.Spec)
	attached := true
	if shared != "" {
		var err error
		if attached, err = r.playShareManager(ctx, p, shared, live, nodes.Items, ready, now); err != nil {
			return err
		}
	}

	r.mu.Lock()
	serving := map[string]bool{}
	for name := range p.serving {
		if slices.ContainsFunc(live, func(pod corev1.Pod) bool { return pod.Name == name }) {
			serving[name] = true
		}
	}
	for _, pod := range live {
		if _, known := p.readyAt[pod.Name]; !known {
			switch {
			case shared != "":
				p.readyAt[pod.Name] = now // the volume holds the ISO
			case len(p.readyAt) == 0:
				p.readyAt[pod.Name] = now // the Deployment's first pod: its Delay was the download
				r.downloads++
			case len(serving) > 0:
				p.readyAt[pod.Name] = now.Add(durationOr(r.CopyDelay, 100*time.Millisecond))
				p.copying[pod.Name] = true
			default:
				p.readyAt[pod.Name] = now.Add(durationOr(r.Delay, 100*time.Millisecond))
				r.downloads++
			}
		}
	}
	for _, pod := range live {
		// A copy whose every peer stopped serving breaks; the downloader's next run finds
		// no peer and downloads from the release's URL (nodeprogram lead).
		if p.copying[pod.Name] && now.Before(p.readyAt[pod.Name]) && len(serving) == 0 {
			p.readyAt[pod.Name] = now.Add(durationOr(r.Delay, 100*time.Millisecond))
			delete(p.copying, pod.Name)
			r.downloads++
		}
		at := p.readyAt[pod.Name]
		switch {
		case attached && ready[pod.Spec.NodeName] && !now.Before(at):
			serving[pod.Name] = true
		case now.Before(at):
			delete(serving, pod.Name)
			r.loop.dueAt(at)
		default:
			delete(serving, pod.Name)
		}
	}
	p.serving = serving
	r.mu.Unlock()

	for i := range live {
		if err := setPodReady(ctx, r.Client, &live[i], serving[live[i].Name]); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	n := int32(len(serving))
	cur := dep.DeepCopy()
	cur.Status.Replicas, cur.Status.UpdatedReplicas = int32(len(live)), int32(len(live))
	cur.Status.ReadyReplicas, cur.Status.AvailableReplicas = n, n
	cur.Status.ObservedGeneration = cur.Generation
	if cur.Status.Replicas == dep.Status.Replicas && n == dep.Status.AvailableReplicas && n == dep.Status.ReadyReplicas && cur.Status.ObservedGeneration == dep.Status.ObservedGeneration {
		return nil
	}
	return r.Client.Status().Update(ctx, cur)
}

// placeRepositoryPod is the node a new pod of the Deployment goes to (see playPods), ""
// when no node is Ready.
func (r *Repository) placeRepositoryPod(nodes []corev1.Node, ready map[string]bool, live []corev1.Pod) string {
	best, fewest := "", -1
	for _, n := range nodes {
		if !ready[n.Name] || n.DeletionTimestamp != nil {
			continue
		}
		count := 0
		for _, p := range live {
			if p.Spec.NodeName == n.Name {
				count++
			}
		}
		if fewest < 0 || count < fewest || (count == fewest && n.Name < best) {
			best, fewest = n.Name, count
		}
	}
	return best
}

// playShareManager plays Longhorn's share-manager of the pods' shared volume claim and
// says whether the volume is attached: the share-manager pod runs on the node of the
// first pod; when it is gone (a drain evicted it), Longhorn starts it on another Ready,
// schedulable node and the volume attaches there after ReattachDelay, or never with
// RWXAttachHangs ("Waiting for NFS server to start, volume is not attached").
func (r *Repository) playShareManager(ctx context.Context, p *playedRepository, claim string, live []corev1.Pod, nodes []corev1.Node, ready map[string]bool, now time.Time) (bool, error) {
	key := client.ObjectKey{Namespace: ShareManagerNamespace, Name: "share-manager-" + claim}
	if p.shareNode == "" {
		if len(live) == 0 {
			return false, nil
		}
		p.shareNode = live[0].Spec.NodeName
		return true, r.createShareManager(ctx, key, claim, p.shareNode)
	}
	sm := &corev1.Pod{}
	err := r.Client.Get(ctx, key, sm)
	if err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	if err == nil && sm.DeletionTimestamp == nil {
		if p.stuck {
			return false, nil
		}
		if p.attachedAt.IsZero() || !now.Before(p.attachedAt) {
			p.attachedAt = time.Time{}
			return true, nil
		}
		r.loop.dueAt(p.attachedAt)
		return false, nil
	}
	// Evicted: the volume detaches from its node; Longhorn starts the share-manager again.
	next := ""
	for _, n := range nodes {
		if ready[n.Name] && !n.Spec.Unschedulable && n.Name != p.shareNode && (next == "" || n.Name < next) {
			next = n.Name
		}
	}
	if next == "" {
		return false, nil
	}
	p.left, p.shareNode = p.shareNode, next
	if r.RWXAttachHangs {
		p.stuck, p.attachedAt = true, now.Add(100*365*24*time.Hour)
	} else {
		p.attachedAt = now.Add(durationOr(r.ReattachDelay, 200*time.Millisecond))
		r.loop.dueAt(p.attachedAt)
	}
	return false, r.createShareManager(ctx, key, claim, next)
}

// createShareManager creates the share-manager pod key of claim on node, owned by its
// ShareManager as Longhorn's is (so that kubectl drain evicts it).
func (r *Repository) createShareManager(ctx context.Context, key client.ObjectKey, claim, node string) error {
	if err := r.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{"longhorn.io/component": "share-manager", "longhorn.io/share-manager": claim},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "longhorn.io/v1beta2", Kind: "ShareManager", Name: claim, UID: "share-manager-sim", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "share-manager", Image: "longhornio/longhorn-share-manager:v1.10.0"}}},
	}
	if err := r.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// sharedClaim is the PVC a repository template's pods share for the ISO (a volume they
// read and write, or the read-only volume of a VirtualMachineImage), "" when each pod
// keeps its own copy.
func sharedClaim(spec corev1.PodSpec) string {
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// setPodReady sets a played pod's phase Running and its Ready condition.
func setPodReady(ctx context.Context, c client.Client, pod *corev1.Pod, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == status && pod.Status.Phase == corev1.PodRunning {
			return nil
		}
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	return c.Status().Update(ctx, pod)
}

func durationOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
