// Command testsummary reads `go test -json` on its standard input, prints what plain go test
// prints (a test's output when it failed, each package's result line), and ends with what the run cost: the slowest specs (Ginkgo specs from
// the suites' JSON reports, and plain tests) and every package's time, so that whoever adds
// a spec sees what it costs. make test and make test-e2e pipe into it (docs/testing.md).
//
//	go test ./... -json | go run ./hack/testsummary -reports bin/test-reports/unit
//
// It exits non-zero when a package or a test failed, or when the input holds no result.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// ginkgoReport is the part of a Ginkgo JSON report (types.Report) the summary reads.
type ginkgoReport struct {
	SuitePath   string
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeType            string
		LeafNodeText            string
		LeafNodeLocation        struct {
			FileName   string
			LineNumber int
		}
		State       string
		RunTime     time.Duration
		NumAttempts int
		Failure     struct {
			Message  string
			Location struct {
				FileName   string
				LineNumber int
			}
		}
	}
}

// timed is a spec or a test and what it cost.
type timed struct {
	pkg, name, where string
	seconds          float64
	// why is a failed spec's failure: where it failed and the first lines of its message.
	why string
}

type pkgResult struct {
	name    string
	action  string
	seconds float64
}

func main() {
	reports := flag.String("reports", "", "directory of the Ginkgo suites' JSON reports (test/testsuite's CAPI_INPLACE_SPEC_REPORTS)")
	requests := flag.String("requests", "", "directory of the test API servers' request counts (test/testenv's CAPI_INPLACE_REQUEST_COUNTS)")
	module := flag.String("module", "github.com/capi-inplace/capi-inplace", "the module whose package paths the report names are relative to")
	top := flag.Int("top", 15, "how many of the slowest specs to list")
	flag.Parse()
	os.Exit(run(os.Stdin, os.Stdout, *reports, *requests, *module, *top))
}

