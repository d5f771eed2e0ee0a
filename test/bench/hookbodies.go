package main

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	dockerv1 "sigs.k8s.io/cluster-api/test/infrastructure/docker/api/v1beta2"

	"github.com/capi-inplace/capi-inplace/test/capisim"
)

// The hook requests are built the way Cluster API v1.14 sends them (test/capisim,
// extension/inplace_test.go): current and desired objects, spec only, with a
// KubeadmConfig(Template) and a DevMachine(Template) on the Docker backend as the bootstrap and
// infrastructure objects, since those are kinds both capi-inplace and Cluster API's
// reference handlers read (the reference decodes them with a scheme of kubeadm and
// Docker types and fails on any other kind). Both servers get byte-identical bodies.

// The version bump of the hook benchmark: one minor, as Cluster API rolls it out.
const (
	hookFromVersion = "v1.35.0"
	hookToVersion   = "v1.36.0"
)

// kubeadmConfigSpec is a realistic KubeadmConfig spec for a Kubernetes minor. For a
// control plane from v1.31 up to v1.35 it carries the ControlPlaneKubeletLocalMode gate
// that KubeadmControlPlane derives from the version (and drops from v1.36).
func kubeadmConfigSpec(minor int, controlPlane bool) bootstrapv1.KubeadmConfigSpec {
	spec := bootstrapv1.KubeadmConfigSpec{
		JoinConfiguration: bootstrapv1.JoinConfiguration{
			NodeRegistration: bootstrapv1.NodeRegistrationOptions{
				KubeletExtraArgs: []bootstrapv1.Arg{
					arg("eviction-hard", "nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%"),
					arg("fail-swap-on", "false"),
					arg("max-pods", "200"),
					arg("cgroup-driver", "systemd"),
				},
			},
		},
		Files: []bootstrapv1.File{
			{Path: "/etc/sysctl.d/90-kubelet.conf", Owner: "root:root", Permissions: "0644", Content: "vm.overcommit_memory=1\nkernel.panic=10\nkernel.panic_on_oops=1\n"},
			{Path: "/etc/containerd/config.d/registry.toml", Owner: "root:root", Permissions: "0600", Content: "[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"docker.io\"]\n  endpoint = [\"https://mirror.example.internal\"]\n"},
		},
		PreKubeadmCommands:  []string{"systemctl restart containerd", "sysctl --system"},
		PostKubeadmCommands: []string{"echo done > /run/cluster-api/bootstrap-success.complete"},
		Users:               []bootstrapv1.User{{Name: "capi", Sudo: "ALL=(ALL) NOPASSWD:ALL", Groups: "wheel"}},
	}
	if controlPlane {
		spec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{
			APIServer: bootstrapv1.APIServer{
				ExtraArgs: []bootstrapv1.Arg{arg("audit-log-maxage", "30"), arg("audit-log-path", "/var/log/audit.log"), arg("profiling", "false")},
				CertSANs:  []string{"localhost", "127.0.0.1", "0.0.0.0", "host.docker.internal"},
			},
			ControllerManager: bootstrapv1.ControllerManager{ExtraArgs: []bootstrapv1.Arg{arg("bind-address", "0.0.0.0"), arg("profiling", "false")}},
			Scheduler:         bootstrapv1.Scheduler{ExtraArgs: []bootstrapv1.Arg{arg("bind-address", "0.0.0.0")}},
			Etcd:              bootstrapv1.Etcd{Local: bootstrapv1.LocalEtcd{ImageTag: "3.6.4-0", ExtraArgs: []bootstrapv1.Arg{arg("quota-backend-bytes", "8589934592")}}},
		}
		if minor >= 31 && minor < 36 {
			spec.ClusterConfiguration.FeatureGates = map[string]bool{"ControlPlaneKubeletLocalMode": true}
		}
	}
	return spec
}

func arg(name, value string) bootstrapv1.Arg { return bootstrapv1.Arg{Name: name, Value: &value} }

// devMachineSpec is the spec of a DevMachine on the Docker backend, the kind Cluster API's
// reference handlers update in place (DockerMachine is deprecated in its favour).
func devMachineSpec() dockerv1.DevMachineSpec {
	return dockerv1.DevMachineSpec{Backend: dockerv1.DevMachineBackendSpec{Docker: &dockerv1.DockerMachineBackendSpec{
		CustomImage:   "kindest/node:" + hookToVersion,
		PreLoadImages: []string{"registry.k8s.io/pause:3.10", "docker.io/calico/node:v3.29.1"},
		ExtraMounts:   []dockerv1.Mount{{ContainerPath: "/var/run/docker.sock", HostPath: "/var/run/docker.sock"}},
	}}}
}

// specOnly marshals obj and keeps apiVersion, kind, metadata (name, namespace, labels,
// annotations) and spec, as Cluster API puts objects into hook requests.
func specOnly(obj any) (runtime.RawExtension, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return runtime.RawExtension{}, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return runtime.RawExtension{}, err
	}
	meta, _ := doc["metadata"].(map[string]any)
	kept := map[string]any{}
	for _, k := range []string{"name", "namespace", "labels", "annotations"} {
		if v, ok := meta[k]; ok {
			kept[k] = v
		}
	}
	out := map[string]any{"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": kept, "spec": doc["spec"]}
	raw, err = json.Marshal(out)
	return runtime.RawExtension{Raw: raw}, err
}

