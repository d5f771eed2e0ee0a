package install

import (
	"os"
	"path/filepath"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/test/manifests"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// argValue returns the value of --name=value in args, or "".
func argValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// mountedSecret returns the Secret (and whether it is optional) whose volume the
// container mounts at the directory of file.
func mountedSecret(pod corev1.PodSpec, c corev1.Container, file string) (string, bool) {
	GinkgoHelper()
	for _, m := range c.VolumeMounts {
		if filepath.Dir(file) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, v.Secret.Optional != nil && *v.Secret.Optional
			}
		}
	}
	Fail("no Secret volume is mounted where " + file + " is read")
	return "", false
}

var _ = Describe("config/capi-client-auth: Cluster API's managers present client certificates to the hooks", Ordered, func() {
	var auth []*unstructured.Unstructured
	var manager *appsv1.Deployment

	BeforeAll(func() {
		auth = kustomizeBuild("config/capi-client-auth")
		manager = convert(findObject(kustomizeBuild("config/default"), "Deployment", "capi-inplace-controller-manager"), &appsv1.Deployment{})
	})

	certificate := func(namespace, name string) *unstructured.Unstructured {
		GinkgoHelper()
		for _, o := range auth {
			if o.GetKind() == "Certificate" && o.GetNamespace() == namespace && o.GetName() == name {
				return o
			}
		}
		Fail("no Certificate " + namespace + "/" + name)
		return nil
	}
	str := func(o *unstructured.Unstructured, fields ...string) string {
		v, _, _ := unstructured.NestedString(o.Object, fields...)
		return v
	}

	It("has the manager require a client certificate of the CA that signs Cluster API's, and a token on ExternalUpgradeRequest", func() {
		c := manager.Spec.Template.Spec.Containers[0]
		caFile := argValue(c.Args, "hook-client-ca")
		Expect(caFile).NotTo(BeEmpty(), "the manager must run with --hook-client-ca")
		secret, optional := mountedSecret(manager.Spec.Template.Spec, c, caFile)
		Expect(optional).To(BeFalse(), "without the CA the pod must wait, never serve the hooks unauthenticated")
		trust := certificate(manager.Namespace, secret)
		Expect(filepath.Base(caFile)).To(Equal("ca.crt"), "cert-manager writes the issuing CA as ca.crt")

		tokenFile := argValue(c.Args, "external-hook-token-file")
		Expect(tokenFile).NotTo(BeEmpty())
		tokenSecret, optional := mountedSecret(manager.Spec.Template.Spec, c, tokenFile)
		Expect(tokenSecret).To(Equal("capi-inplace-external-hook-token"))
		Expect(optional).To(BeTrue(), "the operator creates the token; until then ExternalUpgradeRequests are refused")
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--external-hook-insecure-allow-anonymous")))

		By("the trusted CA is the CA ClusterIssuer of Cluster API's client certificates")
		Expect(str(trust, "spec", "issuerRef", "kind")).To(Equal("ClusterIssuer"))
		issuer := findObject(auth, "ClusterIssuer", str(trust, "spec", "issuerRef", "name"))
		caSecret := str(issuer, "spec", "ca", "secretName")
		Expect(caSecret).NotTo(BeEmpty(), "a CA issuer")
		var ca *unstructured.Unstructured
		for _, o := range auth {
			if o.GetKind() == "Certificate" && str(o, "spec", "secretName") == caSecret {
				ca = o
			}
		}
		Expect(ca).NotTo(BeNil(), "the CA's key pair comes from a Certificate of the manifests")
		Expect(ca.GetNamespace()).To(Equal("cert-manager"), "a CA ClusterIssuer reads cert-manager's cluster resource namespace")
		isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA")
		Expect(isCA).To(BeTrue())

		for _, provider := range []string{"core", "controlplane/kubeadm"} {
			cert := certificate(providerNamespace(provider), "capi-inplace-hook-client")
			Expect(str(cert, "spec", "issuerRef", "name")).To(Equal(issuer.GetName()), provider)
			usages, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "usages")
			Expect(usages).To(ContainElement("client auth"), provider)
		}
	})

	It("patches Cluster API's own manager Deployments to present the certificate with their v1.14 flags", func() {
		dir := must(testenv.ModuleDir(env.RepoRoot, "sigs.k8s.io/cluster-api"))
		for provider, name := range map[string]string{"core": "capi-controller-manager", "controlplane/kubeadm": "capi-kubeadm-control-plane-controller-manager"} {
			objs, err := manifests.Build(dir, filepath.Join(provider, "config", "default"))
			Expect(err).NotTo(HaveOccurred())
			original := findObject(objs, "Deployment", name)
			patch := must(jsonpatch.DecodePatch(must(yaml.YAMLToJSON(must(os.ReadFile(filepath.Join(env.RepoRoot, "config", "capi-client-auth", name+"-patch.yaml")))))))
			patched := must(patch.Apply(must(original.MarshalJSON())))
			dep := &appsv1.Deployment{}
			Expect(yaml.Unmarshal(patched, dep)).To(Succeed())
			c := dep.Spec.Template.Spec.Containers[0]
			Expect(c.Name).To(Equal("manager"))
			certFile, keyFile := argValue(c.Args, "runtime-extension-client-cert-file"), argValue(c.Args, "runtime-extension-client-key-file")
			Expect(certFile).NotTo(BeEmpty(), name)
			Expect(keyFile).NotTo(BeEmpty(), name)
			secret, _ := mountedSecret(dep.Spec.Template.Spec, c, certFile)
			Expect(secret).To(Equal(str(certificate(dep.Namespace, "capi-inplace-hook-client"), "spec", "secretName")), name)
			Expect(filepath.Dir(keyFile)).To(Equal(filepath.Dir(certFile)))
			Expect([]string{filepath.Base(certFile), filepath.Base(keyFile)}).To(Equal([]string{"tls.crt", "tls.key"}))
			before := convert(original, &appsv1.Deployment{}).Spec.Template.Spec
			Expect(c.Args).To(ContainElements(before.Containers[0].Args), "the patch adds flags, it keeps Cluster API's")
			Expect(dep.Spec.Template.Spec.Volumes).To(HaveLen(len(before.Volumes)+1), "the patch adds a volume, it keeps Cluster API's")
		}
	})

	It("is accepted by a real API server (server-side dry run, strict field validation)", func() {
		for _, ns := range []string{"cert-manager", "capi-system", "capi-kubeadm-control-plane-system", "capi-inplace-system"} {
			err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		strict := client.WithFieldValidation(env.Client, metav1.FieldValidationStrict)
		for _, o := range auth {
			err := strict.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()),
				client.DryRunAll, client.FieldOwner("capi-inplace-install-test"), client.ForceOwnership)
			Expect(err).NotTo(HaveOccurred(), "%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	})
})
