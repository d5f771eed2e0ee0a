package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHookAuthFlags(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name               string
		args               []string
		wantErr            string
		anonymous          bool
		externalCA, capiCA string
	}{
		{name: "no flag: Cluster API's hooks open, ExternalUpgradeRequest refused (not anonymous)"},
		{name: "lab flag", args: []string{"--external-hook-insecure-allow-anonymous"}, anonymous: true},
		{name: "lab flag with a token", args: []string{"--external-hook-insecure-allow-anonymous", "--external-hook-token-file=" + token},
			wantErr: "--external-hook-insecure-allow-anonymous lets every caller in"},
		{name: "missing CA bundle", args: []string{"--hook-client-ca=" + filepath.Join(dir, "missing.crt")}, wantErr: "--hook-client-ca: read the client CA bundle"},
		{name: "a token file not there yet (an optional Secret)", args: []string{"--external-hook-token-file=" + filepath.Join(dir, "later")}},
		{name: "the deprecated alias alone is --external-hook-client-ca", args: []string{"--webhook-client-ca=" + filepath.Join(dir, "missing.crt")},
			wantErr: "--external-hook-client-ca: read the client CA bundle"},
		{name: "deprecated alias and the new name disagree", args: []string{"--webhook-client-ca=/a.crt", "--external-hook-client-ca=/b.crt"},
			wantErr: "--webhook-client-ca (deprecated) and --external-hook-client-ca name different bundles"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o hookAuthOptions
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			o.bind(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			capi, external, anonymous, err := o.servers()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if anonymous != tc.anonymous || capi.ClientCAFile != tc.capiCA || external.ClientCAFile != tc.externalCA {
				t.Fatalf("got capi %+v external %+v anonymous %v", capi, external, anonymous)
			}
		})
	}
	t.Run("an empty token file stops the manager", func(t *testing.T) {
		empty := filepath.Join(dir, "empty-token")
		if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var o hookAuthOptions
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.bind(fs)
		if err := fs.Parse([]string{"--external-hook-token-file=" + empty}); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := o.servers(); err == nil || !strings.Contains(err.Error(), "--external-hook-token-file") || !strings.Contains(err.Error(), "is empty") {
			t.Fatalf("got %v", err)
		}
	})
}