func run(in io.Reader, out io.Writer, reportDir, requestDir, module string, top int) int {
	start := time.Now()
	var (
		pkgs     = map[string]*pkgResult{}
		tests    []timed
		failed   []string
		sawInput bool
		// held is each running test's output, printed if it fails.
		held = map[string][]byte{}
	)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event (go vet's or the build's own words): passed on as it is.
			say(out, string(line)+"\n")
			continue
		}
		sawInput = true
		// As plain go test prints: a test's output only when it failed, the package's
		// own lines (ok, FAIL, a panic outside a test) as they come.
		key := e.Package + "\x00" + e.Test
		if e.Action == "build-output" {
			say(out, e.Output) // the compiler's words: a package that does not build
			continue
		}
		if e.Output != "" {
			held[key] = append(held[key], e.Output...)
		}
		switch e.Action {
		case "pass", "fail", "skip":
		default:
			continue
		}
		if e.Test == "" {
			pkgs[e.Package] = &pkgResult{name: e.Package, action: e.Action, seconds: e.Elapsed}
			own := string(held[key])
			delete(held, key)
			switch e.Action {
			case "fail":
				failed = append(failed, e.Package)
				// A test cut short (a timeout's panic) may have no result of its own.
				for k, text := range held {
					if strings.HasPrefix(k, e.Package+"\x00") {
						say(out, string(text))
						delete(held, k)
					}
				}
				say(out, own)
			case "pass":
				// Plain go test shows a package that passed by its result line alone.
				for _, line := range strings.SplitAfter(own, "\n") {
					if strings.HasPrefix(line, "ok ") {
						say(out, line)
					}
				}
			}
			continue
		}
		if e.Action == "fail" {
			say(out, string(held[key]))
			if !strings.Contains(e.Test, "/") {
				failed = append(failed, e.Package+"."+e.Test)
			}
		}
		action := e.Action
		if action == "skip" && routedAway(string(held[key])) {
			action = "routed"
		}
		delete(held, key)
		if strings.Contains(e.Test, "/") {
			continue // a subtest: its parent's time holds it
		}
		tests = append(tests, timed{pkg: e.Package, name: e.Test, where: action, seconds: e.Elapsed})
	}
	if err := sc.Err(); err != nil {
		sayf(out, "testsummary: reading go test's output: %v\n", err)
		return 1
	}

	specs, suites, err := readReports(reportDir, module)
	if err != nil {
		sayf(out, "testsummary: %v\n", err)
	}
	passed, failedN, skipped, routed := 0, 0, 0, 0
	var all []timed
	for _, t := range tests {
		if suites[t.pkg+"\x00"+t.name] {
			continue // the test that ran a Ginkgo suite: its specs are counted instead
		}
		switch t.where {
		case "pass":
			passed++
		case "fail":
			failedN++
		case "skip":
			skipped++
			continue
		case "routed":
			routed++
			continue
		}
		all = append(all, timed{pkg: t.pkg, name: t.name, seconds: t.seconds})
	}
	var why []timed
	for _, s := range specs {
		if s.why != "" && s.where != "passed" {
			why = append(why, s)
		}
		switch s.where {
		case "passed":
			passed++
		case "routed":
			routed++
			continue
		case "skipped", "pending":
			skipped++
			continue
		default:
			failedN++
		}
		all = append(all, s)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].seconds > all[j].seconds })

	sayf(out, "\n== The %d slowest specs and tests\n", min(top, len(all)))
	for _, t := range all[:min(top, len(all))] {
		sayf(out, "%8.1fs  %s  %s\n", t.seconds, short(t.pkg, module), t.name)
	}
	list := make([]*pkgResult, 0, len(pkgs))
	var sum float64
	for _, p := range pkgs {
		list = append(list, p)
		sum += p.seconds
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].seconds != list[j].seconds {
			return list[i].seconds > list[j].seconds
		}
		return list[i].name < list[j].name
	})
	sayf(out, "\n== Packages, slowest first (each test binary's own run; they run side by side)\n")
	for _, p := range list {
		if p.action == "skip" {
			continue // no test files
		}
		sayf(out, "%8.1fs  %-4s  %s\n", p.seconds, p.action, short(p.name, module))
	}
	sayf(out, "%8.1fs  in all, over %s of wall time since the first output\n", sum, time.Since(start).Round(time.Second))
	if len(failed) > 0 || len(why) > 0 {
		sayf(out, "\n== Failed\n")
		for _, f := range failed {
			sayf(out, "  %s\n", short(f, module))
		}
		// A failed spec's reason here too: a long run's log is often seen by its end only.
		for _, s := range why {
			sayf(out, "  %s  %s\n    %s\n", short(s.pkg, module), s.name, strings.ReplaceAll(s.why, "\n", "\n    "))
		}
	}
	if requestDir != "" {
		if err := printRequests(out, requestDir); err != nil {
			sayf(out, "testsummary: %v\n", err)
		}
	}
	if routed > 0 {
		sayf(out, "\n%d specs and tests belong to the other target (make test or make test-e2e) and were left out\n", routed)
	}
	sayf(out, "\ntests: %d passed, %d failed, %d skipped\n", passed, failedN, skipped)
	switch {
	case !sawInput:
		say(out, "testsummary: no go test result on the input\n")
		return 1
	case len(failed) > 0 || failedN > 0:
		return 1
	}
	return 0
}

