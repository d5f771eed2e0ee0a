package main

import (
	"flag"

	"github.com/capi-inplace/capi-inplace/internal/fence"
)

// fetchOptions are the flags of the fence around the URLs the manager fetches on its
// users' behalf: Prometheus gates' addresses and notification webhooks' URLs
// (internal/fence, docs/security.md). One pair for both: both URLs come from Secrets in
// a task's namespace, written by the same people.
type fetchOptions struct {
	allowHTTP      bool
	allowLinkLocal bool
	allowLoopback  bool
}

func (o *fetchOptions) bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.allowHTTP, fence.AllowHTTPFlag, false, "let Prometheus gates and notification webhooks be plain http URLs; without it they must be https (an http one is a red gate or a notification not sent, saying so). The Secrets' tokens and passwords then cross the network in clear")
	fs.BoolVar(&o.allowLinkLocal, fence.AllowLinkLocalFlag, false, "let Prometheus gates and notification webhooks reach link-local addresses (169.254.0.0/16, fe80::/10) and cloud metadata addresses (fd00:ec2::254, 100.100.100.200, 168.63.129.16), where a cloud serves the node's own credentials; refused by default, whatever name or redirect leads there")
	fs.BoolVar(&o.allowLoopback, fence.AllowLoopbackFlag, false, "let Prometheus gates and notification webhooks reach loopback and unspecified addresses (127.0.0.0/8, ::1, 0.0.0.0, ::): the manager's own pod (its metrics, probes and hook servers), or its host on a host-network pod; refused by default, whatever name or redirect leads there (a lab whose Prometheus or receiver runs beside the manager sets it)")
}

// policy is the fence of these flags.
func (o fetchOptions) policy() fence.Policy {
	return fence.Policy{AllowHTTP: o.allowHTTP, AllowLinkLocal: o.allowLinkLocal, AllowLoopback: o.allowLoopback}
}
