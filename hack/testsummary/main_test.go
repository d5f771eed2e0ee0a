package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/capi-inplace/capi-inplace"

// events is a go test -json stream of two packages: one with a plain test that passed,
// one routed away and one that failed; one that ran a Ginkgo suite.
const events = `{"Action":"run","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast"}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast","Output":"quiet words\n"}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestFast","Elapsed":0.5}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestWhole","Output":"    a whole run: make test-e2e runs it\n"}
{"Action":"skip","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestWhole","Elapsed":0}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestBroken","Output":"the reason it broke\n"}
{"Action":"fail","Package":"github.com/capi-inplace/capi-inplace/a","Test":"TestBroken","Elapsed":3}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/a","Output":"FAIL\tgithub.com/capi-inplace/capi-inplace/a\t4s\n"}
{"Action":"fail","Package":"github.com/capi-inplace/capi-inplace/a","Elapsed":4}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/b/c","Test":"TestSuite","Elapsed":90}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/b/c","Output":"a passing package's log line\n"}
{"Action":"output","Package":"github.com/capi-inplace/capi-inplace/b/c","Output":"ok  \tgithub.com/capi-inplace/capi-inplace/b/c\t90s\n"}
{"Action":"pass","Package":"github.com/capi-inplace/capi-inplace/b/c","Elapsed":90}
`

// report is the Ginkgo JSON report of b/c's suite: a slow spec, a fast one, one the
// label filter left out and one that failed with a long message.
const report = `[{"SuitePath":"/x/b/c","SpecReports":[
{"ContainerHierarchyTexts":["Slow"],"LeafNodeType":"It","LeafNodeText":"takes long","LeafNodeLocation":{"FileName":"/x/b/c/slow_test.go","LineNumber":7},"State":"passed","RunTime":60000000000,"NumAttempts":1},
{"ContainerHierarchyTexts":["Fast"],"LeafNodeType":"It","LeafNodeText":"is quick","LeafNodeLocation":{"FileName":"/x/b/c/fast_test.go","LineNumber":9},"State":"passed","RunTime":1000000000,"NumAttempts":1},
{"ContainerHierarchyTexts":["Whole"],"LeafNodeType":"It","LeafNodeText":"runs elsewhere","LeafNodeLocation":{"FileName":"/x/b/c/whole_test.go","LineNumber":3},"State":"skipped","RunTime":0,"NumAttempts":0},
{"ContainerHierarchyTexts":["Broken"],"LeafNodeType":"It","LeafNodeText":"breaks","LeafNodeLocation":{"FileName":"/x/b/c/broken_test.go","LineNumber":5},"State":"failed","RunTime":500000000,"NumAttempts":1,
 "Failure":{"Message":"node n-2 cordoned\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\nline 9\nline 10\nline 11\nline 12\nline 13 cut\nline 14 cut","Location":{"FileName":"/x/b/c/broken_test.go","LineNumber":12}}}]}]`

func TestSummary(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "b_c__TestSuite.json"), []byte(report), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	reqDir := t.TempDir()
	for name, counts := range map[string]string{
		"b_c__100-1.json": `{"LIST nodes": 300, "GET settings": 50}`,
		"b_c__100-2.json": `{"LIST nodes": 100, "PATCH nodes/status": 20}`,
		"a__200-1.json":   `{"GET pods": 10}`,
	} {
		if err := os.WriteFile(filepath.Join(reqDir, name), []byte(counts), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code := run(strings.NewReader(events), &out, dir, reqDir, module, 2)
	text := out.String()
	if code == 0 {
		t.Errorf("a failed test must fail the run; exit code 0:\n%s", text)
	}
	for _, want := range []string{
		"the reason it broke", // a failed test's output is shown
		"== The 2 slowest",    // the top asked for
		"60.0s  b/c  Slow takes long (slow_test.go:7)",
		"3.0s  a  TestBroken",
		"90.0s  pass  b/c", // every package's time
		"4.0s  fail  a",
		"2 specs and tests belong to the other target",
		"tests: 3 passed, 2 failed, 0 skipped",
		"  b/c  Broken breaks (broken_test.go:5)\n    failed at broken_test.go:12: node n-2 cordoned\n    line 2\n", // a failed spec's reason, at the end
		"    line 12\n    (2 more lines in the spec's output above)\n",
		"per package (480 in all)",
		"      470  b/c  (LIST nodes 400, GET settings 50, PATCH nodes/status 20)", // both of its API servers
		"       10  a  (GET pods 10)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary lacks %q:\n%s", want, text)
		}
	}
	for _, unwanted := range []string{"quiet words", "a passing package's log line", "TestSuite", "is quick", "line 13 cut"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("the summary shows %q (a passing test's output, the suite's own test, or a spec past the top 2):\n%s", unwanted, text)
		}
	}
	if strings.Index(text, "Slow takes long") > strings.Index(text, "TestBroken") {
		t.Errorf("the slowest come first:\n%s", text)
	}
	if strings.Index(text, "failed at broken_test.go") < strings.Index(text, "== Failed") {
		t.Errorf("a failed spec's reason comes under == Failed:\n%s", text)
	}
	if lines := strings.Split(strings.TrimSpace(text), "\n"); lines[len(lines)-1] != "tests: 3 passed, 2 failed, 0 skipped" {
		t.Errorf("the closing line is the counts, last: %q", lines[len(lines)-1])
	}
}

func TestSummaryNeedsInput(t *testing.T) {
	var out bytes.Buffer
	if code := run(strings.NewReader(""), &out, "", "", module, 15); code == 0 {
		t.Errorf("no go test result must fail the run:\n%s", out.String())
	}
}
