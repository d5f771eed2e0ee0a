package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// How the KubeVirt simulator places a VMI: as kube-scheduler places its virt-launcher
// pod, with the default profile of k8s.io/kubernetes v1.36.3 (pkg/scheduler). Every file
// named below is under that module's pkg/scheduler unless it says otherwise.
//
// The pod. KubeVirt renders the launcher pod from the VMI (kubevirt/kubevirt v1.6.0
// pkg/virt-controller/services/template.go renderLaunchManifest): the VMI's labels plus
// kubevirt.io=virt-launcher, kubevirt.io/created-by=<VMI UID> and vm.kubevirt.io/name
// (podLabels), and the VMI's nodeSelector, affinity and tolerations. A migration's
// target pod is rendered from the same VMI, with a required anti-affinity to the pods of
// that VMI by hostname (pkg/virt-controller/watch/migration/migration.go
// createMigrationPodAntiAffinityRule: it never lands on the source node) and the
// migration's spec.addedNodeSelector merged into its nodeSelector, the VMI's own keys
// winning (createTargetPod). The pods already bound are the launcher pods of the running
// VMIs (a migrating VMI's on its source node among them): the simulated cluster runs no
// other pod with requests.
//
// Filters (a node must pass all): NodeUnschedulable (a cordoned node, unless the pod
// tolerates node.kubernetes.io/unschedulable:NoSchedule); TaintToleration's filter (a
// NoSchedule or NoExecute taint the pod does not tolerate,
// framework/plugins/tainttoleration Filter); NodeAffinity's filter (nodeSelector and
// required node affinity, nodeaffinity Filter); NodeResourcesFit's filter (roomOn);
// InterPodAffinity's filter (required pod affinity and anti-affinity, and the existing
// pods' required anti-affinity, interpodaffinity/filtering.go). Two stand-ins: the
// node.kubernetes.io/ taints, which the node lifecycle controller keeps in step with a
// node's conditions and cordon (pkg/controller/nodelifecycle doNoScheduleTaintingPass:
// not-ready, unreachable, unschedulable, the pressures), are read from the node's Ready
// condition and spec.unschedulable instead, because the test API server runs no such
// controller: its admission plugin TaintNodesByCondition (plugin/pkg/admission/nodetaint)
// puts node.kubernetes.io/not-ready on every node it creates, and nothing takes it off;
// and a Harvester witness node is out (Harvester taints it for etcd only).
//
// Scores (scoreNodes): each plugin scores every feasible node, normalizes to 0..100
// (fwk.MaxNodeScore) and is multiplied by its weight (apis/config/v1/default_plugins.go
// getDefaultPlugins); the node with the highest sum wins (framework/runtime/framework.go
// RunScorePlugins; schedule_one.go prioritizeNodes). PodTopologySpread (weight 2) and
// ImageLocality (weight 1) score nothing here: the system default spread constraints
// apply only to pods a Service, ReplicaSet, StatefulSet or ReplicationController selects
// (podtopologyspread/common.go buildDefaultConstraints), none of which the simulated cluster has for launcher pods, a
// VMI's own spec.topologySpreadConstraints are not played, and the simulated nodes list
// no images. With one feasible node nothing is scored (schedule_one.go: "When only one
// node after predicate, just use it").

// The default profile's score plugin weights (apis/config/v1/default_plugins.go).
const (
	weightTaintToleration    = 3
	weightNodeAffinity       = 2
	weightInterPodAffinity   = 2
	weightNodeResourcesFit   = 1
	weightBalancedAllocation = 1

	maxNodeScore = 100 // k8s.io/kube-scheduler framework MaxNodeScore
	// The requests NodeResourcesFit's LeastAllocated score counts for a pod that asks
	// none (pkg/scheduler/util/pod_resources.go DefaultMilliCPURequest,
	// DefaultMemoryRequest; noderesources/resource_allocation.go uses them when
	// useRequested is false, as it is for LeastAllocated).
	defaultMilliCPURequest = 100
	defaultMemoryRequest   = 200 * 1024 * 1024
)

