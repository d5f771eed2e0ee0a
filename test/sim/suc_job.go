package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// This file builds what System Upgrade Controller builds from a Plan: its latest version
// and hash, and the Job it runs on one node. Every rule names the fact of
// shared/facts/suc.md it follows (rancher/system-upgrade-controller@f1362a3,
// pkg/upgrade/job/job.go, pkg/upgrade/container/container.go, pkg/upgrade/plan/plan.go).

// Labels and annotations SUC reads and writes (fact 25, 26; pkg/apis/upgrade.cattle.io/constants.go).
const (
	LabelController      = "upgrade.cattle.io/controller"
	LabelExclusive       = "upgrade.cattle.io/exclusive"
	LabelNode            = "upgrade.cattle.io/node"
	LabelPlan            = "upgrade.cattle.io/plan"
	LabelVersion         = "upgrade.cattle.io/version"
	NodePlanPrefix       = "plan.upgrade.cattle.io/"
	AnnotationTTL        = "upgrade.cattle.io/ttl-seconds-after-finished"
	AnnotationDigest     = "upgrade.cattle.io/digest"
	annotationApplied    = "objectset.rio.cattle.io/applied"
	annotationObjectSet  = "objectset.rio.cattle.io/id"
	annotationOwnerGVK   = "objectset.rio.cattle.io/owner-gvk"
	annotationOwnerName  = "objectset.rio.cattle.io/owner-name"
	annotationOwnerNS    = "objectset.rio.cattle.io/owner-namespace"
	labelObjectSetHash   = "objectset.rio.cattle.io/hash"
	hostRootVolume       = "host-root"
	podInfoVolume        = "pod-info"
	secretsMountBase     = "/run/system-upgrade/secrets"
	podInfoMountPath     = "/run/system-upgrade/pod"
	defaultControllerCap = "CAP_SYS_BOOT"
)

// JobSettings are the Job defaults SUC reads from its environment at start-up (fact 4).
// DefaultJobSettings copies the code defaults of job.go, not the shipped manifest's
// ConfigMap (which sets a 900 s deadline, backoff 99 and pull policy Always).
type JobSettings struct {
	ActiveDeadlineSeconds    int64
	ActiveDeadlineSecondsMax int64
	BackoffLimit             int32
	ImagePullPolicy          corev1.PullPolicy
	KubectlImage             string
	Privileged               bool
	TTLSecondsAfterFinished  int32
	PodReplacementPolicy     batchv1.PodReplacementPolicy
}

// DefaultJobSettings are SUC's code defaults (fact 4).
func DefaultJobSettings() JobSettings {
	return JobSettings{
		ActiveDeadlineSeconds:   600,
		BackoffLimit:            2,
		ImagePullPolicy:         corev1.PullIfNotPresent,
		KubectlImage:            "rancher/kubectl:v1.30.3",
		Privileged:              true,
		TTLSecondsAfterFinished: 900,
		PodReplacementPolicy:    batchv1.TerminatingOrFailed,
	}
}

// MungeVersion is SUC's latestVersion of a spec.version: every '+' becomes '-' (fact 14).
func MungeVersion(v string) string { return strings.ReplaceAll(v, "+", "-") }

