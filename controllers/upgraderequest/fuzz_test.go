package upgraderequest

import (
	"encoding/hex"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// FuzzNames: for any target and machine (object names), any version that parses as
// semver, any request digest (hex) and attempt, the task name is a valid object name that
// fits a label value, the same inputs give the same name, and the NodeUpdate name is a
// valid object name.
func FuzzNames(f *testing.F) {
	f.Add("workers", "v1.33.3+rke2r1", "9f2c4be1a0", 1, "workers-1")
	f.Add(strings.Repeat("a", 250), "v1.33.3-rc.1+rke2r1.build.7", "00", 7, strings.Repeat("m", 253))
	f.Add("cp.example", "1.2.3", "ab", 2, "cp.example-1")
	f.Fuzz(func(t *testing.T, target, version, hash string, attempt int, machine string) {
		if errs := validation.IsDNS1123Subdomain(target); len(errs) > 0 {
			t.Skip("targets are object names")
		}
		if errs := validation.IsDNS1123Subdomain(machine); len(errs) > 0 {
			t.Skip("machines are object names")
		}
		if _, err := utilversion.ParseSemantic(version); err != nil {
			t.Skip("versions are checked before a task is named")
		}
		if _, err := hex.DecodeString(hash); err != nil || hash == "" || attempt < 1 {
			t.Skip("the digest is a hex digest and attempts count from 1")
		}
		name := TaskName(target, version, hash, attempt)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 || len(name) > 63 {
			t.Fatalf("TaskName(%q, %q, %q, %d) = %q: %v", target, version, hash, attempt, name, errs)
		}
		if again := TaskName(target, version, hash, attempt); again != name {
			t.Fatalf("TaskName is not deterministic: %q then %q", name, again)
		}
		nu := NodeUpdateName(name, machine)
		if errs := validation.IsDNS1123Subdomain(nu); len(errs) > 0 {
			t.Fatalf("NodeUpdateName(%q, %q) = %q: %v", name, machine, nu, errs)
		}
	})
}