// NodeScore is how kube-scheduler's default plugins scored one feasible node for a VMI's
// launcher pod: each plugin's normalized score times its weight, and their sum.
type NodeScore struct {
	Node string
	// TaintToleration: intolerable PreferNoSchedule taints, fewest best (0..300).
	TaintToleration int64
	// NodeAffinity: the weights of the preferred node affinity terms the node matches (0..200).
	NodeAffinity int64
	// InterPodAffinity: preferred pod affinity and anti-affinity, both ways (0..200).
	InterPodAffinity int64
	// NodeResourcesFit: LeastAllocated, the share of CPU and memory left free (0..100).
	NodeResourcesFit int64
	// BalancedAllocation: how the pod changes the balance of CPU and memory (0..100).
	BalancedAllocation int64
	Total              int64
}

func (s NodeScore) String() string {
	return fmt.Sprintf("%s %d (TaintToleration %d, NodeAffinity %d, InterPodAffinity %d, NodeResourcesFit %d, NodeResourcesBalancedAllocation %d)",
		s.Node, s.Total, s.TaintToleration, s.NodeAffinity, s.InterPodAffinity, s.NodeResourcesFit, s.BalancedAllocation)
}

// Placement is where the scheduler binds a launcher pod, and why: the scores of the
// feasible nodes, best first (none when one node was feasible, or when a test's PlaceOn
// chose it).
type Placement struct {
	Node   string
	Scores []NodeScore
}

// launcherPod is what the scheduler sees of a VMI's virt-launcher pod: its pod (labels,
// namespace, nodeSelector, affinity, tolerations) and its requests, and the node it is
// bound to ("" while it is not).
type launcherPod struct {
	pod      *corev1.Pod
	cpu, mem int64
	node     string
}

// launcherOf renders a VMI's launcher pod as KubeVirt does (template.go podLabels and
// renderLaunchManifest); added is a migration's addedNodeSelector (migration.go
// createTargetPod: the VMI's own nodeSelector wins a key both set).
func launcherOf(vmi *kubevirtv1.VirtualMachineInstance, added map[string]string) launcherPod {
	lbls := map[string]string{}
	for key, v := range vmi.Labels {
		lbls[key] = v
	}
	lbls[kubevirtv1.AppLabel] = "virt-launcher"
	lbls[kubevirtv1.CreatedByLabel] = string(vmi.UID)
	lbls[kubevirtv1.VirtualMachineNameLabel] = vmi.Name
	selector := map[string]string{}
	for key, v := range added {
		selector[key] = v
	}
	for key, v := range vmi.Spec.NodeSelector {
		selector[key] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: vmi.Namespace, Name: "virt-launcher-" + vmi.Name, Labels: lbls},
		Spec:       corev1.PodSpec{NodeSelector: selector, Tolerations: vmi.Spec.Tolerations},
	}
	if vmi.Spec.Affinity != nil {
		pod.Spec.Affinity = vmi.Spec.Affinity.DeepCopy()
	}
	cpu, mem := vmiRequests(&vmi.Spec)
	return launcherPod{pod: pod, cpu: cpu, mem: mem, node: vmi.Status.NodeName}
}

