package e2e

import (
	"encoding/base64"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// expectNoSecretsLeaked checks, once every manager of the suite has run, that no log line
// of any of them and no event in the API server carries secret material: the workload
// clusters' kubeconfigs (which the manager reads from Secrets), their client keys and
// certificates, or any PEM private key.
func expectNoSecretsLeaked() {
	GinkgoHelper()
	admin, err := env.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
	needles := secretNeedles(admin)
	secrets := &corev1.SecretList{}
	Expect(env.Client.List(ctx, secrets)).To(Succeed())
	for _, s := range secrets.Items {
		for _, v := range s.Data {
			if len(v) >= 16 {
				needles = append(needles, secretNeedles(v)...)
			}
		}
	}

	var logs []string
	Expect(filepath.WalkDir(workDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".log") {
			logs = append(logs, path)
		}
		return err
	})).To(Succeed())
	Expect(logs).NotTo(BeEmpty(), "the suite ran no manager")
	for _, path := range logs {
		data, err := os.ReadFile(path)
		Expect(err).NotTo(HaveOccurred())
		text := string(data)
		Expect(text).NotTo(ContainSubstring("PRIVATE KEY"), "%s", path)
		for _, n := range needles {
			Expect(strings.Contains(text, n)).To(BeFalse(), "%s carries secret material (%.12s...)", path, n)
		}
	}
	events := &eventsv1.EventList{}
	Expect(env.Client.List(ctx, events)).To(Succeed())
	coreEvents := &corev1.EventList{}
	Expect(env.Client.List(ctx, coreEvents, client.InNamespace(""))).To(Succeed())
	var notes []string
	for _, e := range events.Items {
		notes = append(notes, e.Note)
	}
	for _, e := range coreEvents.Items {
		notes = append(notes, e.Message)
	}
	for _, note := range notes {
		Expect(note).NotTo(ContainSubstring("PRIVATE KEY"))
		for _, n := range needles {
			Expect(strings.Contains(note, n)).To(BeFalse(), "an event carries secret material: %s", note)
		}
	}
}

// secretNeedles are recognisable pieces of a secret value as it could appear in a log:
// the start of every long token (base64 data, PEM lines, tokens) of the value, of its
// base64 form (as in a Secret's JSON), and of what its base64 tokens decode to (the PEM
// inside a kubeconfig's client-key-data).
func secretNeedles(value []byte) []string {
	var out []string
	add := func(text string) []string {
		var tokens []string
		for _, t := range strings.FieldsFunc(text, func(r rune) bool {
			return r == ' ' || r == '\n' || r == '\t' || r == '"' || r == ':' || r == ','
		}) {
			if len(t) >= 32 {
				out = append(out, t[:32])
				tokens = append(tokens, t)
			}
		}
		return tokens
	}
	for _, t := range add(string(value)) {
		if decoded, err := base64.StdEncoding.DecodeString(t); err == nil {
			add(string(decoded))
		}
	}
	add(base64.StdEncoding.EncodeToString(value))
	return out
}