// readReports reads every Ginkgo JSON report of dir: the specs that ran, and the set of
// "<package>\x00<test>" that ran a suite (from the file names test/testsuite gives them).
func readReports(dir, module string) ([]timed, map[string]bool, error) {
	suites := map[string]bool{}
	if dir == "" {
		return nil, suites, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, suites, err
	}
	var specs []timed
	for _, f := range files {
		base := strings.TrimSuffix(filepath.Base(f), ".json")
		rel, test, ok := strings.Cut(base, "__")
		if !ok {
			continue
		}
		pkg := module
		if rel != "root" {
			pkg = module + "/" + strings.ReplaceAll(rel, "_", "/")
		}
		suites[pkg+"\x00"+test] = true
		data, err := os.ReadFile(f)
		if err != nil {
			return specs, suites, err
		}
		var reports []ginkgoReport
		if err := json.Unmarshal(data, &reports); err != nil {
			return specs, suites, fmt.Errorf("read the Ginkgo report %s: %w", f, err)
		}
		for _, r := range reports {
			for _, s := range r.SpecReports {
				name := strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
				if s.LeafNodeType != "It" {
					name = strings.TrimSpace("[" + s.LeafNodeType + "] " + name)
				}
				loc := fmt.Sprintf(" (%s:%d)", filepath.Base(s.LeafNodeLocation.FileName), s.LeafNodeLocation.LineNumber)
				state := s.State
				if state == "skipped" && s.NumAttempts == 0 {
					state = "routed" // filtered out by the target's label filter, never run
				}
				t := timed{pkg: pkg, name: clip(name, 110) + loc, where: state, seconds: s.RunTime.Seconds()}
				if f := s.Failure; f.Message != "" {
					t.why = fmt.Sprintf("failed at %s:%d: %s", filepath.Base(f.Location.FileName), f.Location.LineNumber, firstLines(f.Message, failureLines))
				}
				specs = append(specs, t)
			}
		}
	}
	return specs, suites, nil
}

// printRequests prints, per package, how many requests its test API servers served (the
// files test/testenv writes when each stops), most first, with the three kinds it sent
// most of.
func printRequests(out io.Writer, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		return err
	}
	type pkgCounts struct {
		name   string
		total  float64
		byKind map[string]float64
	}
	byPkg := map[string]*pkgCounts{}
	var all float64
	for _, f := range files {
		name, _, _ := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".json"), "__")
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var counts map[string]float64
		if err := json.Unmarshal(data, &counts); err != nil {
			return fmt.Errorf("read the request counts %s: %w", f, err)
		}
		p := byPkg[name]
		if p == nil {
			p = &pkgCounts{name: strings.ReplaceAll(name, "_", "/"), byKind: map[string]float64{}}
			byPkg[name] = p
		}
		for k, n := range counts {
			p.byKind[k] += n
			p.total += n
			all += n
		}
	}
	list := make([]*pkgCounts, 0, len(byPkg))
	for _, p := range byPkg {
		list = append(list, p)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].total > list[j].total })
	sayf(out, "\n== Requests the test API servers served, per package (%.0f in all)\n", all)
	for _, p := range list {
		kinds := make([]string, 0, len(p.byKind))
		for k := range p.byKind {
			kinds = append(kinds, k)
		}
		sort.Slice(kinds, func(i, j int) bool { return p.byKind[kinds[i]] > p.byKind[kinds[j]] })
		var top []string
		for _, k := range kinds[:min(3, len(kinds))] {
			top = append(top, fmt.Sprintf("%s %.0f", k, p.byKind[k]))
		}
		sayf(out, "%9.0f  %s  (%s)\n", p.total, p.name, strings.Join(top, ", "))
	}
	return nil
}

// say and sayf write to the terminal; what cannot be written there cannot be told anywhere.
func say(out io.Writer, text string) { _, _ = io.WriteString(out, text) }

func sayf(out io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(out, format, args...) }

// routedAway tells a plain test that test/testsuite skipped because the other target runs
// it (WholeRun, Unit, RunWhole) from one skipped for a reason of its own.
func routedAway(output string) bool {
	return strings.Contains(output, "make test-e2e runs") || strings.Contains(output, "make test runs it")
}

func short(pkg, module string) string {
	if pkg == module {
		return "."
	}
	return strings.TrimPrefix(pkg, module+"/")
}

// failureLines is how many lines of a failed spec's message the summary prints.
const failureLines = 12

// firstLines is s cut to its first n lines, saying how many more there were.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	return strings.Join(lines[:n], "\n") + fmt.Sprintf("\n(%d more lines in the spec's output above)", len(lines)-n)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
