// Package testsuite routes the project's specs between the two test targets and sets what
// every suite shares: Gomega's default wait, sized for a loaded 2-core machine, and a JSON
// report of each spec's run time for the summary `make test` and `make test-e2e` print.
//
// The targets (docs/testing.md):
//   - make test (scope "unit"): unit specs and envtest specs of one component at a time;
//   - make test-e2e (scope "e2e"): whole runs: the demo, the end-to-end suites, each
//     Harvester formation upgraded whole, the bench's smoke run, the randomized safety seeds.
//
// The scope comes from CAPI_INPLACE_TEST_SCOPE; without it (a plain `go test ./...`) every
// spec runs. A Ginkgo spec is a whole run when it carries the label E2E; a plain test says
// so by calling WholeRun first; a suite whose specs are all whole runs is run with RunWhole.
package testsuite

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
)

const (
	// ScopeEnv names the environment variable that picks the target's specs.
	ScopeEnv = "CAPI_INPLACE_TEST_SCOPE"
	// ScopeUnit is make test's scope: everything but whole runs.
	ScopeUnit = "unit"
	// ScopeE2E is make test-e2e's scope: whole runs only.
	ScopeE2E = "e2e"

	// ReportDirEnv names a directory where each Ginkgo suite writes its JSON report
	// (<package path below the module, '/' as '_'>__<test function>.json), read by
	// hack/testsummary.
	ReportDirEnv = "CAPI_INPLACE_SPEC_REPORTS"

	// e2eLabel is the Ginkgo label of a whole-run spec.
	e2eLabel = "e2e"
)

// E2E is the decorator of a Ginkgo container or spec that is a whole run (make test-e2e).
var E2E = ginkgo.Label(e2eLabel)

// DefaultEventuallyTimeout is the timeout of an Eventually that names none. Gomega's own
// (1 s) failed specs on a 2-core machine running other work beside the suite (load 12 to
// 23); a wait that needs longer than this names its own. The polling interval stays
// Gomega's (10 ms): raising it changes what a spec can observe, not only its cost.
const DefaultEventuallyTimeout = 30 * time.Second

func init() {
	// Set before any spec or test builds its Gomega: NewWithT copies Default's durations.
	gomega.SetDefaultEventuallyTimeout(DefaultEventuallyTimeout)
}

// Scope returns the scope asked for: ScopeUnit, ScopeE2E or "" (everything).
func Scope() string { return os.Getenv(ScopeEnv) }

// WholeRun marks a plain test as a whole run: under make test (scope unit) it is skipped,
// with make test-e2e named as the target that runs it.
func WholeRun(t testing.TB) {
	t.Helper()
	if Scope() == ScopeUnit {
		t.Skip("a whole run: make test-e2e runs it")
	}
}

// Unit marks a plain test of a package that holds whole runs as a unit test: make test
// runs it and make test-e2e (scope e2e) skips it, so it runs once per CI.
func Unit(t testing.TB) {
	t.Helper()
	if Scope() == ScopeE2E {
		t.Skip("a unit test: make test runs it")
	}
}

// Run runs a package's Ginkgo specs in the scope asked for: under make test those not
// labelled E2E, under make test-e2e those labelled E2E. A label filter given on the
// command line (-ginkgo.label-filter) is kept and combined with the scope's.
func Run(t *testing.T, description string) bool {
	t.Helper()
	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	switch Scope() {
	case ScopeUnit:
		suiteConfig.LabelFilter = and(suiteConfig.LabelFilter, "!"+e2eLabel)
	case ScopeE2E:
		suiteConfig.LabelFilter = and(suiteConfig.LabelFilter, e2eLabel)
	}
	return run(t, description, suiteConfig, reporterConfig)
}

// RunWhole runs a suite whose specs are all whole runs: every spec under make test-e2e
// (or with no scope), none under make test.
func RunWhole(t *testing.T, description string) bool {
	t.Helper()
	if Scope() == ScopeUnit {
		t.Skip("whole runs: make test-e2e runs this suite")
	}
	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	return run(t, description, suiteConfig, reporterConfig)
}

func run(t *testing.T, description string, suiteConfig types.SuiteConfig, reporterConfig types.ReporterConfig) bool {
	t.Helper()
	if dir := os.Getenv(ReportDirEnv); dir != "" && reporterConfig.JSONReport == "" {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			// <package>__<test>.json: the summary leaves the test that ran the suite out
			// of its list of slowest tests, since its time is the whole suite's.
			reporterConfig.JSONReport = filepath.Join(dir, reportName(callerDir())+"__"+t.Name()+".json")
		}
	}
	return ginkgo.RunSpecs(t, description, suiteConfig, reporterConfig)
}

func and(a, b string) string {
	if strings.TrimSpace(a) == "" {
		return b
	}
	return "(" + a + ") && (" + b + ")"
}

// callerDir is the directory of the suite file that called Run or RunWhole.
func callerDir() string {
	for skip := 2; skip < 8; skip++ {
		_, file, _, ok := runtime.Caller(skip)
		if !ok {
			break
		}
		if !strings.HasSuffix(filepath.Dir(file), filepath.Join("test", "testsuite")) {
			return filepath.Dir(file)
		}
	}
	wd, _ := os.Getwd()
	return wd
}

// reportName turns a suite's directory into a report file name: its path below the
// module's root (the directory holding go.mod), '/' as '_'; "root" for the root.
func reportName(dir string) string {
	root := dir
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			root = ""
			break
		}
		root = parent
	}
	rel := dir
	if root != "" {
		if r, err := filepath.Rel(root, dir); err == nil {
			rel = r
		}
	}
	if rel == "." || rel == "" {
		return "root"
	}
	return strings.ReplaceAll(filepath.ToSlash(rel), "/", "_")
}