// boundLaunchers are the launcher pods of the VMIs that run on a node (not ended).
func boundLaunchers(vmis map[string]*kubevirtv1.VirtualMachineInstance) []launcherPod {
	keys := make([]string, 0, len(vmis))
	for key := range vmis {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var out []launcherPod
	for _, key := range keys {
		v := vmis[key]
		if v.Status.NodeName == "" || v.Status.Phase == kubevirtv1.Succeeded || v.Status.Phase == kubevirtv1.Failed {
			continue
		}
		out = append(out, launcherOf(v, nil))
	}
	return out
}

// schedule places pod on one of nodes, as kube-scheduler does: the nodes that pass every
// filter (feasible), then the one with the highest weighted score. exclude is a node the
// pod must not land on (a migration's source). A tie goes to the first node by name; the
// real scheduler takes, among equal totals, whichever its parallel filters happened to
// list first from a start index it rotates on every cycle (schedule_one.go
// findNodesThatPassFilters, nextStartNodeIndex; the nodeScoreHeap's Randomizer with
// extenders): a matter of chance that a spec must not rely on. Node "" when none fits.
func schedule(pod launcherPod, nodes []corev1.Node, bound []launcherPod, exclude string) Placement {
	byName := map[string]*corev1.Node{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	var feasible []*corev1.Node
	for i := range nodes {
		if n := &nodes[i]; n.Name != exclude && passesFilters(n, pod, bound, byName) {
			feasible = append(feasible, n)
		}
	}
	sort.Slice(feasible, func(i, j int) bool { return feasible[i].Name < feasible[j].Name })
	switch len(feasible) {
	case 0:
		return Placement{}
	case 1:
		return Placement{Node: feasible[0].Name}
	}
	scores := scoreNodes(pod, feasible, nodes, bound)
	sort.SliceStable(scores, func(i, j int) bool { return scores[i].Total > scores[j].Total })
	return Placement{Node: scores[0].Node, Scores: scores}
}

// passesFilters runs the filters (see the top of this file) of pod on node.
func passesFilters(node *corev1.Node, pod launcherPod, bound []launcherPod, byName map[string]*corev1.Node) bool {
	if kubevirtWitness(node) || !nodeIsReady(node) {
		return false
	}
	tolerations := pod.pod.Spec.Tolerations
	// NodeUnschedulable (framework/plugins/nodeunschedulable): a cordoned node takes only
	// pods that tolerate its unschedulable taint.
	if node.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(klog.Background(), tolerations,
		&corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, false) {
		return false
	}
	// TaintToleration's filter: the NoSchedule and NoExecute taints
	// (plugins/helper/taint.go DoNotScheduleTaintsFilterFunc).
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, tolerations, func(t *corev1.Taint) bool {
		return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && !strings.HasPrefix(t.Key, "node.kubernetes.io/")
	}, false); untolerated {
		return false
	}
	// NodeAffinity's filter: nodeSelector and required node affinity.
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod.pod).Match(node); err != nil || !ok {
		return false
	}
	// NodeResourcesFit's filter.
	if !roomOn(node, pod, bound) {
		return false
	}
	return podAffinityAllows(node, pod, bound, byName)
}

func kubevirtWitness(node *corev1.Node) bool {
	return node.Labels["node-role.harvesterhci.io/witness"] == "true"
}

func nodeIsReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// roomOn says whether node's allocatable, less the requests of the launcher pods bound
// there, holds pod: NodeResourcesFit's filter. A node that reports no allocatable is not
// counted (a test node made by hand): the scheduler would find no room there, but the
// simulated kubelet always reports it (kubelet.go).
func roomOn(node *corev1.Node, pod launcherPod, bound []launcherPod) bool {
	alloc := node.Status.Allocatable
	if len(alloc) == 0 {
		return true
	}
	cpu, mem := pod.cpu, pod.mem
	for _, b := range bound {
		if b.node == node.Name {
			cpu, mem = cpu+b.cpu, mem+b.mem
		}
	}
	return cpu <= alloc.Cpu().MilliValue() && mem <= alloc.Memory().Value()
}

// podTerm is a pod (anti-)affinity term of one pod, as the scheduler reads it
// (k8s.io/kube-scheduler v0.36.3 framework/types.go newAffinityTerm): the namespaces it
// looks at (its own pod's when it names none and has no namespaceSelector), its
// selectors, its topology key, and its weight for a preferred term.
type podTerm struct {
	namespaces  map[string]bool
	nsSelector  labels.Selector
	selector    labels.Selector
	topologyKey string
	weight      int64
}

func termsOf(owner *corev1.Pod, terms []corev1.PodAffinityTerm, weights []int32) []podTerm {
	out := make([]podTerm, 0, len(terms))
	for i := range terms {
		t := &terms[i]
		sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
		if err != nil {
			continue // the API server validates the selectors; a bad one matches nothing
		}
		nsSel, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector)
		if err != nil {
			continue
		}
		ns := map[string]bool{}
		if len(t.Namespaces) == 0 && t.NamespaceSelector == nil {
			ns[owner.Namespace] = true
		}
		for _, n := range t.Namespaces {
			ns[n] = true
		}
		w := int64(1)
		if weights != nil {
			w = int64(weights[i])
		}
		out = append(out, podTerm{namespaces: ns, nsSelector: nsSel, selector: sel, topologyKey: t.TopologyKey, weight: w})
	}
	return out
}