// LatestHash is SUC's status.latestHash (fact 16): the SHA-224 of the latest version,
// the service account, the values at the paths the upgrade.cattle.io/digest annotation
// lists, and the hashes of the Secrets not marked ignoreUpdates, in that order. Nothing
// else of the spec goes in: not the image, args, envs, drain or tolerations.
func LatestHash(latestVersion, serviceAccount string, digestValues, secretHashes []string) string {
	h := sha256.New224()
	h.Write([]byte(latestVersion))
	h.Write([]byte(serviceAccount))
	for _, v := range digestValues {
		h.Write([]byte(v))
	}
	for _, s := range secretHashes {
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// digestValues reads the values at the paths of the Plan's upgrade.cattle.io/digest
// annotation (fact 16, item 3). SUC reads them from the Plan converted to a map by
// wrangler's data package; a non-string value is printed with fmt here.
func digestValues(plan *sucv1.Plan) ([]string, error) {
	paths := plan.Annotations[AnnotationDigest]
	if paths == "" {
		return nil, nil
	}
	raw, err := json.Marshal(plan)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range strings.Split(paths, ",") {
		var cur any = obj
		for _, key := range strings.Split(p, ".") {
			m, _ := cur.(map[string]any)
			cur = m[key]
		}
		switch v := cur.(type) {
		case nil:
			out = append(out, "")
		case string:
			out = append(out, v)
		default:
			out = append(out, fmt.Sprint(v))
		}
	}
	return out, nil
}

// secretHash is kubectl's SecretHash (k8s.io/kubectl/pkg/util/hash), which SUC hashes
// each referenced Secret with (fact 16, item 4): a SHA-256 of the Secret's kind, type,
// name and data, its first ten hex digits with vowels and look-alikes replaced.
func secretHash(s *corev1.Secret) (string, error) {
	data, err := json.Marshal(map[string]any{"kind": "Secret", "type": s.Type, "name": s.Name, "data": s.Data})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	enc := []rune(hex.EncodeToString(sum[:])[:10])
	for i, r := range enc {
		switch r {
		case '0':
			enc[i] = 'g'
		case '1':
			enc[i] = 'h'
		case '3':
			enc[i] = 'k'
		case 'a':
			enc[i] = 'm'
		case 'e':
			enc[i] = 't'
		}
	}
	return string(enc), nil
}

// SafeConcatName is wrangler's name.SafeConcatName, which SUC names Jobs and secret
// volumes with (fact 24): the parts joined with '-'; a result of 64 characters or more
// keeps its first 57 (56 if the 57th is not a lowercase letter or digit) and ends in '-'
// and the first 5 (or 6) hex digits of the SHA-256 of the whole.
func SafeConcatName(parts ...string) string {
	name := strings.Join(parts, "-")
	if len(name) < 64 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	digest := hex.EncodeToString(sum[:])
	keep, digits := 57, 5
	if c := name[56]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
		keep, digits = 56, 6
	}
	return name[:keep] + "-" + digest[:digits]
}

// TagImage is SUC's WithLatestTag (fact 35): an image with neither tag nor digest gets
// ":<latestVersion>" and is written in its familiar form (docker.io/ and library/
// dropped); an image with a tag or digest is used as given. It applies to the prepare
// and upgrade containers only.
func TagImage(image, latestVersion string) string {
	if image == "" || strings.Contains(image, "@") {
		return image
	}
	last := image[strings.LastIndex(image, "/")+1:]
	if strings.Contains(last, ":") {
		return image
	}
	familiar := strings.TrimPrefix(image, "docker.io/")
	familiar = strings.TrimPrefix(familiar, "index.docker.io/")
	familiar = strings.TrimPrefix(familiar, "library/")
	return familiar + ":" + latestVersion
}

// jobName is the name SUC gives the Job of a Plan on a node (fact 24): always cut to 63
// characters, because the hash alone is 56. Read a Job's labels, never its name.
func jobName(plan *sucv1.Plan, node *corev1.Node) string {
	short, _, _ := strings.Cut(node.Name, ".")
	return SafeConcatName("apply", plan.Name, "on", short, "with", plan.Status.LatestHash)
}

// nodeHostname is the node's kubernetes.io/hostname label, or its name when it has none
// (pkg/upgrade/node/node.go Hostname; facts 20, 29).
func nodeHostname(node *corev1.Node) string {
	if h := node.Labels[corev1.LabelHostname]; h != "" {
		return h
	}
	return node.Name
}

// newJob builds the Job SUC builds for plan on node (job.go New; facts 24 to 41).
func newJob(plan *sucv1.Plan, node *corev1.Node, controller string, st JobSettings) *batchv1.Job {
	exclusive := strconv.FormatBool(plan.Spec.Exclusive)
	hostname := nodeHostname(node)

	// Fact 28: the TTL is raised to postCompleteDelay + 1 minute when that is longer.
	ttl := st.TTLSecondsAfterFinished
	if d := plan.Spec.PostCompleteDelay; d != nil {
		if want := d.Duration + time.Minute; time.Duration(ttl)*time.Second < want {
			ttl = int32(want.Seconds())
		}
	}

	// Fact 26: the TTL annotation, and the Plan's annotations but cattle.io/ and kubectl ones.
	jobAnnotations := map[string]string{AnnotationTTL: strconv.FormatInt(int64(ttl), 10)}
	podAnnotations := map[string]string{}
	for k, v := range plan.Annotations {
		if !strings.Contains(k, "cattle.io/") && !strings.Contains(k, "kubectl.kubernetes.io/") {
			jobAnnotations[k], podAnnotations[k] = v, v
		}
	}
	// Fact 25: six labels, and the Plan's labels but cattle.io/ ones; the pod gets the same.
	jobLabels := map[string]string{
		LabelController:            controller,
		LabelExclusive:             exclusive,
		LabelNode:                  node.Name,
		LabelPlan:                  plan.Name,
		LabelVersion:               plan.Status.LatestVersion,
		NodePlanPrefix + plan.Name: plan.Status.LatestHash,
	}
	for k, v := range plan.Labels {
		if !strings.Contains(k, "cattle.io/") {
			jobLabels[k] = v
		}
	}

	podSpec := corev1.PodSpec{
		// Fact 29.
		HostIPC: true, HostPID: true, HostNetwork: true,
		DNSPolicy:          corev1.DNSClusterFirstWithHostNet,
		PriorityClassName:  plan.Spec.PriorityClassName,
		ServiceAccountName: plan.Spec.ServiceAccountName,
		RestartPolicy:      corev1.RestartPolicyNever,
		ImagePullSecrets:   plan.Spec.ImagePullSecrets,
		Affinity: &corev1.Affinity{
			NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{hostname},
				}}}},
			}},
			PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: LabelPlan, Operator: metav1.LabelSelectorOpIn, Values: []string{plan.Name},
				}}},
				TopologyKey: corev1.LabelHostname,
			}}},
		},
		Tolerations: append([]corev1.Toleration{{
			Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		}}, plan.Spec.Tolerations...),
		// Fact 30: host-root and pod-info always.
		Volumes: []corev1.Volume{{
			Name:         hostRootVolume,
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: ptr.To(corev1.HostPathDirectory)}},
		}, {
			Name: podInfoVolume,
			VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				DefaultMode: ptr.To[int32](0o644),
				Items: []corev1.DownwardAPIVolumeFile{
					{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}},
					{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations"}},
				},
			}},
		}},
	}
	// Fact 23: an exclusive Plan's anti-affinity replaces the per-Plan one.
	if plan.Spec.Exclusive {
		podSpec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: LabelExclusive, Operator: metav1.LabelSelectorOpIn, Values: []string{exclusive},
			}}},
			TopologyKey: corev1.LabelHostname,
		}}
	}
	// Fact 30: a volume per secret, then one hostPath volume per spec.upgrade.volumes entry only.
	for _, s := range plan.Spec.Secrets {
		podSpec.Volumes = append(podSpec.Volumes, corev1.Volume{
			Name: SafeConcatName("secret", s.Name),
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: s.Name, DefaultMode: s.DefaultMode, Optional: ptr.To(s.IgnoreUpdates),
			}},
		})
	}
	for _, v := range plan.Spec.Upgrade.Volumes {
		podSpec.Volumes = append(podSpec.Volumes, corev1.Volume{
			Name: v.Name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: v.Source}},
		})
	}

	c := containerBuilder{plan: plan, settings: st}
	// Fact 34: prepare, then drain or else cordon, as init containers; upgrade is the main one.
	if p := plan.Spec.Prepare; p != nil {
		podSpec.InitContainers = append(podSpec.InitContainers,
			c.build("prepare", *p, TagImage(p.Image, plan.Status.LatestVersion), p.Volumes, p.SecurityContext)) // facts 32, 35, 37
	}
	switch {
	case plan.Spec.Drain != nil:
		spec := sucv1.ContainerSpec{Image: st.KubectlImage, Args: drainArgs(plan.Spec.Drain, node.Name)}
		podSpec.InitContainers = append(podSpec.InitContainers, c.build("drain", spec, spec.Image, plan.Spec.Upgrade.Volumes, nil))
	case plan.Spec.Cordon:
		spec := sucv1.ContainerSpec{Image: st.KubectlImage, Args: []string{"cordon", node.Name}}
		podSpec.InitContainers = append(podSpec.InitContainers, c.build("cordon", spec, spec.Image, plan.Spec.Upgrade.Volumes, nil))
	}
	// Fact 37: the upgrade container is privileged with CAP_SYS_BOOT unless the Plan says otherwise.
	sc := plan.Spec.Upgrade.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{Privileged: ptr.To(st.Privileged), Capabilities: &corev1.Capabilities{Add: []corev1.Capability{defaultControllerCap}}}
	}
	podSpec.Containers = []corev1.Container{
		c.build("upgrade", *plan.Spec.Upgrade, TagImage(plan.Spec.Upgrade.Image, plan.Status.LatestVersion), plan.Spec.Upgrade.Volumes, sc),
	}

	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: jobName(plan, node), Namespace: plan.Namespace,
			Labels: jobLabels, Annotations: jobAnnotations,
			// Fact 27: owned by the Plan, controller true, blockOwnerDeletion false.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: sucv1.SchemeGroupVersion.String(), Kind: "Plan", Name: plan.Name, UID: plan.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Spec: batchv1.JobSpec{
			// Fact 28.
			Completions:             ptr.To[int32](1),
			Parallelism:             ptr.To[int32](0),
			BackoffLimit:            ptr.To(st.BackoffLimit),
			PodReplacementPolicy:    ptr.To(st.PodReplacementPolicy),
			TTLSecondsAfterFinished: ptr.To(ttl),
			ActiveDeadlineSeconds:   activeDeadline(plan.Spec.JobActiveDeadlineSecs, st),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: copyMap(jobLabels), Annotations: podAnnotations},
				Spec:       podSpec,
			},
		},
	}
	// Fact 28: created paused, un-paused once the node is in status.applying.
	for _, h := range plan.Status.Applying {
		if h == hostname {
			job.Spec.Parallelism = ptr.To[int32](1)
		}
	}
	return job
}

