package kubeversion

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

func TestParseSemanticIsVersionParseSemanticMemoized(t *testing.T) {
	for _, s := range []string{"v1.34.3+rke2r3", "1.35.0", "v1.36.0-rc.1", "v1.36", "not a version", ""} {
		want, wantErr := version.ParseSemantic(s)
		for range 2 {
			got, err := ParseSemantic(s)
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("ParseSemantic(%q) error %v, want %v", s, err, wantErr)
			}
			if err == nil && got.String() != want.String() {
				t.Fatalf("ParseSemantic(%q) = %s, want %s", s, got, want)
			}
		}
	}
	a, _ := ParseSemantic("v1.34.3+rke2r3")
	b, _ := ParseSemantic("v1.34.3+rke2r3")
	if a != b {
		t.Errorf("the second parse of a string parsed again instead of reusing the first")
	}
	// Past maxParsed distinct strings the memo starts again, and still answers right.
	for i := range maxParsed + 10 {
		if _, err := ParseSemantic(fmt.Sprintf("v1.%d.0", i)); err != nil {
			t.Fatal(err)
		}
	}
	parsed.mu.RLock()
	n := len(parsed.m)
	parsed.mu.RUnlock()
	if n > maxParsed {
		t.Errorf("the memo holds %d strings, more than maxParsed (%d)", n, maxParsed)
	}
	if v, err := ParseSemantic("v1.34.3+rke2r3"); err != nil || v.String() != "1.34.3+rke2r3" {
		t.Errorf("after the memo started again: %v, %v", v, err)
	}
}
