package harvesteradapter_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

var validationSeq int

var _ = Describe("HarvesterUpgrader validation", func() {
	checksum := strings.Repeat("ab", 64)
	newUpgrader := func(release harvesterv1.Release) *harvesterv1.HarvesterUpgrader {
		validationSeq++
		return &harvesterv1.HarvesterUpgrader{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("u-%d", validationSeq), Namespace: "default"},
			Spec:       harvesterv1.HarvesterUpgraderSpec{Release: release},
		}
	}

	DescribeTable("refuses a configuration it could not carry out, saying what to fix",
		func(release harvesterv1.Release, want string) {
			err := env.Client.Create(ctx, newUpgrader(release))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("no source", harvesterv1.Release{Version: "v1.8.1"},
			"set exactly one of release.isoURL (with release.isoChecksum), release.repositoryURL or release.image"),
		Entry("two sources", harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://r.example/h.iso", ISOChecksum: checksum, RepositoryURL: "http://repo.example"},
			"set exactly one of release.isoURL"),
		Entry("an image and a repository", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/h", RepositoryURL: "http://repo.example"},
			"set exactly one of release.isoURL (with release.isoChecksum), release.repositoryURL or release.image"),
		Entry("an image and an ISO", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/h", ISOURL: "https://r.example/h.iso", ISOChecksum: checksum},
			"set exactly one of release.isoURL"),
		Entry("all three sources", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/h", ISOURL: "https://r.example/h.iso", ISOChecksum: checksum, RepositoryURL: "http://repo.example"},
			"set exactly one of release.isoURL"),
		Entry("an image without its namespace", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-v1.8.1"},
			"release.image must be <namespace>/<name> of a VirtualMachineImage"),
		Entry("an image with two slashes", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/images/h"},
			"release.image must be <namespace>/<name> of a VirtualMachineImage"),
		Entry("an image with an upper-case name", harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/Harvester"},
			"release.image must be <namespace>/<name> of a VirtualMachineImage"),
		Entry("an image in another namespace than the repository's", harvesterv1.Release{Version: "v1.8.1", Image: "default/harvester-v1.8.1"},
			"release.image must be in the namespace harvester-system, where the upgrade repository runs"),
		Entry("ISO without checksum", harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://r.example/h.iso"},
			"release.isoChecksum is required with release.isoURL"),
		Entry("a checksum that is not SHA-512", harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://r.example/h.iso", ISOChecksum: "abc123"},
			"release.isoChecksum must be a SHA-512 checksum: 128 hexadecimal digits"),
		Entry("an ISO URL that is not http(s)", harvesterv1.Release{Version: "v1.8.1", ISOURL: "ftp://r.example/h.iso", ISOChecksum: checksum},
			"release.isoURL must be an http:// or https:// URL"),
		Entry("a version that is no Harvester version", harvesterv1.Release{Version: "1.6", RepositoryURL: "http://repo.example"},
			"release.version must be a Harvester version such as v1.8.1"),
		Entry("a release no supported hop leads to", harvesterv1.Release{Version: "v1.6.1", RepositoryURL: "http://repo.example"},
			"release.version must be a formal Harvester release capi-inplace upgrades to, v1.7.x or v1.8.x"),
		Entry("a release candidate (fact 5: v1.9.0 is only one)", harvesterv1.Release{Version: "v1.9.0-rc6", RepositoryURL: "http://repo.example"},
			"release.version must be a formal Harvester release capi-inplace upgrades to, v1.7.x or v1.8.x (no pre-release)"),
		Entry("a release candidate of a supported minor", harvesterv1.Release{Version: "v1.8.1-rc1", RepositoryURL: "http://repo.example"},
			"the supported hops are v1.7.x -> v1.8.x and patch upgrades inside v1.7 and v1.8"),
	)

	// Admission and releases.CheckTarget refuse and accept the same release versions: the
	// CEL rule is the hop table's targets, written out.
	It("accepts exactly the releases a supported hop leads to", func() {
		for _, v := range []string{"v1.5.2", "v1.6.0", "v1.6.1", "v1.7.0", "v1.7.1", "v1.7.10", "v1.8.0", "v1.8.1", "v1.8.2", "v1.9.0", "v1.9.0-rc6", "v1.8.1-rc1", "v2.7.1", "v11.8.1", "v1.18.1"} {
			err := env.Client.Create(ctx, newUpgrader(harvesterv1.Release{Version: v, RepositoryURL: "http://repo.example"}))
			if releases.CheckTarget(v) == nil {
				Expect(err).NotTo(HaveOccurred(), "release %s", v)
			} else {
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "release %s: got %v", v, err)
			}
		}
	})

	It("accepts the ISO as a VirtualMachineImage in harvester-system", func() {
		u := newUpgrader(harvesterv1.Release{Version: "v1.8.1", Image: "harvester-system/harvester-v1.8.1"})
		Expect(env.Client.Create(ctx, u)).To(Succeed())
	})

	DescribeTable("refuses what SUC would misread, saying what to fix",
		func(mutate func(*harvesterv1.HarvesterUpgraderSpec), want string) {
			u := newUpgrader(harvesterv1.Release{Version: "v1.8.1", RepositoryURL: "http://repo.example"})
			mutate(&u.Spec)
			err := env.Client.Create(ctx, u)
			if want == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("a kubectl image without a tag: SUC would tag it with the release version",
			func(s *harvesterv1.HarvesterUpgraderSpec) { s.Images.Kubectl = "rancher/kubectl" },
			"images.kubectl needs a tag or digest"),
		Entry("a kubectl image with a digest", func(s *harvesterv1.HarvesterUpgraderSpec) {
			s.Images.Kubectl = "registry.example:5000/rancher/kubectl@sha256:" + strings.Repeat("0", 64)
		}, ""),
		Entry("a drain timeout of 0 seconds", func(s *harvesterv1.HarvesterUpgraderSpec) { s.Drain.Timeout = ptr.To(intstr.FromInt32(0)) },
			"drain.timeout must be a number of seconds of at least 1, or a duration such as 15m"),
		Entry("a drain timeout string without a unit: SUC would pass it to kubectl as is",
			func(s *harvesterv1.HarvesterUpgraderSpec) { s.Drain.Timeout = ptr.To(intstr.FromString("900")) },
			"drain.timeout must be a number of seconds of at least 1, or a duration such as 15m"),
		Entry("a drain timeout of 900 seconds", func(s *harvesterv1.HarvesterUpgraderSpec) { s.Drain.Timeout = ptr.To(intstr.FromInt32(900)) }, ""),
		Entry("a drain timeout of 1h30m", func(s *harvesterv1.HarvesterUpgraderSpec) { s.Drain.Timeout = ptr.To(intstr.FromString("1h30m")) }, ""),
		Entry("a release version too long for SUC's version label",
			func(s *harvesterv1.HarvesterUpgraderSpec) { s.Release.Version = "v1.8.1-" + strings.Repeat("a", 57) },
			"spec.release.version: Too long"),
		Entry("an image with a space", func(s *harvesterv1.HarvesterUpgraderSpec) { s.Images.Node = "ghcr.io/capi-inplace/capi-inplace v0.4.0" },
			"images.node must be an image reference without spaces"),
		Entry("an untagged node image: the updater tags it with the manager's version",
			func(s *harvesterv1.HarvesterUpgraderSpec) { s.Images.Node = "registry.local:5000/capi-inplace" }, ""),
	)

	It("fills in the defaults an operator expects", func() {
		u := newUpgrader(harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://r.example/h.iso", ISOChecksum: checksum})
		Expect(env.Client.Create(ctx, u)).To(Succeed())
		Expect(u.Spec.Images.RKE2Upgrade).To(Equal("rancher/rke2-upgrade"))
		Expect(u.Spec.SystemUpgradeController.Namespace).To(Equal("cattle-system"))
		Expect(u.Spec.PreloadImages).To(HaveValue(BeTrue()))
		Expect(u.Spec.UpgradeOS).To(HaveValue(BeTrue()))
		Expect(u.Spec.LonghornV2Swap).To(Equal(harvesterv1.LonghornV2SwapAuto))
		Expect(u.Spec.Drain.IgnoreDaemonSets).To(HaveValue(BeTrue()))
		Expect(u.Spec.RepositoryStorage.Size).To(Equal("30Gi"))
		Expect(u.Spec.Images.Kubectl).To(Equal("rancher/kubectl:v1.30.3"))
		Expect(u.Spec.Images.Node).To(BeEmpty(), "no default: the updater resolves an empty images.node to the manager's own node image at its version")
		Expect(u.Spec.Timeouts.Drain).To(HaveValue(Equal(metav1.Duration{Duration: time.Hour})))
	})
})

var _ = Describe("The Harvester updater's preflight", func() {
	It("holds every node while System Upgrade Controller's service account is missing, and names it", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.SystemUpgradeController.ServiceAccountName = "suc-typo"
			h.Spec.UpgradeOS = ptr.To(false)
		})
		var failed []nodeupdater.CheckResult
		for _, r := range c.updater.Preflight(ctx, nodeupdater.PreflightTarget{
			Namespace: c.ns, ClusterName: c.name, NodeName: c.nodes[0], Version: "v1.35.6+rke2r1",
			UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
		}) {
			if !r.Passed {
				failed = append(failed, r)
			}
		}
		Expect(failed).To(HaveLen(1))
		Expect(failed[0].Name).To(Equal(harvesteradapter.CheckSUCInstalled))
		Expect(failed[0].Message).To(Equal("System Upgrade Controller's service account cattle-system/suc-typo does not exist; check systemUpgradeController in the HarvesterUpgrader"))
	})
})
