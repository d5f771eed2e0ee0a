package inplacectl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// hostile holds what a terminal would act on: a CSI sequence that clears the screen and
// paints red, an OSC 52 that writes the clipboard, an OSC title, a bare C1 CSI, a
// carriage return that would overwrite the line, a backspace, BEL and DEL.
const hostile = "ok\x1b[2J\x1b[31mred\x1b[0m\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;title\x1b\\" +
	"\u009b1;1Hc1\rline\bb\x07e\x7f\u0085end\tcol"

func TestClean(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text, ünïcode and 日本", "plain text, ünïcode and 日本"},
		{"keeps\ttabs\nand newlines", "keeps\ttabs\nand newlines"},
		{hostile, "okredc1linebeend\tcol"},
		{"cut off \x1b[", "cut off "},
		{"cut off \x1b]0;never ends", "cut off "},
		{"\x1bc reset", " reset"},
		{"C1 CSI in UTF-8 \xc2\x9b2J, bad UTF-8 \xff", "C1 CSI in UTF-8 , bad UTF-8 "},
	} {
		if got := Clean(tc.in); got != tc.want {
			t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// noControls fails when out holds a byte a terminal acts on (other than tab and newline).
func noControls(t *testing.T, out string) {
	t.Helper()
	for i, r := range out {
		if isControl(r) {
			t.Fatalf("the output holds control %U at byte %d:\n%q", r, i, out)
		}
	}
}

func TestPrintPreviewStripsControls(t *testing.T) {
	p := samplePreview()
	p.Status.Message = hostile
	p.Status.Summary = hostile
	p.Status.Machines[0].Reason = hostile
	p.Status.Machines[0].Name = "cp-1" + hostile
	p.Status.Machines[0].Disruption.MigratingVMs[0].Reason = hostile
	p.Status.Machines[1].Preflight[1].Message = hostile
	orig := p.DeepCopy()
	var buf bytes.Buffer
	if err := PrintPreview(&buf, p); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	noControls(t, out)
	for _, words := range [][]string{{"Message:", "okredc1linebeend"}, {"cp-1okred", "okredc1linebeend"}} {
		lineWith(t, out, words...)
	}
	if p.Status.Message != orig.Status.Message || p.Status.Machines[0].Name != orig.Status.Machines[0].Name {
		t.Error("PrintPreview changed the object it was given")
	}

	p.Status.Phase = inplacev1.PreviewPhaseFailed
	err := PreviewFailure(p)
	noControls(t, err.Error())
	if !strings.Contains(err.Error(), "okredc1linebeend") {
		t.Errorf("the failure lost its message: %v", err)
	}
}

func TestPrintObjectEscapesControls(t *testing.T) {
	p := samplePreview()
	p.Status.Message = hostile
	for _, format := range []string{OutputYAML, OutputJSON} {
		var buf bytes.Buffer
		if err := PrintObject(&buf, p, format); err != nil {
			t.Fatal(err)
		}
		// JSON keeps the message, escaped (\u001b); YAML cannot hold the controls at
		// all (sigs.k8s.io/yaml refuses them), so it shows the message cleaned.
		noControls(t, buf.String())
		if !strings.Contains(buf.String(), "okredc1linebeend") && !strings.Contains(buf.String(), `ok\u001b[2J`) {
			t.Errorf("-o %s lost the message:\n%s", format, buf.String())
		}
		if format == OutputJSON {
			back := &inplacev1.UpgradePreview{}
			if err := json.Unmarshal(buf.Bytes(), back); err != nil || back.Status.Message != hostile {
				t.Errorf("-o json does not decode to the message the cluster holds (%v): %q", err, back.Status.Message)
			}
		}
	}
}

func TestPrintStatusStripsControls(t *testing.T) {
	st := sampleStatus()
	for i := range st.Tasks[0].Status.Machines {
		st.Tasks[0].Status.Machines[i].Message = hostile
	}
	for name, nu := range st.NodeUpdates {
		nu.Status.FailureMessage = hostile
		nu.Status.LastError = hostile
		st.NodeUpdates[name] = nu
	}
	for k := range st.Annotations {
		st.Annotations[k] = hostile
	}
	var buf bytes.Buffer
	if err := PrintStatus(&buf, st); err != nil {
		t.Fatal(err)
	}
	noControls(t, buf.String())
	if !strings.Contains(buf.String(), "okredc1linebeend") {
		t.Errorf("the status lost the messages:\n%s", buf.String())
	}
}

// A machine Cluster API replaces without asking shows the path beside the outcome.
func TestPrintPreviewUnaskedPath(t *testing.T) {
	p := samplePreview()
	p.Status.Machines[3].UnaskedPath = inplacev1.UnaskedPathMaxSurge
	p.Status.Machines[3].Reason = "Cluster API deletes the machine without asking capi-inplace: MachineDeployment harvester-workers surges"
	var buf bytes.Buffer
	if err := PrintPreview(&buf, p); err != nil {
		t.Fatal(err)
	}
	lineWith(t, buf.String(), "harvester-workers-3", "Replaced/MaxSurge", "deletes the machine without asking")
}