// matches says whether the term selects pod (framework/types.go AffinityTerm.Matches). A
// namespaceSelector is judged against a namespace without labels: the simulator reads no
// Namespaces.
func (t podTerm) matches(pod *corev1.Pod) bool {
	if !t.namespaces[pod.Namespace] && !t.nsSelector.Matches(labels.Set(nil)) {
		return false
	}
	return t.selector.Matches(labels.Set(pod.Labels))
}

// sameDomain says whether nodes a and b share the term's topology domain.
func (t podTerm) sameDomain(a, b *corev1.Node) bool {
	va, ok := a.Labels[t.topologyKey]
	vb, ok2 := b.Labels[t.topologyKey]
	return ok && ok2 && va == vb
}

func required(pod *corev1.Pod, anti bool) []podTerm {
	a := pod.Spec.Affinity
	switch {
	case a == nil:
		return nil
	case anti && a.PodAntiAffinity != nil:
		return termsOf(pod, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, nil)
	case !anti && a.PodAffinity != nil:
		return termsOf(pod, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, nil)
	}
	return nil
}

func preferred(pod *corev1.Pod, anti bool) []podTerm {
	a := pod.Spec.Affinity
	var weighted []corev1.WeightedPodAffinityTerm
	switch {
	case a == nil:
		return nil
	case anti && a.PodAntiAffinity != nil:
		weighted = a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	case !anti && a.PodAffinity != nil:
		weighted = a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	terms := make([]corev1.PodAffinityTerm, len(weighted))
	weights := make([]int32, len(weighted))
	for i := range weighted {
		terms[i], weights[i] = weighted[i].PodAffinityTerm, weighted[i].Weight
	}
	return termsOf(pod, terms, weights)
}

// podAffinityAllows is InterPodAffinity's filter (interpodaffinity/filtering.go
// satisfyPodAffinity, satisfyPodAntiAffinity, satisfyExistingPodsAntiAffinity).
func podAffinityAllows(node *corev1.Node, pod launcherPod, bound []launcherPod, byName map[string]*corev1.Node) bool {
	// Every required affinity term finds a matching pod in the node's domain; the first
	// pod of a group that selects itself passes where no pod matches anywhere.
	affinity := required(pod.pod, false)
	anyMatch, allHere := false, true
	for _, t := range affinity {
		if _, ok := node.Labels[t.topologyKey]; !ok {
			return false // all topology labels must exist on the node
		}
		here := false
		for _, b := range bound {
			if bn := byName[b.node]; bn != nil && t.matches(b.pod) {
				anyMatch = true
				here = here || t.sameDomain(node, bn)
			}
		}
		allHere = allHere && here
	}
	if !allHere {
		self := true
		for _, t := range affinity {
			self = self && t.matches(pod.pod)
		}
		if anyMatch || !self {
			return false
		}
	}
	// No required anti-affinity term of the pod finds a matching pod in the node's
	// domain, and no bound pod's required anti-affinity term selects the pod there.
	for _, b := range bound {
		bn := byName[b.node]
		if bn == nil {
			continue
		}
		for _, t := range required(pod.pod, true) {
			if t.matches(b.pod) && t.sameDomain(node, bn) {
				return false
			}
		}
		for _, t := range required(b.pod, true) {
			if t.matches(pod.pod) && t.sameDomain(node, bn) {
				return false
			}
		}
	}
	return true
}

// scoreNodes runs the score plugins over the feasible nodes; all is every node, whose
// bound pods InterPodAffinity counts.
func scoreNodes(pod launcherPod, feasible []*corev1.Node, all []corev1.Node, bound []launcherPod) []NodeScore {
	n := len(feasible)
	taints, nodeAff, podAff := make([]int64, n), make([]int64, n), make([]int64, n)

	// TaintToleration (tainttoleration/taint_toleration.go Score,
	// countIntolerableTaintsPreferNoSchedule): the node's PreferNoSchedule taints that the
	// pod's tolerations of effect PreferNoSchedule or of no effect do not tolerate;
	// normalized reversed, so that the node with the most scores 0 and a node with none
	// 100 (NormalizeScore, helper.DefaultNormalizeScore(MaxNodeScore, true)).
	var preferNoSchedule []corev1.Toleration
	for _, t := range pod.pod.Spec.Tolerations {
		if t.Effect == "" || t.Effect == corev1.TaintEffectPreferNoSchedule {
			preferNoSchedule = append(preferNoSchedule, t)
		}
	}
	for i, node := range feasible {
		for j := range node.Spec.Taints {
			t := &node.Spec.Taints[j]
			if t.Effect == corev1.TaintEffectPreferNoSchedule && !corev1helpers.TolerationsTolerateTaint(klog.Background(), preferNoSchedule, t, false) {
				taints[i]++
			}
		}
	}
	defaultNormalize(taints, true)

	// NodeAffinity (nodeaffinity/node_affinity.go Score): the sum of the weights of the
	// preferred terms the node matches, normalized (DefaultNormalizeScore, not reversed).
	if a := pod.pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		if terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution); err == nil {
			for i, node := range feasible {
				nodeAff[i] = terms.Score(node)
			}
		}
	}
	defaultNormalize(nodeAff, false)

	interPodAffinity(pod, feasible, all, bound, podAff)

	out := make([]NodeScore, n)
	for i, node := range feasible {
		s := NodeScore{
			Node:               node.Name,
			TaintToleration:    taints[i] * weightTaintToleration,
			NodeAffinity:       nodeAff[i] * weightNodeAffinity,
			InterPodAffinity:   podAff[i] * weightInterPodAffinity,
			NodeResourcesFit:   leastAllocated(node, pod, bound) * weightNodeResourcesFit,
			BalancedAllocation: balancedAllocation(node, pod, bound) * weightBalancedAllocation,
		}
		s.Total = s.TaintToleration + s.NodeAffinity + s.InterPodAffinity + s.NodeResourcesFit + s.BalancedAllocation
		out[i] = s
	}
	return out
}