// activeDeadline is fact 36: nil or negative takes the controller default, 0 means no
// deadline, a positive value is used; a configured maximum fills a nil and clamps.
func activeDeadline(plan *int64, st JobSettings) *int64 {
	var d *int64
	switch {
	case plan == nil || *plan < 0:
		d = ptr.To(st.ActiveDeadlineSeconds)
	case *plan > 0:
		d = ptr.To(*plan)
	}
	if st.ActiveDeadlineSecondsMax > 0 && (d == nil || *d > st.ActiveDeadlineSecondsMax) {
		d = ptr.To(st.ActiveDeadlineSecondsMax)
	}
	return d
}

// drainArgs are the kubectl arguments of SUC's drain container (facts 39 to 41).
func drainArgs(d *sucv1.DrainSpec, node string) []string {
	sel := labels.NewSelector()
	notSUC, _ := labels.NewRequirement(LabelController, selection.DoesNotExist, nil)
	sel = sel.Add(*notSUC)
	if d.PodSelector != nil {
		if s, err := metav1.LabelSelectorAsSelector(d.PodSelector); err == nil {
			if reqs, ok := s.Requirements(); ok {
				sel = sel.Add(reqs...)
			}
		}
	}
	args := []string{"drain", node, "--pod-selector", sel.String()}
	if d.IgnoreDaemonSets == nil || *d.IgnoreDaemonSets {
		args = append(args, "--ignore-daemonsets")
	}
	if (d.DeleteLocalData == nil || *d.DeleteLocalData) && (d.DeleteEmptydirData == nil || *d.DeleteEmptydirData) {
		args = append(args, "--delete-emptydir-data")
	}
	if d.Force {
		args = append(args, "--force")
	}
	if t := d.Timeout; t != nil {
		// Fact 41: an integer is a time.Duration in nanoseconds: 900 is "900ns".
		if t.Type == intstr.Int {
			args = append(args, "--timeout", time.Duration(t.IntVal).String())
		} else {
			args = append(args, "--timeout", t.StrVal)
		}
	}
	if d.GracePeriod != nil {
		args = append(args, "--grace-period", strconv.FormatInt(int64(*d.GracePeriod), 10))
	}
	if d.DisableEviction {
		args = append(args, "--disable-eviction=true")
	}
	if d.SkipWaitForDeleteTimeout > 0 {
		args = append(args, "--skip-wait-for-delete-timeout", strconv.Itoa(d.SkipWaitForDeleteTimeout))
	}
	return args
}

