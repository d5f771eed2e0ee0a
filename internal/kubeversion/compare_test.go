package kubeversion

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b      string
		want      int
		ambiguous bool
	}{
		{a: "v1.33.3", b: "v1.34.1", want: -1},
		{a: "v1.10.0", b: "v1.9.0", want: 1},
		{a: "v1.33.3", b: "1.33.3", want: 0},
		{a: "v1.33.3-rc.1", b: "v1.33.3", want: -1},
		{a: "v1.33.3+rke2r1", b: "v1.33.3+rke2r1", want: 0},
		{a: "v1.33.3+rke2r1", b: "v1.33.3+rke2r2", want: -1},
		{a: "v1.33.3+rke2r2", b: "v1.33.3+rke2r1", want: 1},
		{a: "v1.33.3+rke2r9", b: "v1.33.3+rke2r10", want: -1},
		{a: "v1.33.3+rke2r100000000000000000000000", b: "v1.33.3+rke2r99999999999999999999999", want: 1},
		{a: "v1.33.3+k3s1", b: "v1.33.3+k3s2", want: -1},
		{a: "v1.33.3-rc.1+rke2r2", b: "v1.33.3-rc.1+rke2r1", want: 1},
		// The semantic version decides before the build metadata.
		{a: "v1.33.3+rke2r9", b: "v1.34.0+rke2r1", want: -1},
		{a: "v1.34.0+foo", b: "v1.33.3+rke2r1", want: 1},
		{a: "v1.33.3", b: "v1.34.0+rke2r1", want: -1},
		// Differences only in build metadata that has no order.
		{a: "v1.33.3+foo", b: "v1.33.3+bar", ambiguous: true},
		{a: "v1.33.3", b: "v1.33.3+rke2r1", ambiguous: true},
		{a: "v1.33.3+rke2r1", b: "v1.33.3", ambiguous: true},
		{a: "v1.33.3+rke2r1", b: "v1.33.3+k3s1", ambiguous: true},
		{a: "v1.33.3+rke2r01", b: "v1.33.3+rke2r1", ambiguous: true},
		{a: "v1.33.3+rke2r1.build.2", b: "v1.33.3+rke2r1", ambiguous: true},
		{a: "v1.33.3+RKE2R2", b: "v1.33.3+rke2r1", ambiguous: true},
	} {
		t.Run(tc.a+"_"+tc.b, func(t *testing.T) {
			got, err := Compare(version.MustParseSemantic(tc.a), version.MustParseSemantic(tc.b))
			var amb *AmbiguousError
			if tc.ambiguous {
				if !errors.As(err, &amb) {
					t.Fatalf("Compare(%s, %s) = %d, %v; want an AmbiguousError", tc.a, tc.b, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Compare(%s, %s) = %d, %v; want %d", tc.a, tc.b, got, err, tc.want)
			}
			// The order is antisymmetric.
			back, err := Compare(version.MustParseSemantic(tc.b), version.MustParseSemantic(tc.a))
			if err != nil || back != -tc.want {
				t.Fatalf("Compare(%s, %s) = %d, %v; want %d", tc.b, tc.a, back, err, -tc.want)
			}
		})
	}
}

func TestAmbiguousErrorSaysWhatHasNoOrder(t *testing.T) {
	_, err := Compare(version.MustParseSemantic("v1.33.3"), version.MustParseSemantic("v1.33.3+foo"))
	want := "they differ only in build metadata (none and +foo), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v; want %q", err, want)
	}
}

func TestCompareStringsRefusesWhatIsNotSemver(t *testing.T) {
	if _, err := CompareStrings("1.34", "v1.34.0"); err == nil {
		t.Fatal("1.34 is not a semantic version")
	}
	if c, err := CompareStrings("v1.33.3+rke2r2", "v1.33.3+rke2r1"); err != nil || c != 1 {
		t.Fatalf("got %d, %v", c, err)
	}
}

// FuzzCompare: for any two strings that parse as semantic versions, Compare never panics,
// is antisymmetric, and says 0 only for the same release.
func FuzzCompare(f *testing.F) {
	for _, s := range [][2]string{
		{"v1.33.3+rke2r1", "v1.33.3+rke2r2"}, {"v1.33.3+k3s10", "v1.33.3+k3s9"}, {"v1.33.3", "v1.33.3+foo"},
		{"v1.33.3+rke2r0", "v1.33.3+rke2r00"}, {"1.2.3-rc.1+b", "1.2.3-rc.1+a"}, {"v1.9.0", "v1.10.0"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		va, err1 := version.ParseSemantic(a)
		vb, err2 := version.ParseSemantic(b)
		if err1 != nil || err2 != nil {
			t.Skip("Compare takes parsed versions")
		}
		ab, errAB := Compare(va, vb)
		ba, errBA := Compare(vb, va)
		if (errAB == nil) != (errBA == nil) || ab != -ba {
			t.Fatalf("Compare(%q, %q) = %d, %v but Compare(%q, %q) = %d, %v", a, b, ab, errAB, b, a, ba, errBA)
		}
		if errAB == nil && ab == 0 && (!va.EqualTo(vb) || (va.BuildMetadata() != vb.BuildMetadata())) {
			t.Fatalf("Compare(%q, %q) says the same release", a, b)
		}
		if errAB != nil && !va.EqualTo(vb) {
			t.Fatalf("Compare(%q, %q) is ambiguous for different semantic versions", a, b)
		}
	})
}

func TestNextBuild(t *testing.T) {
	for in, want := range map[string]string{
		"v1.33.3+rke2r1": "v1.33.3+rke2r2", "1.33.3+k3s9": "1.33.3+k3s10", "v1.33.3-rc.1+rke2r0": "v1.33.3-rc.1+rke2r1",
		"v1.33.3": "", "v1.33.3+foo": "", "v1.33.3+rke2r01": "",
	} {
		got, ok := NextBuild(in)
		if got != want || ok != (want != "") {
			t.Errorf("NextBuild(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