// defaultNormalize is helper.DefaultNormalizeScore (plugins/helper/normalize_score.go):
// scores from [0, max] to [0, MaxNodeScore], integer arithmetic, reversed on request; all
// MaxNodeScore when reversed and every score is 0.
func defaultNormalize(scores []int64, reverse bool) {
	var top int64
	for _, s := range scores {
		top = max(top, s)
	}
	for i := range scores {
		switch {
		case top == 0 && reverse:
			scores[i] = maxNodeScore
		case top == 0:
		default:
			scores[i] = maxNodeScore * scores[i] / top
			if reverse {
				scores[i] = maxNodeScore - scores[i]
			}
		}
	}
}

// interPodAffinity is InterPodAffinity's score (interpodaffinity/scoring.go PreScore,
// processExistingPod, Score, NormalizeScore): for every bound pod on a node of all, the
// incoming pod's preferred affinity terms that match it add their weight to its topology
// domain and the preferred anti-affinity terms subtract theirs; the bound pod's own
// required affinity terms that match the incoming pod add hardPodAffinityWeight (default
// 1, apis/config/v1/defaults.go), its preferred affinity terms add and its preferred
// anti-affinity terms subtract. A node scores the sum of its domains; the sums are
// normalized from [min, max] over the feasible nodes to [0, 100] (all 0 when equal).
func interPodAffinity(pod launcherPod, feasible []*corev1.Node, all []corev1.Node, bound []launcherPod, out []int64) {
	const hardPodAffinityWeight = 1
	byName := map[string]*corev1.Node{}
	for i := range all {
		byName[all[i].Name] = &all[i]
	}
	type domain struct{ key, value string }
	topo := map[domain]int64{}
	add := func(terms []podTerm, target *corev1.Pod, on *corev1.Node, sign int64) {
		for _, t := range terms {
			if v, ok := on.Labels[t.topologyKey]; ok && t.matches(target) {
				topo[domain{t.topologyKey, v}] += sign * t.weight
			}
		}
	}
	for _, b := range bound {
		on := byName[b.node]
		if on == nil || len(on.Labels) == 0 {
			continue
		}
		add(preferred(pod.pod, false), b.pod, on, 1)
		add(preferred(pod.pod, true), b.pod, on, -1)
		hard := required(b.pod, false)
		for i := range hard {
			hard[i].weight = hardPodAffinityWeight
		}
		add(hard, pod.pod, on, 1)
		add(preferred(b.pod, false), pod.pod, on, 1)
		add(preferred(b.pod, true), pod.pod, on, -1)
	}
	if len(topo) == 0 {
		return
	}
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for i, node := range feasible {
		var s int64
		for d, v := range topo {
			if value, ok := node.Labels[d.key]; ok && value == d.value {
				s += v
			}
		}
		out[i] = s
		lo, hi = min(lo, s), max(hi, s)
	}
	for i := range out {
		f := float64(0)
		if hi > lo {
			f = float64(maxNodeScore) * (float64(out[i]-lo) / float64(hi-lo))
		}
		out[i] = int64(f)
	}
}