func objectMeta(ns, name string, labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}
}

// canUpdateMachineSetBody is what the MachineDeployment controller sends when the
// MachineDeployment's version goes from hookFromVersion to hookToVersion.
func canUpdateMachineSetBody(ms *clusterv1.MachineSet) (*runtimehooksv1.CanUpdateMachineSetRequest, error) {
	cur := capisim.SpecOnlySet(ms)
	cur.Spec.Template.Spec.Version = hookFromVersion
	want := *cur.DeepCopy()
	want.Name = mdName + "-6c9d8e7f5"
	want.Spec.Template.Spec.Version = hookToVersion

	labels := map[string]string{clusterv1.ClusterNameLabel: ms.Spec.ClusterName}
	bootstrap := &bootstrapv1.KubeadmConfigTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfigTemplate"},
		ObjectMeta: objectMeta(ms.Namespace, mdName+"-bootstrap", labels),
		Spec:       bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{Spec: kubeadmConfigSpec(35, false)}},
	}
	infra := &dockerv1.DevMachineTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: dockerv1.GroupVersion.String(), Kind: "DevMachineTemplate"},
		ObjectMeta: objectMeta(ms.Namespace, mdName+"-infra", labels),
		Spec:       dockerv1.DevMachineTemplateSpec{Template: dockerv1.DevMachineTemplateResource{Spec: devMachineSpec()}},
	}
	b, err := specOnly(bootstrap)
	if err != nil {
		return nil, err
	}
	i, err := specOnly(infra)
	if err != nil {
		return nil, err
	}
	req := &runtimehooksv1.CanUpdateMachineSetRequest{
		Current: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: cur, BootstrapConfigTemplate: b, InfrastructureMachineTemplate: i},
		Desired: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: want, BootstrapConfigTemplate: b, InfrastructureMachineTemplate: i},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("CanUpdateMachineSetRequest"))
	return req, nil
}

// canUpdateMachineBody is what KubeadmControlPlane sends for a control plane machine
// going from hookFromVersion to hookToVersion: the Machine, its KubeadmConfig as KCP
// derives it for each version (the v1.36 one drops a feature gate), its DevMachine.
func canUpdateMachineBody(ns, cluster string) (*runtimehooksv1.CanUpdateMachineRequest, error) {
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster, clusterv1.MachineControlPlaneLabel: "", clusterv1.MachineControlPlaneNameLabel: "cp"}
	spec := benchMachineSpec(cluster, "cp-1", hookFromVersion)
	cur := clusterv1.Machine{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: objectMeta(ns, "cp-1", labels),
		Spec:       spec,
	}
	want := *cur.DeepCopy()
	want.Spec.Version = hookToVersion

	config := func(minor int) (runtime.RawExtension, error) {
		return specOnly(&bootstrapv1.KubeadmConfig{
			TypeMeta:   metav1.TypeMeta{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfig"},
			ObjectMeta: objectMeta(ns, "cp-1", labels),
			Spec:       kubeadmConfigSpec(minor, true),
		})
	}
	curBootstrap, err := config(35)
	if err != nil {
		return nil, err
	}
	wantBootstrap, err := config(36)
	if err != nil {
		return nil, err
	}
	infra, err := specOnly(&dockerv1.DevMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: dockerv1.GroupVersion.String(), Kind: "DevMachine"},
		ObjectMeta: objectMeta(ns, "cp-1", labels),
		Spec:       devMachineSpec(),
	})
	if err != nil {
		return nil, err
	}
	req := &runtimehooksv1.CanUpdateMachineRequest{
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: cur, BootstrapConfig: curBootstrap, InfrastructureMachine: infra},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: want, BootstrapConfig: wantBootstrap, InfrastructureMachine: infra},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("CanUpdateMachineRequest"))
	return req, nil
}

// updateMachineBody is what the Machine controller sends for a machine it updates in
// place: the Machine as it stands (Cluster API wrote the desired version into it), its
// KubeadmConfig and its DevMachine.
func updateMachineBody(m *clusterv1.Machine) (*runtimehooksv1.UpdateMachineRequest, error) {
	desired := capisim.SpecOnly(m)
	bootstrap, err := specOnly(&bootstrapv1.KubeadmConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfig"},
		ObjectMeta: objectMeta(m.Namespace, m.Name, m.Labels),
		Spec:       kubeadmConfigSpec(36, false),
	})
	if err != nil {
		return nil, err
	}
	infra, err := specOnly(&dockerv1.DevMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: dockerv1.GroupVersion.String(), Kind: "DevMachine"},
		ObjectMeta: objectMeta(m.Namespace, m.Name, m.Labels),
		Spec:       devMachineSpec(),
	})
	if err != nil {
		return nil, err
	}
	req := &runtimehooksv1.UpdateMachineRequest{
		Desired: runtimehooksv1.UpdateMachineRequestObjects{Machine: desired, BootstrapConfig: bootstrap, InfrastructureMachine: infra},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("UpdateMachineRequest"))
	return req, nil
}

func marshalBody(req any) ([]byte, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode hook request: %w", err)
	}
	return raw, nil
}
