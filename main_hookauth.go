package main

import (
	"flag"
	"fmt"

	"github.com/capi-inplace/capi-inplace/extension"
)

// hookAuthOptions are the flags that say who may call the two hook servers
// (docs/install.md, "Who may call the hooks").
type hookAuthOptions struct {
	hookClientCA           string
	externalClientCA       string
	deprecatedClientCA     string
	externalTokenFile      string
	externalAllowAnonymous bool
}

func (o *hookAuthOptions) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.hookClientCA, extension.FlagHookClientCA, "", "PEM bundle of the CAs whose client certificates the server of Cluster API's hooks (--webhook-port) requires: a call without a certificate signed by one of them, for client authentication, is refused with 401. Cluster API's core and KubeadmControlPlane managers present one when started with --runtime-extension-client-cert-file and --runtime-extension-client-key-file (docs/install.md). Empty lets every caller in. Re-read when the file changes")
	fs.StringVar(&o.externalClientCA, extension.FlagExternalHookClientCA, "", "PEM bundle of the CAs whose client certificates the ExternalUpgradeRequest server (--external-hook-port) accepts. Re-read when the file changes")
	fs.StringVar(&o.deprecatedClientCA, "webhook-client-ca", "", "deprecated: the old name of --"+extension.FlagExternalHookClientCA+" (it never applied to the server of Cluster API's hooks; see --"+extension.FlagHookClientCA+")")
	fs.StringVar(&o.externalTokenFile, extension.FlagExternalHookTokenFile, "", "file holding the bearer token the ExternalUpgradeRequest server accepts (Authorization: Bearer <token>), compared in constant time and re-read when the file changes, so a rotated Secret takes effect without a restart. A file that does not exist yet refuses token calls until it does")
	fs.BoolVar(&o.externalAllowAnonymous, extension.FlagExternalHookAllowAnonymousLab, false, "for a lab only: let every caller of the ExternalUpgradeRequest server in when neither --"+extension.FlagExternalHookClientCA+" nor --"+extension.FlagExternalHookTokenFile+" is set. Without it, such a server refuses every call (403), saying what to set")
}

// servers checks the flags and returns who may call the Cluster API hook server and the
// ExternalUpgradeRequest server.
func (o *hookAuthOptions) servers() (capi, external extension.Callers, allowAnonymous bool, err error) {
	externalCA := o.externalClientCA
	if o.deprecatedClientCA != "" {
		if externalCA != "" && externalCA != o.deprecatedClientCA {
			return capi, external, false, fmt.Errorf("--webhook-client-ca (deprecated) and --%s name different bundles; keep only --%s", extension.FlagExternalHookClientCA, extension.FlagExternalHookClientCA)
		}
		externalCA = o.deprecatedClientCA
	}
	capi = extension.Callers{ClientCAFile: o.hookClientCA}
	if err := capi.Check(extension.FlagHookClientCA, ""); err != nil {
		return capi, external, false, err
	}
	external = extension.Callers{ClientCAFile: externalCA, TokenFile: o.externalTokenFile}
	if err := external.Check(extension.FlagExternalHookClientCA, extension.FlagExternalHookTokenFile); err != nil {
		return capi, external, false, err
	}
	if o.externalAllowAnonymous && (externalCA != "" || o.externalTokenFile != "") {
		return capi, external, false, fmt.Errorf("--%s lets every caller in, so it cannot go with --%s or --%s; keep the credentials and drop it",
			extension.FlagExternalHookAllowAnonymousLab, extension.FlagExternalHookClientCA, extension.FlagExternalHookTokenFile)
	}
	return capi, external, o.externalAllowAnonymous, nil
}