// requestedOn sums the requests of the launcher pods bound to node, plus pod; nonZero
// counts a pod that asks no CPU or memory at the scheduler's defaults.
func requestedOn(node *corev1.Node, pod launcherPod, bound []launcherPod, nonZero bool) (cpu, mem int64) {
	count := func(p launcherPod) {
		c, m := p.cpu, p.mem
		if nonZero && c == 0 {
			c = defaultMilliCPURequest
		}
		if nonZero && m == 0 {
			m = defaultMemoryRequest
		}
		cpu, mem = cpu+c, mem+m
	}
	for _, b := range bound {
		if b.node == node.Name {
			count(b)
		}
	}
	count(pod)
	return cpu, mem
}

// leastAllocated is NodeResourcesFit's default score, LeastAllocated with CPU and memory
// of weight 1 (noderesources/least_allocated.go leastResourceScorer; apis/config/v1/
// defaults.go defaultResourceSpec): per resource (allocatable - requested) × 100 /
// allocatable, 0 when over, averaged; a resource the node does not report is skipped.
func leastAllocated(node *corev1.Node, pod launcherPod, bound []launcherPod) int64 {
	cpu, mem := requestedOn(node, pod, bound, true)
	var score, weights int64
	for _, r := range [][2]int64{{cpu, node.Status.Allocatable.Cpu().MilliValue()}, {mem, node.Status.Allocatable.Memory().Value()}} {
		requested, capacity := r[0], r[1]
		if capacity == 0 {
			continue
		}
		if requested <= capacity {
			score += (capacity - requested) * maxNodeScore / capacity
		}
		weights++
	}
	if weights == 0 {
		return 0
	}
	return score / weights
}

// balancedAllocation is NodeResourcesBalancedAllocation's score
// (noderesources/balanced_allocation.go balancedResourceScorer): with the fractions of
// CPU and memory requested (capped at 1), balance = (1 - |cpu - memory| / 2) × 100 with
// the pod and without it, and the score is 50 + (50 + with - without) / 2: towards 100
// when the pod evens the node out, towards 50 when it tilts it. It counts the requests
// as asked (useRequested), without the scheduler's defaults.
func balancedAllocation(node *corev1.Node, pod launcherPod, bound []launcherPod) int64 {
	cpu, mem := requestedOn(node, pod, bound, false)
	with := balance(node, cpu, mem)
	without := balance(node, cpu-pod.cpu, mem-pod.mem)
	return maxNodeScore/2 + (maxNodeScore/2+with-without)/2
}

func balance(node *corev1.Node, cpu, mem int64) int64 {
	var fractions []float64
	for _, r := range [][2]int64{{cpu, node.Status.Allocatable.Cpu().MilliValue()}, {mem, node.Status.Allocatable.Memory().Value()}} {
		if r[1] == 0 {
			continue
		}
		fractions = append(fractions, math.Min(float64(r[0])/float64(r[1]), 1))
	}
	std := 0.0
	if len(fractions) == 2 {
		std = math.Abs((fractions[0] - fractions[1]) / 2)
	}
	return int64((1 - std) * float64(maxNodeScore))
}

// describeScores is a placement's scores on one line, for History and failure messages.
func describeScores(scores []NodeScore) string {
	parts := make([]string, len(scores))
	for i, s := range scores {
		parts[i] = s.String()
	}
	return strings.Join(parts, "; ")
}