// containerBuilder builds the containers of one Plan's Job (container.go New and its options).
type containerBuilder struct {
	plan     *sucv1.Plan
	settings JobSettings
}

func (b containerBuilder) build(name string, spec sucv1.ContainerSpec, image string, volumes []sucv1.VolumeSpec, sc *corev1.SecurityContext) corev1.Container {
	fieldEnv := func(n, p string) corev1.EnvVar {
		return corev1.EnvVar{Name: n, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}}
	}
	// Fact 33: SUC's node/pod vars, the container's own envs, then the Plan vars.
	env := []corev1.EnvVar{
		fieldEnv("SYSTEM_UPGRADE_NODE_NAME", "spec.nodeName"),
		fieldEnv("SYSTEM_UPGRADE_POD_NAME", "metadata.name"),
		fieldEnv("SYSTEM_UPGRADE_POD_UID", "metadata.uid"),
	}
	env = append(env, spec.Env...)
	env = append(env,
		corev1.EnvVar{Name: "SYSTEM_UPGRADE_PLAN_NAME", Value: b.plan.Name},
		corev1.EnvVar{Name: "SYSTEM_UPGRADE_PLAN_LATEST_HASH", Value: b.plan.Status.LatestHash},
		corev1.EnvVar{Name: "SYSTEM_UPGRADE_PLAN_LATEST_VERSION", Value: b.plan.Status.LatestVersion},
	)
	// Fact 31: host-root at /host and pod-info in every container, then secrets, then
	// the volume list of fact 32 (mounts only: WithVolumes never creates a volume).
	mounts := []corev1.VolumeMount{
		{Name: hostRootVolume, MountPath: "/host"},
		{Name: podInfoVolume, MountPath: podInfoMountPath, ReadOnly: true},
	}
	for _, s := range b.plan.Spec.Secrets {
		p := s.Path
		switch {
		case p == "":
			p = path.Join(secretsMountBase, s.Name)
		case !strings.HasPrefix(p, "/"):
			p = path.Join(secretsMountBase, p)
		}
		mounts = append(mounts, corev1.VolumeMount{Name: SafeConcatName("secret", s.Name), MountPath: p, ReadOnly: true})
	}
	for _, v := range volumes {
		mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: v.Destination})
	}
	return corev1.Container{
		Name: name, Image: image, Command: spec.Command, Args: spec.Args,
		Env: env, EnvFrom: spec.EnvFrom, VolumeMounts: mounts,
		ImagePullPolicy: b.settings.ImagePullPolicy, // fact 38
		SecurityContext: sc,                         // fact 37: prepare as given, none for drain/cordon
	}
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// templateDigest stands in for what wrangler records in objectset.rio.cattle.io/applied
// (the applied object, compressed): enough to tell that the desired pod template changed
// (fact 49).
func templateDigest(t *corev1.PodTemplateSpec) string {
	data, _ := json.Marshal(t)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}
