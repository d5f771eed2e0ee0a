// Package manifests renders the project's kustomize folders with the kustomize the
// Makefile installs and decodes what they render, for tests that check or apply them.
package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Kustomize is the kustomize binary: $KUSTOMIZE (the Makefile exports it), else the one
// `make test` installs into bin/.
func Kustomize(repoRoot string) (string, error) {
	bin := os.Getenv("KUSTOMIZE")
	if bin == "" {
		bin = filepath.Join(repoRoot, "bin", "kustomize-v5.7.0")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("kustomize not found at %s: run the tests with `make test`, which installs it", bin)
	}
	return bin, nil
}

// Build renders a kustomize folder of the checkout.
func Build(repoRoot, folder string) ([]*unstructured.Unstructured, error) {
	bin, err := Kustomize(repoRoot)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "build", filepath.Join(repoRoot, folder))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w: %s", folder, err, stderr.String())
	}
	return Decode(stdout.Bytes())
}

// Decode reads a multi-document YAML or JSON stream into objects.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}
